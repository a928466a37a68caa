"""Replica groups (`--group-size`): real workers training with PyTorch's FSDP2 on each
generation's ("replicate", "shard") mesh, on real Gloo groups; a worker SIGKILLed takes its
whole group out, the other group trains on at once, and the job grows back by a whole group."""

from __future__ import annotations

import os
import signal

import pytest

from harness import FAST, WORKLOADS, events, read_logs

pytestmark = pytest.mark.slow


def test_a_killed_worker_takes_its_group_out_the_other_trains_on_and_a_whole_group_comes_back(
        run_job, tmp_path) -> None:
    logs_dir, stop = tmp_path / "log", tmp_path / "stop"
    # (--collective-timeout 10: a survivor inside an FSDP2 collective with the killed worker's
    # partner, which left it to roll back, waits that long; `worker/torch/elastic/generation_mesh.py`)
    job = run_job("--min-np", "2", "--max-np", "4", "-H", "localhost:4", "--group-size", "2", "--spares", "0",
                  "--collective-timeout", "10", *FAST, "python", str(WORKLOADS / "replica_groups.py"),
                  "--log-dir", str(logs_dir), "--stop-file", str(stop))
    first = job.wait_status(lambda s: s["world_size"] == 4 and s["steps"] >= 5, 120, "training in two groups")
    victim = next(w for w in first["workers"] if w["rank"] == 3)
    os.kill(victim["pid"], signal.SIGKILL)
    shrunk = job.wait_status(lambda s: s["generation"] > first["generation"] and s["world_size"] == 2, 60,
                             "a ring of the surviving group alone")
    job.wait_status(lambda s: s["generation"] > shrunk["generation"] and s["world_size"] == 4
                    and s["steps"] >= shrunk["steps"] + 3, 120, "the job grown back by a whole group, training")
    stop.touch()
    assert job.wait(120) == 0, job.story()

    logs = read_logs(logs_dir)
    meshes = events(logs, "mesh")
    by_generation: dict[int, list[dict]] = {}
    for record in meshes:
        by_generation.setdefault(record["generation"], []).append(record)
    survivors_gen = shrunk["generation"]
    alone = by_generation[survivors_gen]
    # the survivors are the killed worker's other group, whole, as group 0 of 1 on a (1, 2) mesh
    assert sorted(r["rank"] for r in alone) == [0, 1], alone
    assert all(r["shape"] == [1, 2] and r["dims"] == ["replicate", "shard"] and r["groups"] == 1 for r in alone)
    original = {r["worker"]: r["rank"] for r in by_generation[first["generation"]]}
    assert {original[r["worker"]] for r in alone} == {0, 1}, "the group without the killed worker went on"
    # they resume at a committed step (one commit a step: at most the step in flight is lost),
    # with their own shards of the model and the optimizer exactly as that commit took them
    assert all(r["step"] >= first["steps"] for r in alone)
    for r in alone:
        committed = {(c["step"], c["shard"]) for c in logs[r["worker"]] if c["event"] == "committing"}
        assert (r["step"], r["shard"]) in committed, f"{r['worker']} resumed from a state it never committed"
    grown = max(by_generation)
    assert sorted(r["rank"] for r in by_generation[grown]) == [0, 1, 2, 3]
    assert all(r["shape"] == [2, 2] for r in by_generation[grown])
    # the new group got each shard from the member of the old group at its index before its first
    # step: every replica of a shard bit-identical, all at the old group's committed step
    assert len({r["step"] for r in by_generation[grown]}) == 1
    for index in (0, 1):
        assert len({r["shard"] for r in by_generation[grown] if r["group_rank"] == index}) == 1, by_generation[grown]
    kept = {r["worker"] for r in alone}
    joining = [r for r in by_generation[grown] if r["worker"] not in kept]
    assert len(joining) == 2 and any(r["worker"] not in original for r in joining), by_generation[grown]
    assert all(r["step"] >= max(a["step"] for a in alone) for r in joining)  # not the model's initial state
    joined = [e for e in job.events("ring.joined") if e.get("generation") == grown]
    assert sorted(r for e in joined for r in e.get("synced_to", [])) != [], joined  # shards went to the new group
    # every rank of a group holds the same ring ranks' group; HSDP left every replica identical
    done = events(logs, "done")
    assert sorted(r["rank"] for r in done) == [0, 1, 2, 3] and len({r["step"] for r in done}) == 1
    assert len({r["digest"] for r in done}) == 1, done
    assert {r["group"] for r in done} == {0, 1}
    assert job.events("state.rolled_back")
