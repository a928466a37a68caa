"""The census a pass asks its questions of: the same answers a look at every worker gives, taken
again whenever a worker is added or another generation is current, and brought up to date from
the workers whose records changed."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from ringmaster.rendezvous.control.assignment import WorkerSlot, assign_ranks
from ringmaster.rendezvous.control.census import CensusKeeper, take_census
from ringmaster.rendezvous.control.records import Generation, JobWorkers, Phase, Worker


def _job() -> tuple[JobWorkers, Generation]:
    workers = JobWorkers()
    for host in ("a", "b"):
        for n in range(3):
            w = Worker(f"{host}/{n}", host, n, {})
            workers[w.worker_id] = w
    members = assign_ranks([WorkerSlot(i, workers[i].host) for i in ("a/0", "a/1", "b/0", "b/1")], [])
    for a in members:
        workers[a.worker_id].phase = Phase.MEMBER
    return workers, Generation(1, members, "first", "g1")


def _looked_at_one_by_one(workers: JobWorkers, gen: Generation) -> tuple:
    live = [w for w in workers.values() if w.live]
    running: dict[str, list[Worker]] = {}
    for w in live:
        if not w.stopping:
            running.setdefault(w.host, []).append(w)
    outside = [w for w in live if w.worker_id not in gen.member_set]
    joining = [w for w in live if not w.stopping and (w.phase in (Phase.SPAWNING, Phase.WARMING)
                                                      or (w.phase is Phase.READY and w in outside))]
    return ([workers[i] for i in gen.member_ids], live, running, {w.host for w in live}, joining)


def test_the_census_answers_as_a_look_at_every_worker_does() -> None:
    workers, gen = _job()
    workers["a/2"].phase = Phase.READY  # a newcomer ready to join
    workers["b/1"].failed = "it crashed"  # a member counted as failed
    workers["a/1"].stopping = True  # a member retiring
    census = take_census(workers, gen)
    members, live, running, busy, joining = _looked_at_one_by_one(workers, gen)
    assert census.members == members
    assert census.live == live and workers["b/1"] not in census.live
    assert census.running == running and workers["a/1"] not in census.running["a"]
    assert census.busy_hosts == busy == {"a", "b"}
    assert census.joining == joining
    assert [w.worker_id for w in census.joining] == ["a/2", "b/2"]  # ready outside; still starting


def test_the_kept_census_is_taken_again_after_any_change() -> None:
    workers, gen = _job()
    current = [gen]
    keeper = CensusKeeper(lambda: (workers, current[0]))
    first = keeper.now()
    assert keeper.now() is first  # nothing changed: the same lists
    workers["b/2"].last_heartbeat = 5.0  # (a heartbeat is no change to the records)
    assert keeper.now() is first
    workers["b/2"].phase = Phase.EXITED  # a record changed
    second = keeper.now()
    assert second is not first and workers["b/2"] not in second.live
    newcomer = Worker("c/9", "c", 0, {})
    assert keeper.now() is second  # (making it set its fields: a record changed, but none of the job's)
    before = keeper.now()
    workers[newcomer.worker_id] = newcomer  # adding a worker counts too, where no record changed since
    third = keeper.now()
    assert third is not before and newcomer in third.live and third.running["c"] == [newcomer]
    members = assign_ranks([WorkerSlot("a/0", "a")], [])
    current[0] = Generation(2, members, "shrunk", "g2")
    assert [w.worker_id for w in keeper.now().members] == ["a/0"]


_STEPS = st.lists(st.tuples(st.sampled_from(["phase", "failed", "stopping", "join", "replace", "add", "outsider"]),
                            st.integers(0, 9), st.sampled_from(list(Phase))), max_size=40)


@settings(max_examples=150, deadline=None)
@given(_STEPS)
def test_a_census_brought_up_to_date_from_the_changed_workers_is_a_fresh_look(steps) -> None:
    """After any run of changes (phases moved, workers failed, stopped, joined to the generation,
    set again under their id, added), the kept census, brought up to date from the workers that
    changed, answers what a census taken afresh answers: the same workers in the same order."""
    workers, gen = _job()
    keeper = CensusKeeper(lambda: (workers, gen))
    keeper.now()
    for kind, n, phase in steps:
        ids = list(workers)
        w = workers[ids[n % len(ids)]]
        if kind == "phase" and w.live:
            try:
                w.move(phase)
            except ValueError:
                pass  # (not a move a worker makes)
        elif kind == "failed" and w.failed is None:
            w.failed = "it crashed"
        elif kind == "stopping":
            w.stopping = True
        elif kind == "join" and w.live:
            try:
                w.join(1)
            except ValueError:
                pass
        elif kind == "replace":
            workers[w.worker_id] = Worker(w.worker_id, w.host, w.slot, {})
        elif kind == "add":
            added = Worker(f"c/{len(ids)}", "c", n, {})
            workers[added.worker_id] = added
        elif kind == "outsider":
            Worker("x/1", "x", 0, {}).phase = phase  # (a record, not the job's)
        kept = keeper.now()
        fresh = take_census(workers, gen)
        for listed in ("live", "joining", "members", "leaving"):
            assert list(map(id, getattr(kept, listed))) == list(map(id, getattr(fresh, listed))), listed
        assert {h: list(map(id, on)) for h, on in kept.running.items()} == \
            {h: list(map(id, on)) for h, on in fresh.running.items()}
        assert list(kept.running) == list(fresh.running)
        assert kept.busy_hosts == fresh.busy_hosts
