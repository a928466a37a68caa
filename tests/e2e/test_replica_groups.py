"""Replica groups (`--group-size`): real workers training with PyTorch's FSDP2 on each
generation's ("replicate", "shard") mesh, on real Gloo groups; a worker SIGKILLed takes its
whole group out, the other group trains on at once from its own commit, and the job grows back
by a whole group healed from its peers; a DCP checkpoint restarts the job with another group
size and loads into plain torchrun + FSDP2."""

from __future__ import annotations

import contextlib
import json
import math
import os
import pathlib
import signal
import subprocess
import sys

import pytest
from harness import FAST, WORKLOADS, events, read_logs, wait_for

pytestmark = pytest.mark.slow


def test_a_killed_worker_takes_its_group_out_the_other_trains_on_and_a_whole_group_comes_back(
        run_job, tmp_path) -> None:
    """The killed worker's partner is also held inside its rollback (the workload's --hold-dir:
    the stand-in for a Gloo receive that waits out its timeout) until the refilled slot's worker
    is ready: the surviving group trains on meanwhile (a ring formed with the partner would wait
    for it, the survivors with it), and the job grows back once the partner is out and asks."""
    logs_dir, stop, hold_dir = tmp_path / "log", tmp_path / "stop", tmp_path / "hold"
    hold_dir.mkdir()
    # (--collective-timeout 60: a survivor inside an FSDP2 collective that the killed worker's
    # partner left to roll back must not wait for it; the generation's end cuts the mesh off)
    job = run_job("--min-np", "2", "--max-np", "4", "-H", "localhost:4", "--group-size", "2", "--spares", "0",
                  "--collective-timeout", "60", *FAST, "python", str(WORKLOADS / "replica_groups.py"),
                  "--log-dir", str(logs_dir), "--stop-file", str(stop), "--samples", "32",
                  "--hold-dir", str(hold_dir), "--hold-rank", "2")
    first = job.wait_status(lambda s: s["world_size"] == 4 and s["steps"] >= 5, 120, "training in two groups")
    victim = next(w for w in first["workers"] if w["rank"] == 3)
    os.mkfifo(hold_dir / "hold")
    holding = os.open(hold_dir / "hold", os.O_RDWR)  # (the partner waits until this end closes)
    os.kill(victim["pid"], signal.SIGKILL)
    shrunk = job.wait_status(lambda s: s["generation"] > first["generation"] and s["world_size"] == 2, 60,
                             "a ring of the surviving group alone")
    wait_for(lambda: (hold_dir / "held").exists() or job.proc.poll() is not None, 60,
             "the partner held in its rollback")
    partner = (hold_dir / "held").read_text()
    started = {w["worker_id"] for w in first["workers"]}
    newcomer = job.wait_status(lambda s: any(w["phase"] == "ready" and w["worker_id"] not in started
                                             for w in s["workers"]), 120, "the refilled slot's worker ready")
    assert next(w for w in newcomer["workers"] if w["worker_id"] == partner)["phase"] != "ready", newcomer
    going = job.wait_status(lambda s: s["steps"] >= newcomer["steps"] + 5, 120,
                            "the surviving group training on while the partner is held")
    assert going["generation"] == shrunk["generation"] and going["world_size"] == 2, going
    (hold_dir / "hold").unlink()
    os.close(holding)
    regrown = job.wait_status(lambda s: s["generation"] > shrunk["generation"] and s["world_size"] == 4, 120,
                              "the job grown back by a whole group")
    # (steps counted in the workers' own logs of the regrown ring: the status's count is rank 0's
    # commits as reported, and a report of the surviving group's steps may arrive after it formed)
    wait_for(lambda: len([r for r in events(read_logs(logs_dir), "committing")
                          if r["generation"] == regrown["generation"]]) >= 4 * 3 or job.proc.poll() is not None,
             120, "each worker of the regrown ring committing 3 steps")
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
    for r in alone:
        committed = {(c["step"], c["shard"]) for c in logs[r["worker"]]
                     if c["event"] == "committing" and c["generation"] < r["generation"]}
        assert (r["step"], r["shard"]) in committed, f"{r['worker']} resumed from a state it never committed"
        assert r["step"] >= max(step for step, _ in committed) - 1, f"{r['worker']} lost more than the step in flight"
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
    assert partner.replace("/", "_") in {r["worker"] for r in joining}, joining  # the held partner, out and asking
    # the new worker warmed DTensor's dispatch for the (2, 2) mesh while it waited for its place
    # (dispatch_warmup): its first step worked nothing out, where a first step on a mesh never met
    # did (the first generation's, the surviving group's alone: the probe counts)
    first_steps = {(r["worker"], r["generation"]): r["propagated"] for r in events(logs, "first_step")}
    new_worker = next(r["worker"] for r in joining if r["worker"] not in original)
    assert first_steps.get((new_worker, grown)) == 0, (new_worker, grown, first_steps)
    assert max(first_steps.values()) > 0, first_steps
    assert all(r["step"] >= max(a["step"] for a in alone) for r in joining)  # not the model's initial state
    joined = [e for e in job.events("ring.joined") if e.get("generation") == grown]
    assert sorted(r for e in joined for r in e.get("synced_to", [])) != [], joined  # shards went to the new group
    # and the sync proved every replica equal (the digests of what was sent and what arrived): no
    # guard's collective after it, which would hold the survivors for the newcomers' load
    assert joined and all(e["check"] == "replicas proven equal by the sync" for e in joined), joined
    # every rank of a group holds the same ring ranks' group; HSDP left every replica identical
    done = events(logs, "done")
    assert sorted(r["rank"] for r in done) == [0, 1, 2, 3] and len({r["step"] for r in done}) == 1
    assert len({r["digest"] for r in done}) == 1, done
    assert {r["group"] for r in done} == {0, 1}
    assert job.events("state.rolled_back")
    recovered = job.events("job.recovered")
    assert recovered and recovered[0]["seconds"] < 20, recovered  # not a collective's 60 s timeout
    # every sample of every epoch reached the committed model exactly once, across the failure and
    # the regrowth (the sampler in the state, dealing by group; an epoch's last word counts)
    epochs = {r["epoch"]: r for r in events(logs, "epoch")}
    assert len(epochs) >= 2 and all(r["min"] == r["max"] == 1.0 for r in epochs.values()), epochs


def test_a_job_killed_whole_restarts_from_its_dcp_checkpoint_with_another_group_size_and_plain_fsdp2_loads_it(
        run_job, tmp_path) -> None:
    folder = tmp_path / "ck"
    common = ("--spares", "0", "--checkpoint-dir", str(folder), "--checkpoint-every", "3", *FAST, "python",
              str(WORKLOADS / "replica_groups.py"))

    def whole() -> list[pathlib.Path]:
        return sorted(p for p in folder.glob("sharded-step-*") if (p / ".metadata").is_file()
                      and not p.name.endswith(".partial"))

    first = run_job("-np", "4", "-H", "localhost:4", "--group-size", "2", *common,
                    "--log-dir", str(tmp_path / "first"), "--stop-file", str(tmp_path / "never"))
    first.wait_status(lambda s: s["steps"] >= 8 and len(whole()) >= 2, 120, "two groups of two past two checkpoints")
    first.kill()  # every worker of the job at once, wherever they were (maybe inside a write)
    newest = whole()[-1]

    # users can leave: plain torchrun + FSDP2 (no Ringmaster) on a mesh of its own loads it and trains on
    out = tmp_path / "plain.json"
    plain = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                              str(WORKLOADS / "plain_fsdp2_load.py"), str(newest), str(out)],
                             start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        output, _ = plain.communicate(timeout=180)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(plain.pid, signal.SIGKILL)
    # (torch's own Gloo teardown aborts now and then after the work is done, "terminate called
    # without an active exception", in plain torchrun as in bench/sharded.py's baseline: not what
    # is tested here, so an abort after the figures were written is let through, nothing else)
    torn_down = "terminate called without an active exception" in output and out.exists()
    assert plain.returncode == 0 or torn_down, output[-3000:]
    loaded = json.loads(out.read_text())
    assert loaded["adam_steps"] >= 1
    assert math.isfinite(loaded["loss_after"]) and loaded["loss_after"] < loaded["loss_before"]

    # the job started again as one group of three: resharded from that checkpoint, not from scratch
    again_logs, again_stop = tmp_path / "again", tmp_path / "again-stop"
    again = run_job("-np", "3", "-H", "localhost:3", "--group-size", "3", *common,
                    "--log-dir", str(again_logs), "--stop-file", str(again_stop))
    wait_for(lambda: again.proc.poll() is not None or events(read_logs(again_logs), "committing"), 120,
             "the restarted job training a step")
    again_stop.touch()
    assert again.wait(120) == 0, again.story()
    entered = [r for r in events(read_logs(again_logs), "mesh") if r["generation"] == 1]
    assert len(entered) == 3 and all(r["shape"] == [1, 3] for r in entered), entered
    # the same model, bit for bit, as plain FSDP2 loaded it, at the step its optimizer counted
    assert {(r["step"], r["full"]) for r in entered} == {(loaded["adam_steps"], loaded["digest"])}, entered
    assert [e["step"] for e in again.events("checkpoint.resumed")] == [int(newest.name.rsplit("-", 1)[1])]
