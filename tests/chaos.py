"""A seeded chaos run: one elastic job, faults at random moments, then proof that nothing was lost.

One `ringmaster run` on emulated hosts (each host its own agent process group) trains
`tests/workloads/elastic_job.py` (momentum SGD or Adam, an lr reset callback, `ElasticSampler`,
plain attributes), while a schedule drawn from a seed injects faults, each once the job has
absorbed the one before:

  kill_worker   SIGKILL of one worker            kill_host    SIGKILL of a host's agent group
  stop_worker   SIGSTOP of one worker past the heartbeat timeout, then SIGCONT
  add_host      a host added to discovery        remove_host  a host removed from discovery
  scale_down    `POST /scale` below the size     scale_up     `POST /scale` back to --max-np

With `store="etcd"` the job runs as `ringmaster serve` plus one `ringmaster agent` per host on a
three-member etcd cluster, and two more kinds join: restart_serve (SIGKILL of `serve`, started
again on the same store) and kill_etcd_member (SIGKILL of the etcd member the rendezvous uses,
started again after the next fault).

A fault counts as absorbed when a step is committed in a newer generation than the one it hit
(for restart_serve and kill_etcd_member, which need no new generation: when training has
committed again after the rendezvous answers again). After the job ends the logs are checked:
every sample of every epoch reached the committed model exactly once (up to the sampler's
documented padding), no committed step was lost, every rank was bit-identical after every sync
and at the end, and the final loss is within reach of a fault-free run. `Report.table()` prints
what was injected and survived, recovery seconds per kind, steps redone and goodput.

Shared by `tests/test_chaos.py` (a short schedule) and `bench/chaos.py` (a long one).
"""

from __future__ import annotations

import json
import os
import pathlib
import random
import signal
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from typing import Any, Callable

from harness import (
    API_HEADERS,
    PRODUCT_SPARES,
    ROOT,
    WORKLOADS,
    Job,
    discovery_script,
    events,
    free_port,
    read_logs,
    wait_for,
    write_hosts,
)
from job_checks import assert_every_sample_once, assert_ranks_agree

MEMORY_KINDS = ("kill_worker", "kill_host", "stop_worker", "add_host", "remove_host", "scale_down", "scale_up")
ETCD_KINDS = MEMORY_KINDS + ("restart_serve", "kill_etcd_member")
SLOTS = 2  # per host
#: Silence that counts as a hung worker (a stopped one is detected by it), and the beat's interval: a
#: 2 s timeout with 1 s beats killed a worker that was only starved while six others started on a
#: slow 2-core machine (a beat's RPC took over a second), and the job then failed as a plain one.
HEARTBEAT_TIMEOUT_S = 3.0
HEARTBEAT_INTERVAL_S = 0.5
#: Restarts of the whole job while no worker has entered `hvd.elastic.run` yet: a worker starved
#: past the timeout while six start (before the job can know its script is elastic) is a plain
#: job's failure, which restarts every worker; once training runs, faults are the elastic ones.
START_RESTARTS = 2
SAMPLES = 192  # divides by every world size up to 8 except 5 and 7
#: A learning rate small enough that the recipe's fault-free runs stay close across world sizes:
#: after 20 epochs their final losses were 0.025 / 0.037 / 0.030 on 1 / 2 / 4 workers here (8,
#: with the lr 8 times as large, end noisier: see `reference_loss`).
BASE_LR = 0.002
BATCH = 2  # samples per worker and step (the job's and the references')


@dataclass(frozen=True)
class Planned:
    """A fault to inject `after_s` seconds after the previous one was absorbed."""

    after_s: float
    kind: str


def plan_faults(seed: int, kinds: tuple[str, ...], count: int, every_s: float) -> list[Planned]:
    """Pure: `count` faults of the given kinds (each kind once before any repeats, when count
    allows), spaced `every_s` apart with +-50% jitter, all drawn from `seed`."""
    rng = random.Random(seed)
    order: list[str] = []
    while len(order) < count:
        round_ = list(kinds)
        rng.shuffle(round_)
        order.extend(round_)
    return [Planned(round(every_s * rng.uniform(0.5, 1.5), 2), kind) for kind in order[:count]]


@dataclass
class Injected:
    kind: str
    at: float  # wall-clock time of the fault
    generation: int  # the generation it hit
    target: str
    absorbed_at: float | None = None
    cleanup: Callable[[], None] | None = None
    #: The fault must form a new generation (False: training only has to go on, e.g. a host
    #: added while `scale` caps the world, or a rendezvous restart).
    new_generation: bool = True

    @property
    def recovery_s(self) -> float | None:
        return None if self.absorbed_at is None else self.absorbed_at - self.at


@dataclass
class Report:
    seed: int
    store: str
    faults: list[Injected]
    skipped: list[str]
    wall_s: float
    steps_kept: int
    steps_computed: int
    progress_fraction: float
    final_loss: float
    reference_loss: float | None
    checks: dict[str, str] = field(default_factory=dict)

    @property
    def goodput(self) -> float:
        return self.steps_kept / self.steps_computed if self.steps_computed else 0.0

    def table(self) -> str:
        lines = [f"chaos run: seed {self.seed}, store {self.store}, {self.wall_s:.0f} s wall time",
                 "| fault | injected | absorbed | recovery p50 s | recovery p99 s |", "| --- | --- | --- | --- | --- |"]
        for kind in sorted({f.kind for f in self.faults}):
            mine = [f for f in self.faults if f.kind == kind]
            times = sorted(f.recovery_s for f in mine if f.recovery_s is not None)
            lines.append(f"| {kind} | {len(mine)} | {len(times)} | {_percentile(times, 50):.2f} | "
                         f"{_percentile(times, 99):.2f} |")
        everything = sorted(f.recovery_s for f in self.faults if f.recovery_s is not None)
        lines.append(f"| all | {len(self.faults)} | {len(everything)} | {_percentile(everything, 50):.2f} | "
                     f"{_percentile(everything, 99):.2f} |")
        lines.append(f"steps kept {self.steps_kept}, computed {self.steps_computed}, redone "
                     f"{self.steps_computed - self.steps_kept}: goodput {self.goodput:.1%} of steps; "
                     f"progress in {self.progress_fraction:.1%} of wall time")
        reference = "n/a" if self.reference_loss is None else f"{self.reference_loss:.4f}"
        lines.append(f"final loss {self.final_loss:.4f} (worst fault-free run at a size the job had: {reference})")
        if self.skipped:
            lines.append(f"not injected (no target at that moment): {', '.join(self.skipped)}")
        for name, verdict in self.checks.items():
            lines.append(f"check {name}: {verdict}")
        lines.append(f"replay: seed {self.seed}")
        return "\n".join(lines)


def _percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    index = min(len(values) - 1, max(0, round(q / 100 * (len(values) - 1))))
    return values[index]


class ChaosRun:
    """Run one job under a fault schedule; `run()` returns the report or raises AssertionError
    naming what failed (with the seed)."""

    def __init__(self, workdir: pathlib.Path, seed: int, faults: list[Planned], store: str = "memory",
                 step_time_s: float = 0.05, recovery_bound_s: float = 45.0,
                 say: Callable[[str], None] = lambda line: None) -> None:
        self.dir = workdir
        self.seed = seed
        self.plan = faults
        self.stop_file = workdir / "stop"
        self.store = store
        self.step_time_s = step_time_s
        self.recovery_bound_s = recovery_bound_s
        self.say = say
        self.rng = random.Random(seed + 1)
        self.optimizer = self.rng.choice(["momentum", "adam"])
        self.log_dir = workdir / "log"
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.pool = [f"host{chr(ord('A') + i)}" for i in range(5)]
        self.in_discovery = self.pool[:3]
        self.script, self.hosts_file = discovery_script(workdir, {h: SLOTS for h in self.in_discovery})
        self.min_np, self.max_np = 2, 8
        self.processes: list[Job] = []  # everything started, killed at the end
        self.job: Job | None = None  # `run`, or the current `serve`
        self.etcd: Any = None
        self.serve_args: list[str] = []
        self.rendezvous = ""  # HOST:PORT of `serve`, for the agents

    # ------------------------------------------------------------------ the job
    def workload(self) -> list[str]:
        return ["python", str(WORKLOADS / "elastic_job.py"), "--log-dir", str(self.log_dir), "--epochs", "100000",
                "--stop-file", str(self.stop_file), "--samples", str(SAMPLES), "--batch-size", str(BATCH),
                "--step-time", str(self.step_time_s), "--optimizer", self.optimizer,
                "--lr-callback", "--base-lr", str(BASE_LR), "--timestamps"]

    def flags(self) -> list[str]:
        return ["--min-np", str(self.min_np), "--max-np", str(self.max_np), "--host-discovery-script", str(self.script),
                "--discovery-interval", "0.3", "--warmup-grace", "5", "--start-timeout", "30",
                "--heartbeat-timeout", str(HEARTBEAT_TIMEOUT_S), "--heartbeat-interval", str(HEARTBEAT_INTERVAL_S),
                "--stop-grace", "1", "--max-restarts", str(START_RESTARTS),
                "--blacklist-cooldown-range", "2", "4", "--crash-loop-limit", "1000"]

    def start(self) -> None:
        if self.store == "memory":
            self.job = self._spawn(Job(self.flags() + self.workload(), env=PRODUCT_SPARES))
            return
        from etcd_server import EtcdCluster

        self.etcd = EtcdCluster(self.dir / "etcd").start()
        port = free_port()
        self.serve_args = ["--port", str(port), "--store",
                           f"etcd://{','.join(m.address for m in self.etcd.members)}/chaos",
                           *self.flags(), *self.workload()]
        self.job = self._spawn(Job(self.serve_args, verb="serve", env=PRODUCT_SPARES))
        self.job.wait_event("rendezvous.listening")
        self.rendezvous = f"127.0.0.1:{port}"
        for host in self.in_discovery:
            self._start_agent(host)

    def _spawn(self, job: Job) -> Job:
        self.processes.append(job)
        return job

    def _start_agent(self, host: str) -> None:
        self._spawn(Job(["--rendezvous", self.rendezvous, "--host", host,
                         "--stop-grace", "1", "--reconnect-timeout", "60"],
                        verb="agent", env=PRODUCT_SPARES))

    def status(self) -> dict:
        assert self.job is not None
        if self.job.api_url is None:
            self.job.wait_api(120)
        return self.job.wait_status(lambda s: True, 30, "the control API")

    def stop(self) -> None:
        for job in self.processes:
            job.kill()
        if self.etcd is not None:
            self.etcd.kill()

    # ------------------------------------------------------------------ faults
    def inject(self, kind: str) -> Injected | None:
        status = self.status()
        generation = status["generation"]
        ranked = [w for w in status["workers"] if w["rank"] is not None and w["pid"]]
        active = sorted({w["host"] for w in ranked})
        now = time.time()

        def fault(target: str, cleanup: Callable[[], None] | None = None, new_generation: bool = True) -> Injected:
            return Injected(kind, now, generation, target, cleanup=cleanup, new_generation=new_generation)

        if kind == "kill_worker" and len(ranked) > self.min_np:
            victim = self.rng.choice(ranked)
            os.kill(victim["pid"], signal.SIGKILL)
            return fault(victim["worker_id"])
        if kind == "stop_worker" and len(ranked) > self.min_np:
            victim = self.rng.choice(ranked)
            os.kill(victim["pid"], signal.SIGSTOP)

            def resume(pid: int = victim["pid"]) -> None:
                try:
                    os.kill(pid, signal.SIGCONT)
                except ProcessLookupError:
                    pass
            threading.Timer(HEARTBEAT_TIMEOUT_S + 1.5, resume).start()
            return fault(victim["worker_id"], resume)
        if kind == "kill_host":
            # A host may die only while a worker elsewhere holds the last commit: killing every
            # holder (e.g. while newcomers are still receiving it) loses it, which no job
            # without --checkpoint-dir survives, and this run has none.
            newest = max((w["commits"] for w in ranked), default=0)
            hosts = [h for h in status["hosts"] if h["name"] in active and h["agent_pid"]
                     and len(ranked) - sum(1 for w in ranked if w["host"] == h["name"]) >= self.min_np
                     and any(w["commits"] == newest and w["host"] != h["name"] for w in ranked)]
            if hosts:
                victim = self.rng.choice(hosts)
                os.killpg(victim["agent_pid"], signal.SIGKILL)
                if self.store == "etcd":  # a real host would be brought back by its supervisor
                    threading.Timer(1.0, lambda h=victim["name"]: self._start_agent(h)).start()
                return fault(victim["name"])
        if kind == "add_host":
            spare = [h for h in self.pool if h not in self.in_discovery]
            if spare:
                host = self.rng.choice(spare)
                self.in_discovery.append(host)
                write_hosts(self.hosts_file, {h: SLOTS for h in self.in_discovery})
                if self.store == "etcd":
                    self._start_agent(host)
                return fault(host, new_generation=min(status["target_np"] or self.max_np, self.max_np) > len(ranked))
        if kind == "remove_host":
            candidates = [h for h in self.in_discovery if h in active]
            if len(self.in_discovery) > 1 and candidates:
                host = self.rng.choice(candidates)
                if len(ranked) - sum(1 for w in ranked if w["host"] == host) >= self.min_np:
                    self.in_discovery.remove(host)
                    write_hosts(self.hosts_file, {h: SLOTS for h in self.in_discovery})
                    return fault(host)
        if kind == "scale_down" and len(ranked) > self.min_np:
            target = max(self.min_np, len(ranked) - 2)
            self._scale(target)
            return fault(f"np {target}")
        if kind == "scale_up" and status["target_np"] is not None and status["target_np"] < self.max_np:
            capacity = SLOTS * len([h for h in status["hosts"] if h["agent_connected"] and not h["blacklisted"]])
            self._scale(self.max_np)
            return fault(f"np {self.max_np}", new_generation=capacity > len(ranked))
        if kind == "restart_serve" and self.store == "etcd":
            assert self.job is not None
            os.killpg(self.job.proc.pid, signal.SIGKILL)
            self.job.proc.wait()
            time.sleep(self.rng.uniform(0.5, 2.0))  # the outage itself, not a wait for a condition
            self.job = self._spawn(Job(self.serve_args, verb="serve", env=PRODUCT_SPARES))
            return fault("serve")
        if kind == "kill_etcd_member" and self.store == "etcd":
            member = self.etcd.members[0] if self.rng.random() < 0.5 else self.etcd.raft_leader()
            member.kill()
            return fault(f"etcd {member.address}", cleanup=member.start)
        return None

    def _scale(self, np: int) -> None:
        assert self.job is not None and self.job.api_url is not None
        request = urllib.request.Request(f"{self.job.api_url}/scale", data=json.dumps({"np": np}).encode(),
                                         method="POST",
                                         headers=API_HEADERS)
        with urllib.request.urlopen(request, timeout=10) as response:
            response.read()

    def absorbed(self, fault: Injected) -> float | None:
        """When the job committed a step after `fault` (in a newer generation where one is due)."""
        new_generation = fault.new_generation and fault.kind not in ("restart_serve", "kill_etcd_member")
        times = [
            r["time"]
            for w, records in read_logs(self.log_dir).items()
            for r in records
            if r["event"] == "commit"
            and r["time"] > fault.at
            and (not new_generation or r["generation"] > fault.generation)
        ]
        return min(times) if times else None

    def wait_absorbed(self, fault: Injected) -> None:
        """Wait (bounded) for the job to absorb `fault`; the caller reports a fault left unabsorbed."""
        assert self.job is not None
        job = self.job

        def settled() -> bool:
            fault.absorbed_at = self.absorbed(fault)
            return fault.absorbed_at is not None or (job.proc.poll() is not None and fault.kind != "restart_serve")

        try:
            wait_for(settled, self.recovery_bound_s, f"{fault.kind} to be absorbed", interval_s=0.1)
        except AssertionError:
            pass

    # ------------------------------------------------------------------ the run
    def run(self, compare_loss: bool = True) -> Report:
        """Inject the planned faults, each once the one before was absorbed; a fault with no
        target at its moment (the world at --min-np, say) is tried again after the next one.
        Then the job is asked to end at its next epoch boundary and the logs are checked."""
        started = time.time()
        injected: list[Injected] = []
        skipped: list[str] = []
        pending = list(self.plan)
        deferred: list[Planned] = []
        retries = 3 * len(self.plan)  # tries left for faults that found no target at their moment
        try:
            self.start()
            assert self.job is not None
            job = self.job

            def training() -> bool:
                if job.proc.poll() is not None:
                    raise AssertionError(f"seed {self.seed}: the job exited with {job.proc.returncode} before it "
                                         f"trained:\n{job.output[-6000:]}")
                return len(events(read_logs(self.log_dir), "commit")) >= 8

            try:
                wait_for(training, 180, "training to begin")
            except AssertionError as error:
                if "timed out" not in str(error):
                    raise
                raise AssertionError(f"seed {self.seed}: {error}; the job said last:\n{job.output[-6000:]}") from None
            while (pending or (deferred and retries > 0)) and self.job.proc.poll() is None:
                if not pending:  # only faults that found no target are left: try them again
                    pending, deferred, retries = deferred, [], retries - len(deferred)
                planned = pending.pop(0)
                deadline = time.monotonic() + planned.after_s
                while time.monotonic() < deadline and self.job.proc.poll() is None:
                    time.sleep(0.05)  # the schedule's gap between faults
                fault = self.inject(planned.kind)
                if fault is None:
                    deferred.append(planned)
                    continue
                pending = deferred + pending  # what found no target is tried again now
                deferred = []
                injected.append(fault)
                self.say(f"[{fault.at - started:6.1f} s] {fault.kind} {fault.target} (generation {fault.generation})")
                self.wait_absorbed(fault)
                if fault.cleanup is not None and fault.kind == "kill_etcd_member":
                    fault.cleanup()
                if fault.absorbed_at is None:
                    raise AssertionError(f"seed {self.seed}: {fault.kind} of {fault.target} was not absorbed within "
                                         f"{self.recovery_bound_s:g} s:\n{self.job.output[-6000:]}")
                self.say(f"          absorbed in {fault.recovery_s:.2f} s")
            skipped = [p.kind for p in deferred + pending]
            self.stop_file.touch()
            code = self.job.wait(600)
            assert code == 0, f"seed {self.seed}: the job exited with {code}:\n{self.job.output[-6000:]}"
        finally:
            for fault in injected:
                if fault.cleanup is not None and fault.kind == "stop_worker":
                    fault.cleanup()
            self.stop()
        return self.check(injected, skipped, time.time() - started, compare_loss)

    def check(self, injected: list[Injected], skipped: list[str], wall_s: float, compare_loss: bool) -> Report:
        logs = read_logs(self.log_dir)
        try:
            return self._check(logs, injected, skipped, wall_s, compare_loss)
        except AssertionError as error:
            story = self.job.story() if self.job is not None else ""
            raise AssertionError(f"seed {self.seed}: {error}\n\nthe generations, as the workers logged them:\n"
                                 f"{generations_table(logs)}\n\nthe rendezvous' story:\n{story[-12000:]}") from None

    def _check(self, logs: dict[str, list[dict]], injected: list[Injected], skipped: list[str], wall_s: float,
               compare_loss: bool) -> Report:
        checks: dict[str, str] = {}
        done = events(logs, "done")
        epochs = done[0]["epochs"]
        assert_every_sample_once(logs, epochs)
        checks["every sample of every epoch"] = "once (repeats only within the sampler's padding)"
        assert_no_committed_step_lost(logs)
        checks["committed steps"] = "none lost: each generation resumed at or after the last commit logged before it"
        assert_ranks_agree(logs, cut_short={f.generation for f in injected if f.kind in ("kill_worker", "kill_host")})
        generations = len({r["generation"] for r in events(logs, "synced")})
        checks["replicas"] = f"bit-identical after each of {generations} syncs and at the end"
        assert not any(job.events("replicas.diverged") for job in self.processes), "the guard had to heal a divergence"
        final_loss = done[0]["loss"]
        reference = None
        if compare_loss:
            sizes = sorted({r["size"] for r in events(logs, "synced")})
            references = {size: reference_loss(self.dir / f"reference-{size}", epochs, self.optimizer,
                                               size) for size in sizes}
            size, reference = max(references.items(), key=lambda item: item[1])
            assert final_loss <= 2 * reference + 0.01, (
                f"seed {self.seed}: final loss {final_loss:.4f} against {reference:.4f} without faults on "
                f"{size} workers "
                f"(the worst of the sizes the job had: {', '.join(f'{n}: {v:.4f}' for n, v in references.items())})"
            )
            checks["loss"] = (
                f"{final_loss:.4f} after {epochs} epochs; fault-free at most {reference:.4f} ({size} workers)"
            )
        slowest = max((f.recovery_s or 0.0 for f in injected), default=0.0)
        checks["no hang"] = f"every fault absorbed within {self.recovery_bound_s:g} s (slowest {slowest:.2f} s)"
        kept, computed, progress = goodput(logs)
        return Report(self.seed, self.store, injected, skipped, wall_s, kept, computed, progress, final_loss, reference,
                      checks)


def generations_table(logs: dict[str, list[dict]]) -> str:
    """Each generation as its members logged it (seconds from the first record, who synced at
    which rank and step), with the newest commit logged before it: what a failed check needs."""
    synced = events(logs, "synced")
    if not synced:
        return "(no worker synced)"
    start = min(r["time"] for records in logs.values() for r in records if "time" in r)
    commits = sorted((r["time"], r["step"], r.get("worker", "?")) for r in events(logs, "commit"))
    lines = []
    for generation in sorted({r["generation"] for r in synced}):
        members = sorted((r for r in synced if r["generation"] == generation), key=lambda r: r["rank"])
        first = min(r["time"] for r in members)
        before = [c for c in commits if c[0] < first]
        newest = f"newest commit before: step {before[-1][1]} by {before[-1][2]}" if before else "no commit before"
        who = ", ".join(f"{r.get('worker', '?')}=r{r['rank']}@{r['step']}" for r in members)
        lines.append(f"  gen {generation:3d} at {first - start:7.2f} s size {members[0]['size']}: {who} ({newest})")
    return "\n".join(lines)


def assert_no_committed_step_lost(logs: dict[str, list[dict]]) -> None:
    """Each generation started from a step at least as new as every commit logged before it."""
    commits = sorted((r["time"], r["step"]) for r in events(logs, "commit"))
    for record in events(logs, "synced"):
        first = min((r["time"] for r in events(logs, "synced") if r["generation"] == record["generation"]))
        before = [step for t, step in commits if t < first]
        if before:
            assert record["step"] >= max(before), (
                f"generation {record['generation']} resumed at step {record['step']}, "
                f"but step {max(before)} was committed"
            )


def goodput(logs: dict[str, list[dict]]) -> tuple[int, int, float]:
    """(steps kept, steps computed, fraction of wall time with progress), from the ring's rank 0
    of each generation: a step begun and not kept was redone; a pause between two commits longer
    than three median steps is time without progress."""
    leaders = {(r["generation"], r["worker"]) for r in events(logs, "synced") if r["rank"] == 0}
    begun = 0
    commit_times: list[float] = []
    for generation, worker in leaders:
        records = logs[worker]
        synced_at = next(r["time"] for r in records if r["event"] == "synced" and r["generation"] == generation)
        later = [r for r in records if r["event"] == "synced" and r["generation"] > generation]
        until = min((r["time"] for r in later), default=float("inf"))
        begun += sum(1 for r in records if r["event"] == "begin" and synced_at <= r["time"] < until)
        commit_times += [r["time"] for r in records if r["event"] == "commit" and r["generation"] == generation]
    kept = max(r["step"] for r in events(logs, "done"))
    commit_times.sort()
    gaps = [b - a for a, b in zip(commit_times, commit_times[1:])]
    if not gaps:
        return kept, begun, 1.0
    typical = statistics.median(gaps)
    stalled = sum(g - typical for g in gaps if g > 3 * typical)
    span = commit_times[-1] - commit_times[0]
    return kept, max(begun, kept), 1.0 - stalled / span if span else 1.0


def reference_loss(workdir: pathlib.Path, epochs: int, optimizer: str, size: int = 1) -> float:
    """The workload's final loss without faults on a ring of `size`, computed by one process.

    One process with `size` times the batch and the learning rate takes the very batches and steps
    of a fault-free ring of `size` (the sampler's shards of one shuffle, averaged): the same final
    loss to float precision. Why more than one size: the lr scales with the world size, and a larger
    ring's noisier steps leave a higher loss at a given epoch (0.06-0.10 on 8 workers where one gets
    0.035-0.05 after 12-14 epochs), so a run that ends on 8 workers is held to what 8 reach."""
    workdir.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("RINGMASTER_")}
    subprocess.run([sys.executable, str(WORKLOADS / "elastic_job.py"),
                    "--log-dir", str(workdir), "--epochs", str(epochs),
                    "--samples", str(SAMPLES), "--step-time", "0", "--optimizer", optimizer, "--lr-callback",
                    "--base-lr", str(BASE_LR * size), "--batch-size", str(BATCH * size)],
                   cwd=ROOT, env=env, check=True, timeout=600, capture_output=True)
    return events(read_logs(workdir), "done")[0]["loss"]
