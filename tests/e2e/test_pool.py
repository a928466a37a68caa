"""Many jobs on one pool of hosts (`ringmaster pool serve`): real pool, real jobs (each its own
rendezvous, agents and Gloo rings) on emulated hosts of this machine. A job shrinks at a commit
to let another start and grows back when it ends; a higher priority suspends a lower job at a
durable checkpoint and the lower one resumes from it; a host that dies under a job leaves the pool;
`submit`, `jobs`, `cancel` and `status --job` as a user types them."""

from __future__ import annotations

import contextlib
import os
import pathlib
import signal
import time
import urllib.request

import psutil
import pytest
from browser import headless_browser
from harness import SECRET, WORKLOADS, events, first_commit_at, read_logs, wait_for
from job_checks import assert_every_sample_once, assert_ranks_agree, assert_seen_once_or_padded
from pool_rig import Pool, sizes_logged

pytestmark = pytest.mark.slow


@pytest.fixture
def browser():
    yield from headless_browser()


def test_fifo_shrinks_a_running_job_at_its_commit_to_start_the_next_and_grows_it_back(run_job, tmp_path) -> None:
    pool = Pool(run_job, tmp_path, "-H", "hA:2,hB:2", "--min-resize-interval", "0")
    a_stop = tmp_path / "a.stop"  # a trains until told to, once it is back on 4 slots after b
    a = pool.submit(tmp_path / "a", 2, 4, epochs=1000, samples=240, stop=a_stop)
    pool.wait_job(a, lambda j: j["state"] == "running" and j["size"] == 4, 60, "a on 4 slots")
    wait_for(lambda: first_commit_at(tmp_path / "a", 4), 120, "a training on 4")
    submitted = time.time()
    b = pool.submit(tmp_path / "b", 2, 2, epochs=2, samples=64)
    resized = pool.proc.wait_event("pool.job_resized", 60, job=a)
    assert resized["before"] == 4 and resized["size"] == 2
    started = pool.proc.wait_event("pool.job_started", 120, job=b)
    (given,) = [h.split(":")[0] for h in str(started["hosts"]).split(",")]
    gone = [e["time"] for e in pool.proc.events() if e.get("job") == a and e.get("host") == given
            and e.get("kind") in ("worker.exited", "worker.stopped", "worker.finished")]
    assert len(gone) == 2 and max(gone) <= started["time"], (gone, started)  # b starts once a's workers left its host
    pool.wait_job(b, lambda j: j["state"] == "succeeded", 180, "b to finish")
    b_ended = time.time()
    wait_for(lambda: first_commit_at(tmp_path / "a", 4, after=b_ended), 120, "a training on 4 again")
    a_stop.touch()
    done = pool.wait_job(a, lambda j: j["state"] == "succeeded", 300, "a to finish")
    assert [size for _, size in done["sizes"]] == [4, 2, 4, 0], done["sizes"]
    assert sizes_logged(tmp_path / "a") == [4, 2, 4]  # resized at commits, never stopped
    a_logs = read_logs(tmp_path / "a")
    redone = sum(len(steps) - len(set(steps)) for steps in ([r["step"] for r in records if r["event"] == "begin"]
                                                            for records in a_logs.values()))
    assert redone == 0  # a resize at a commit rolls nothing back
    b_first = min(r["time"] for rs in read_logs(tmp_path / "b").values() for r in rs if r["event"] == "commit")
    a_back = min(r["time"] for rs in a_logs.values() for r in rs if r["event"] == "commit" and r["size"] == 4
                 and r["time"] > b_first)
    b_end = max(r["time"] for rs in read_logs(tmp_path / "b").values() for r in rs if r["event"] == "done")
    print(f"\n[figure] pool: b submitted -> b's first step (a shrunk at its commit): {b_first - submitted:.2f} s; "
          f"b's end -> a's first step at 4 again: {a_back - b_end:.2f} s; steps a trained twice: {redone}")
    for name in ("a", "b"):
        logs = read_logs(tmp_path / name)
        assert_every_sample_once(logs, 2 if name == "b" else None)
        assert_ranks_agree(logs)
    assert not [e for e in pool.proc.events("job.failed")]


def test_priority_suspends_the_lower_job_at_a_durable_checkpoint_and_it_resumes_from_it(run_job, tmp_path) -> None:
    pool = Pool(run_job, tmp_path, "-H", "hA:2", "--policy", "priority")
    low = pool.submit(tmp_path / "low", 2, 2, epochs=6, samples=160, priority=0)
    wait_for(lambda: sum(1 for rs in read_logs(tmp_path / "low").values() for r in rs if r["event"] == "commit") >= 10,
             120, "low training")
    high = pool.submit(tmp_path / "high", 2, 2, epochs=1, samples=32, priority=5)
    pool.proc.wait_event("pool.job_suspending", 60, job=low)
    pool.proc.wait_event("pool.job_suspended", 120, job=low)
    pool.wait_job(high, lambda j: j["state"] == "succeeded", 180, "high to finish")
    done = pool.wait_job(low, lambda j: j["state"] == "succeeded", 300, "low to resume and finish")
    assert done["resumes"] == 1
    assert [e["how"] for e in pool.proc.events("pool.job_started", job=low)] == ["starts",
                                                                                 "resumes from its checkpoint"]
    assert any((tmp_path / "ckpt" / low).iterdir())
    logs = read_logs(tmp_path / "low")
    assert_every_sample_once(logs, 6)  # nothing trained twice into the model, nothing skipped, across the suspension
    assert_every_sample_once(read_logs(tmp_path / "high"), 1)


def test_a_host_that_dies_under_a_job_of_replica_groups_leaves_the_pool_and_the_job_goes_on_in_whole_groups(
        run_job, tmp_path) -> None:
    """A job of groups of 2 (`group_size`, as FSDP2 inside replica groups submits it): the pool
    gives it whole groups only (hC's lone slot never), and the group on the dead host goes."""
    pool = Pool(run_job, tmp_path, "-H", "hA:2,hB:2,hC:1", "--blacklist-cooldown", "600")
    stop = tmp_path / "stop"  # (trains until told to)
    job = pool.submit(tmp_path / "j", 2, 6, epochs=1000, samples=96, stop=stop, group_size=2)
    placed = pool.wait_job(job, lambda j: j["size"] == 4, 120, "the job on 4 slots")
    assert placed["hosts"] == {"hA": 2, "hB": 2} and placed["group_size"] == 2, placed
    wait_for(lambda: first_commit_at(tmp_path / "j", 4), 120, "the job training on 4")
    pool_agent = next(h["agent_pid"] for h in pool.call("/hosts") if h["name"] == "hB")
    host = [pool_agent, *(p.pid for p in psutil.Process(pool_agent).children(recursive=True))]
    for pid in host:  # the host dies: its pool agent, the job's agent there and its workers
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    wait_for(lambda: next(h for h in pool.call("/hosts") if h["name"] == "hB")["blacklisted_for_s"] > 500, 60,
             "hB out of the pool")
    shrunk = pool.wait_job(job, lambda j: j["hosts"] == {"hA": 2}, 60, "the job on hA alone")
    assert shrunk["state"] == "running"
    hosts = {h["name"]: h for h in pool.call("/hosts")}
    assert hosts["hB"]["blacklisted_for_s"] > 500 and hosts["hB"]["used"] == 0
    assert hosts["hC"]["used"] == 0  # a slot that completes no group is not the job's
    wait_for(lambda: any(r["event"] == "synced" and r["size"] == 2 for rs in read_logs(tmp_path / "j").values()
                         for r in rs), 120, "the job's one group training")
    stop.touch()
    done = pool.wait_job(job, lambda j: j["state"] == "succeeded", 300, "the job to finish")
    assert [size for _, size in done["sizes"]] == [4, 2, 0], done["sizes"]  # never 3, though hC's slot was free
    logs = read_logs(tmp_path / "j")
    synced = [r for rs in logs.values() for r in rs if r["event"] == "synced"]
    assert synced and all(r["group_size"] == 2 and r["group"] == r["rank"] // 2 for r in synced), synced
    assert {r["size"] for r in synced} == {4, 2}, synced
    assert_every_sample_once(logs)


def test_submit_jobs_status_cancel_and_the_pools_page_as_a_user_sees_them(run_job, tmp_path, browser) -> None:
    pool = Pool(run_job, tmp_path, "-H", "hA:2")

    (tmp_path / "l").mkdir()
    command = ["python", str(WORKLOADS / "elastic_job.py"), "--log-dir", str(tmp_path / "l"), "--epochs", "1000"]
    submitted = run_job("--pool", pool.url, "--name", "long", "--min-np", "1", "--max-np", "2", *command, verb="submit")
    assert submitted.wait(30) == 0, submitted.output
    job_id = submitted.output.strip().splitlines()[-1]
    assert job_id == "long-1"
    pool.wait_job(job_id, lambda j: j["state"] == "running", 60, "the job running")
    listed = run_job("--pool", pool.url, verb="jobs")
    assert listed.wait(30) == 0
    assert "long-1" in listed.output and "running" in listed.output and "(1-2)" in listed.output, listed.output
    wait_for(lambda: pool.call(f"/jobs/{job_id}/status")["world_size"] == 2, 120, "2 workers")
    status = run_job("--api", pool.url, "--job", job_id, verb="status")
    assert status.wait(30) == 0 and "world size 2" in status.output, status.output
    def both_pids() -> list[int] | None:
        found = [w["pid"] for w in pool.call(f"/jobs/{job_id}/status")["workers"] if w["live"] and w["pid"]]
        return found if len(found) == 2 else None

    pids = wait_for(both_pids, 60, "2 workers' processes")
    for pid in pids:  # the job's processes hold no secret of the pool's
        assert SECRET.encode() not in pathlib.Path(f"/proc/{pid}/environ").read_bytes()
    browser.get(pool.url + "/")  # the pool's page, in a real browser: the job on its host, and a link to its own page
    row = wait_for(lambda: browser.execute_script(
        f"const r = document.querySelector('tr[data-job=\"{job_id}\"]'); return r && r.innerText"), 30, "the job's row")
    assert "running" in row and "2 (1-2)" in row, row
    assert browser.execute_script("return document.getElementById('grid').innerText").count("hA (2)") == 1
    link = browser.execute_script(f"return document.querySelector('tr[data-job=\"{job_id}\"] a').href")
    assert link.rstrip("/") == pool.job(job_id)["api_url"]
    assert "2 of 2 slots used" in browser.execute_script("return document.getElementById('summary').innerText")
    metrics = urllib.request.urlopen(pool.url + "/metrics", timeout=10).read().decode()  # from this machine: no secret
    assert f'ringmaster_pool_job_size{{job="{job_id}",queue="default"}} 2.0' in metrics
    too_big = run_job("--pool", pool.url, "--min-np", "3", "python", "x.py", verb="submit")
    assert too_big.wait(30) != 0 and "more than the pool's 2 slots" in too_big.output, too_big.output
    cancelled = run_job(job_id, "--pool", pool.url, verb="cancel")
    assert cancelled.wait(30) == 0, cancelled.output
    pool.wait_job(job_id, lambda j: j["state"] == "cancelled", 60, "the job cancelled")
    again = run_job(job_id, "--pool", pool.url, verb="cancel")
    assert again.wait(30) != 0 and "already ended" in again.output
    logs = run_job(job_id, "--pool", pool.url, "--follow", verb="logs")  # its events outlive its rendezvous
    assert logs.wait(30) == 1 and "generation 1 formed" in logs.output, logs.output  # 1: it did not succeed
    assert "cancelled" in pool.job(job_id)["message"]
    pool.proc.proc.send_signal(signal.SIGTERM)
    assert pool.proc.wait(60) == 0


def test_a_standby_pool_takes_the_jobs_over_through_etcd_when_the_leader_dies(run_job, tmp_path, etcd) -> None:
    store = f"etcd://{etcd.address}/pool-{tmp_path.name}"
    flags = ("-H", "hA:2", "--store", store, "--checkpoint-interval", "1")
    first = Pool(run_job, tmp_path, *flags)
    job = first.submit(tmp_path / "log", 2, 2, epochs=6, samples=160)
    waiting = first.submit(tmp_path / "later", 2, 2, epochs=1, samples=32)
    first.wait_job(job, lambda j: j["state"] == "running", 60, "the job running")
    wait_for(lambda: sum(1 for rs in read_logs(tmp_path / "log").values() for r in rs if r["event"] == "commit") >= 40,
             120, "40 commits (durable checkpoints every second)")
    standby = Pool(run_job, tmp_path, *flags, leads=False)
    standby.proc.wait_event("leader.standing_by", 60)
    old_job = psutil.Process(first.proc.proc.pid).children(recursive=True)  # its agents (own sessions) and workers
    os.killpg(first.proc.proc.pid, signal.SIGKILL)  # the leading pool dies, and its jobs' agents and workers with it
    first.proc.proc.wait(30)
    _, alive = psutil.wait_procs(old_job, timeout=30)  # each follows its parent (PR_SET_PDEATHSIG), a hop at a time
    assert not alive, f"the dead pool's processes still run: {alive}"
    crashed = time.time()  # only once all are gone: an old worker ending an epoch in between (seen in CI) is not
    #                        the resumed job's
    standby.listening(60)
    taken = standby.proc.wait_event("pool.taken_up", 10)
    assert taken["jobs"] == 2 and taken["live"] == 2
    assert standby.job(waiting)["state"] in ("queued", "running", "succeeded")
    done = standby.wait_job(job, lambda j: j["state"] == "succeeded", 300, "the job to resume and finish")
    assert done["resumes"] == 1
    assert [e["how"] for e in standby.proc.events("pool.job_started", job=job)] == ["resumes from its checkpoint"]
    standby.wait_job(waiting, lambda j: j["state"] == "succeeded", 180, "the queued job to run under the new leader")
    logs = read_logs(tmp_path / "log")
    last = max(r["step"] for r in events(logs, "commit") if r["time"] < crashed)
    start = min(r["step"] for r in events(logs, "synced") if r["time"] > crashed)
    assert last - 60 <= start <= last, (start, last)  # from a checkpoint at most about a second old
    after = sorted((r for r in events(logs, "epoch") if r["time"] > crashed), key=lambda r: r["epoch"])
    resumed = sorted((r for r in events(logs, "synced") if r["time"] > crashed), key=lambda r: r["time"])
    assert [r["epoch"] for r in after] == list(range(after[0]["epoch"], 6)), (
        "epochs ended after the crash, each once: "
        f"{[(r['epoch'], r['worker'], r['time'] - crashed) for r in after]}; syncs after it: "
        f"{[(r['generation'], r['worker'], r['step'], r['time'] - crashed) for r in resumed]}")
    assert_seen_once_or_padded(logs, after)  # each sample once per epoch (or the padding), across the crash
