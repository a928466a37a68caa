"""A trace-driven simulation of a shared pool: the pool's own scheduling code
(`ringmaster.rendezvous.scheduling.plan.schedule`, every policy) against simulated time, on
Pollux's workloads and measured model traces (bench/data/pollux, Apache-2.0, see its SOURCE.md).

The cluster is Pollux's: 16 hosts x 4 slots (a slot is a GPU). Each job of a workload trains one of
six real models at the global batch its row names, kept whatever its size (the per-worker batch
is the global batch split between workers, with gradient accumulation where a share exceeds what
one GPU computes at once). Ringmaster jobs are elastic: `--min-np 1 --max-np` as many workers as
the batch allows (at most 64). Every `--interval` seconds (Pollux: 60) the policy is asked again,
as the pool asks it each round; a job whose placement changes pauses `--resize-cost` seconds (ring
rebuild and state sync) and one that starts or resumes `--start-cost` seconds (Pollux charges 30
for either; its jobs restart from a checkpoint).

Policies: `fifo`, `priority` (every job of the same priority), `fair` (one queue), `las` (least
attained service, elastic), `goodput` (each job's scaling learned from the step times it
measured at the placements it ran, as a real job reports them), `tiresias`: `las` with rigid
jobs at the size their row asked (Tiresias' discipline as Pollux ran it), and `goodput-batch`:
`goodput`'s allocations, with each job choosing its global batch (with the learning rate scaled
for it, as Pollux's jobs do) on whatever allocation it gets: at every epoch the batch, among
those the traces measured, that makes progress fastest there. An estimate of how much of
Pollux's lead its co-tuning of batch and learning rate explains: the jobs choose with the traces'
exact gradient statistics (Pollux's estimate them as they train), and the scheduler is not told
(it predicts as for `goodput`). Printed per workload
and policy: average and p99 JCT, makespan, utilisation (slot-seconds used / slots x makespan),
resizes per job; and the published Pollux, Tiresias and Optimus averages on the same workload.

Run: python bench/pool_sim.py [--loads 1.0 ...] [--workloads 1 2 ...] [--policies ...] [--jobs N]
"""

from __future__ import annotations

import argparse
import multiprocessing
import pathlib
import statistics
import sys
import time
from dataclasses import dataclass, field, replace
from typing import Any

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT))

import pollux_traces  # noqa: E402

from ringmaster.rendezvous.scheduling.model import JobAsk, Settings  # noqa: E402
from ringmaster.rendezvous.scheduling.plan import schedule  # noqa: E402
from ringmaster.rendezvous.scheduling.throughput import PerfParams, Scaling, StepSample, fit  # noqa: E402

HOSTS = {f"n{i:02d}": 4 for i in range(16)}
#: The pool's settings as the simulation runs them (--power, --explore, --service-half change them).
TUNING = Settings()
POLICIES = ("fifo", "priority", "fair", "las", "tiresias", "goodput", "goodput-batch")


@dataclass
class SimJob:
    """One job of the workload as it runs in the simulation."""

    trace: pollux_traces.TraceJob
    min_np: int
    max_np: int
    progress: float = 0.0
    epoch: int = 0
    done_at: float | None = None
    placement: dict[str, int] = field(default_factory=dict)
    pause_s: float = 0.0
    resized_at: float | None = None
    attained_s: float = 0.0
    resizes: int = 0
    samples: dict[tuple[int, int, int], StepSample] = field(default_factory=dict)
    params: PerfParams | None = None
    #: Chooses its global batch on each allocation (`goodput-batch`), else keeps its row's.
    cotune: bool = False

    @property
    def size(self) -> int:
        return sum(self.placement.values())

    def advance(self, seconds: float, now: float) -> None:
        """Train for `seconds` from `now` on its placement (pausing first if a resize is pending)."""
        if not self.placement or self.done_at is not None:
            return
        self.attained_s += seconds * self.size
        pause = min(self.pause_s, seconds)
        self.pause_s -= pause
        now, seconds = now + pause, seconds - pause
        model = pollux_traces.model(self.trace.model)
        shape = tuple(sorted(self.placement.values(), reverse=True))
        batches = self._batches(model) if self.cotune else [self.trace.batch]
        steps = {batch: self._step(model, batch, shape) for batch in batches}
        while seconds > 0:
            # progress per second at each batch (its gain per step this epoch over its step time)
            rate, batch = max((model.plan(b).gains[self.epoch] / steps[b][0], b) for b in batches)
            _, atomic, step, sync = steps[batch]
            self._measure(len(shape), atomic, step, sync)
            plan = model.plan(batch)
            need = (plan.ends[self.epoch + 1] - self.progress) / rate
            if need > seconds:
                self.progress += rate * seconds
                return
            self.progress = plan.ends[self.epoch + 1]
            self.epoch += 1
            now, seconds = now + need, seconds - need
            if self.epoch >= model.epochs:
                self.done_at = now
                return

    def _batches(self, model: pollux_traces.Model) -> list[int]:
        """The global batches a co-tuning job may choose on its allocation: those the traces
        measured (and its row's), at least the smallest per-worker batch on each worker."""
        return sorted(b for b in {*model.batches, self.trace.batch} if model.most_workers(b) >= self.size) \
            or [self.trace.batch]

    def _step(self, model: pollux_traces.Model, batch: int, shape: tuple[int, ...]) -> tuple[float, int, float, float]:
        """(seconds of a whole step, per-pass batch, one pass's seconds, its sync) at `batch`."""
        atomic, passes = model.configuration(batch, self.size)
        step, sync = model.step_and_sync(shape, atomic)
        return step + (passes - 1) * (step - sync), atomic, step, sync

    def _measure(self, hosts: int, atomic: int, step: float, sync: float) -> None:
        """What a real job reports: its step time and the part of it not spent synchronising."""
        key = (hosts, self.size, atomic)
        if key not in self.samples:
            self.samples[key] = StepSample(hosts, self.size, atomic, step, step - sync)
            self.params = fit(list(self.samples.values()), self.params)

    def scaling(self) -> Scaling | None:
        if self.params is None:
            return None
        model = pollux_traces.model(self.trace.model)
        return Scaling(self.params, self.trace.batch, per_worker_batch=False, max_local_batch=model.max_local,
                       explored=max(k[1] for k in self.samples))


def _jobs(trace: list[pollux_traces.TraceJob], rigid: bool, cotune: bool = False) -> list[SimJob]:
    jobs = []
    for row in trace:
        most = pollux_traces.model(row.model).most_workers(row.batch)
        if rigid:
            jobs.append(SimJob(row, min(row.workers, most), min(row.workers, most)))
        else:
            jobs.append(SimJob(row, 1, most, cotune=cotune))
    return jobs


def simulate(trace: list[pollux_traces.TraceJob], policy: str, interval: float, resize_cost: float,
             start_cost: float) -> dict[str, Any]:
    """Run one workload under one policy; the figures of its jobs."""
    rigid, cotune = policy == "tiresias", policy == "goodput-batch"
    jobs = _jobs(trace, rigid, cotune)
    policy = "goodput" if cotune else policy  # (the scheduler's own policy)
    settings = replace(TUNING, min_resize_interval_s=interval, resize_cost_s=resize_cost)
    now = 0.0
    used_slot_s = 0.0
    started = time.perf_counter()
    while any(j.done_at is None for j in jobs):
        for job in jobs:
            job.advance(interval, now)
            if job.done_at is not None and job.placement:
                used_slot_s += job.size * (job.done_at - now)
                job.placement = {}
            elif job.placement:
                used_slot_s += job.size * interval
        now += interval
        active = [j for j in jobs if j.trace.submitted <= now and j.done_at is None]
        asks = [JobAsk(j.trace.name, j.min_np, j.max_np, j.trace.submitted, placement=dict(j.placement),
                       resized_at=j.resized_at, attained_s=j.attained_s,
                       scaling=j.scaling() if policy == "goodput" else None) for j in active]
        verdicts = schedule("las" if rigid else policy, HOSTS, asks, now, settings)
        for job in active:
            target = dict(verdicts[job.trace.name].placement)
            if target == job.placement:
                continue
            job.pause_s = start_cost if not job.placement else resize_cost
            job.resizes += bool(job.placement) and bool(target)
            job.placement = target
            job.resized_at = now
    jcts = sorted(j.done_at - j.trace.submitted for j in jobs if j.done_at is not None)
    makespan = max(j.done_at for j in jobs if j.done_at is not None) - min(j.trace.submitted for j in jobs)
    return {"avg": statistics.fmean(jcts), "p99": jcts[min(len(jcts) - 1, int(0.99 * len(jcts)))],
            "makespan": makespan, "utilisation": used_slot_s / (sum(HOSTS.values()) * makespan),
            "resizes": statistics.fmean(j.resizes for j in jobs), "wall_s": time.perf_counter() - started}


def _run(task: tuple[str, int, str, int | None, float, float, float]) -> tuple[str, int, str, dict[str, Any]]:
    load, number, policy, limit, interval, resize_cost, start_cost = task
    trace = pollux_traces.workload(load, number)[:limit]
    return load, number, policy, simulate(trace, policy, interval, resize_cost, start_cost)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--loads", nargs="+", default=["1.0"], choices=["0.5", "1.0", "1.5", "2.0"])
    parser.add_argument("--workloads", nargs="+", type=int, default=list(range(1, 9)), choices=range(1, 9))
    parser.add_argument("--policies", nargs="+", default=list(POLICIES), choices=POLICIES)
    parser.add_argument("--interval", type=float, default=60.0, help="seconds between scheduling rounds")
    parser.add_argument("--resize-cost", type=float, default=5.0, help="seconds a resize pauses a job")
    parser.add_argument("--start-cost", type=float, default=30.0, help="seconds a job takes to start or resume")
    parser.add_argument("--jobs", type=int, default=None, help="only the first N jobs of each workload")
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--power", type=float, default=None,
                        help="goodput's p-norm power (the pool's default: Settings.fairness_power)")
    parser.add_argument("--explore", type=float, default=None,
                        help="goodput's trust in its predictions, x the largest size run (default: the pool's)")
    parser.add_argument("--service-half", type=float, default=None,
                        help="slot-seconds of service at which goodput counts a job's gains half (default: the pool's)")
    args = parser.parse_args()
    global TUNING
    if args.service_half is not None:
        TUNING = replace(TUNING, service_half_s=args.service_half)
    if args.power is not None:
        TUNING = replace(TUNING, fairness_power=args.power)
    if args.explore is not None:
        TUNING = replace(TUNING, explore_factor=args.explore)
    tasks = [(load, n, p, args.jobs, args.interval, args.resize_cost, args.start_cost)
             for load in args.loads for n in args.workloads for p in args.policies]
    started = time.perf_counter()
    with multiprocessing.Pool(args.processes) as pool:
        results = pool.map(_run, tasks, chunksize=1)
    figures = {(load, n, p): r for load, n, p, r in results}
    print(f"{len(tasks)} simulations in {time.perf_counter() - started:.0f} s "
          f"(resize {args.resize_cost:g} s, start {args.start_cost:g} s, round {args.interval:g} s)")
    for load in args.loads:
        published = {p: pollux_traces.published(p, load) for p in ("pollux", "tiresias", "optimus")}
        print(f"\nload {load}: average JCT (s) per workload; p99, makespan, utilisation, resizes/job in brackets")
        header = f"{'workload':>9} " + " ".join(f"{p:>10}" for p in args.policies) + \
            f" {'Pollux':>8} {'Tiresias':>8} {'Optimus':>8}  goodput/Pollux  goodput/fifo  goodput-batch/Pollux"
        print(header)
        for n in args.workloads:
            row = [figures[(load, n, p)]["avg"] for p in args.policies]
            pub = [published[p].get(f"workload-{n}", float("nan")) for p in ("pollux", "tiresias", "optimus")]
            cells = " ".join(f"{v:>10.0f}" for v in row) + " " + " ".join(f"{v:>8.0f}" for v in pub)
            ratio = ""
            if "goodput" in args.policies:
                good = figures[(load, n, "goodput")]["avg"]
                ratio = f"  {good / pub[0]:>14.2f}"
                if "fifo" in args.policies:
                    ratio += f"  {good / figures[(load, n, 'fifo')]['avg']:>12.2f}"
            if "goodput-batch" in args.policies:
                ratio += f"  {figures[(load, n, 'goodput-batch')]['avg'] / pub[0]:>20.2f}"
            print(f"{n:>9} {cells}{ratio}")
        means = {p: statistics.fmean(figures[(load, n, p)]["avg"] for n in args.workloads) for p in args.policies}
        pub_means = [statistics.fmean(published[p].get(f"workload-{n}", float("nan")) for n in args.workloads)
                     for p in ("pollux", "tiresias", "optimus")]
        print(f"{'mean':>9} " + " ".join(f"{means[p]:>10.0f}" for p in args.policies) + " " +
              " ".join(f"{v:>8.0f}" for v in pub_means))
        for p in args.policies:
            rows = [figures[(load, n, p)] for n in args.workloads]
            print(f"  {p:>9}: p99 {statistics.fmean(r['p99'] for r in rows):.0f} s, makespan "
                  f"{statistics.fmean(r['makespan'] for r in rows):.0f} s, utilisation "
                  f"{statistics.fmean(r['utilisation'] for r in rows):.0%}, resizes/job "
                  f"{statistics.fmean(r['resizes'] for r in rows):.1f}, simulated in "
                  f"{statistics.fmean(r['wall_s'] for r in rows):.1f} s")


if __name__ == "__main__":
    main()
