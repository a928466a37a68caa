"""A worker's phase moves only as `records.PHASE_MOVES` lists: nothing leaves EXITED (a worker id is
one process) and nothing goes back to SPAWNING; every listed move says what makes it."""

from __future__ import annotations

import pytest

from ringmaster.rendezvous.control.records import PHASE_MOVES, Phase, Worker


def _worker(phase: Phase) -> Worker:
    worker = Worker("hA/1", "hA", 0, {})
    worker.phase = phase
    return worker


def test_every_phase_but_the_first_is_reached_and_every_move_says_why() -> None:
    assert set(PHASE_MOVES) == set(Phase) - {Phase.SPAWNING}
    assert all(why.strip() for moves in PHASE_MOVES.values() for why in moves.values())
    assert not any(Phase.EXITED in moves for moves in PHASE_MOVES.values())


@pytest.mark.parametrize("to", list(Phase))
def test_an_exited_worker_moves_nowhere_and_a_live_one_never_back_to_spawning(to: Phase) -> None:
    gone = _worker(Phase.EXITED)
    if to is Phase.EXITED:
        gone.move(to)  # (staying put is no move)
    else:
        with pytest.raises(ValueError, match="cannot move from exited"):
            gone.move(to)
    assert gone.phase is Phase.EXITED and not gone.live
    for phase in (Phase.WARMING, Phase.READY, Phase.MEMBER):
        live = _worker(phase)
        if to is Phase.SPAWNING:
            with pytest.raises(ValueError, match="to spawning"):
                live.move(to)
        else:
            live.move(to)
            assert live.phase is to and live.live == (to is not Phase.EXITED)


@pytest.mark.parametrize("phase", list(Phase))
def test_joining_a_generation_is_the_move_to_member_and_one_recorded_change(phase: Phase) -> None:
    """`Worker.join` (a generation's members, set in one change each) does what `move(MEMBER)`
    and setting the generation do, refuses what `move` refuses, and marks the worker changed for
    the job's record once."""
    from ringmaster.rendezvous.control.records import JobWorkers, recorded_changes

    workers = JobWorkers({"hA/1": _worker(phase)})
    worker = workers["hA/1"]
    workers.take_changed()
    revision, recorded = worker.revision, recorded_changes()
    if phase not in PHASE_MOVES[Phase.MEMBER] and phase is not Phase.MEMBER:
        with pytest.raises(ValueError, match=f"cannot move from {phase.value} to member"):
            worker.join(7)
        assert worker.phase is phase and worker.generation == 0 and workers.take_changed() == []
        return
    worker.join(7)
    assert worker.phase is Phase.MEMBER and worker.generation == 7 and worker.live
    assert worker.revision == revision + 1 and recorded_changes() == recorded + 1
    assert workers.take_changed() == [worker]
    worker.failed = "its process is gone"
    worker.move(Phase.EXITED)
    with pytest.raises(ValueError, match="cannot move from exited"):
        worker.join(8)
    assert not worker.live and worker.generation == 7
