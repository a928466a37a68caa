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
