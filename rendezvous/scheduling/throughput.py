"""How fast a job trains at a size it may not have run at yet: a model of one step's time, fit to
the step times the job measured at the sizes it ran, and the goodput (samples per second times
statistical efficiency) it predicts.

The model is Pollux's (Qiao et al., OSDI 2021): compute grows linearly with the per-worker batch;
synchronisation is a constant plus a term that grows with the ring's size, with one pair of
constants when the ring stays on one host and another when it spans hosts (the network is the
bottleneck link then); compute and synchronisation overlap to a degree `overlap`, a p-norm between
their sum (1: no overlap) and their maximum (10: nearly full overlap):

    step = (compute ** overlap + sync ** overlap) ** (1 / overlap)
    compute = compute_s + compute_per_sample_s * per-worker batch
    sync = 0 with one worker, else (host_ or net_) sync_s + sync_per_worker_s * (workers - 2)

Fit by least squares on the logarithm of step time (so a 1 ms step counts as much as a 1 s one),
with the parameters positive, and, where the job has not run in both regimes (never across hosts,
or never several workers on one host), the network's constants held no cheaper than the host's (a
ring across hosts is never faster than one inside a host).
Statistical efficiency, where the job reports its gradient noise scale (hvd.report), is Pollux's
too: a step at global batch B is worth (noise + B0) / (noise + B) steps at the batch B0 it
started at. Pure: numbers in, numbers out (scipy's least squares does the fitting).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

#: The bounds of `overlap`: 1 (compute then sync) to 10 (as good as their maximum).
OVERLAP_RANGE = (1.0, 10.0)
#: The smallest time a parameter can take (seconds): keeps logarithms finite.
_FLOOR_S = 1e-7


@dataclass(frozen=True)
class PerfParams:
    """One job's step-time model (seconds). See the module's docstring for the formula."""

    compute_s: float
    compute_per_sample_s: float
    host_sync_s: float
    host_sync_per_worker_s: float
    net_sync_s: float
    net_sync_per_worker_s: float
    overlap: float = 1.0

    def as_array(self) -> np.ndarray:
        return np.array([self.compute_s, self.compute_per_sample_s, self.host_sync_s, self.host_sync_per_worker_s,
                         self.net_sync_s, self.net_sync_per_worker_s, self.overlap])


@dataclass(frozen=True)
class StepSample:
    """One measurement: the mean step time (and, where known, the compute part of it: the time
    not spent waiting for the ring) with `workers` workers on `hosts` hosts, `local_batch`
    samples per worker per step."""

    hosts: int
    workers: int
    local_batch: float
    step_s: float
    compute_s: float | None = None

    def __post_init__(self) -> None:
        if not 1 <= self.hosts <= self.workers:
            raise ValueError(f"a step sample needs 1 <= hosts <= workers, not {self.hosts} hosts, {self.workers} "
                             "workers")
        if not (self.step_s > 0 and math.isfinite(self.step_s)) or self.local_batch <= 0:
            raise ValueError(f"a step sample needs a positive step time and batch, not {self.step_s} s, "
                             f"{self.local_batch} samples")


def compute_time(params: PerfParams | np.ndarray, local_batch: np.ndarray | float) -> np.ndarray:
    p = params.as_array() if isinstance(params, PerfParams) else params
    return p[0] + p[1] * np.asarray(local_batch, dtype=float)


def sync_time(params: PerfParams | np.ndarray, hosts: np.ndarray | float, workers: np.ndarray | float) -> np.ndarray:
    p = params.as_array() if isinstance(params, PerfParams) else params
    hosts, workers = np.asarray(hosts, dtype=float), np.asarray(workers, dtype=float)
    across = hosts > 1
    constant = np.where(across, p[4], p[2])
    per_worker = np.where(across, p[5], p[3])
    return np.where(workers > 1, constant + per_worker * np.maximum(workers - 2, 0.0), 0.0)


def step_time(params: PerfParams | np.ndarray, hosts: np.ndarray | float, workers: np.ndarray | float,
              local_batch: np.ndarray | float) -> np.ndarray:
    """Predicted seconds of one step (an array if any argument is one)."""
    p = params.as_array() if isinstance(params, PerfParams) else params
    compute = np.maximum(compute_time(p, local_batch), _FLOOR_S)
    sync = np.maximum(sync_time(p, hosts, workers), 0.0)
    gamma = p[6]
    # (a^g + b^g)^(1/g) = a * (1 + (b/a)^g)^(1/g): no overflow for large g
    return compute * (1.0 + (sync / compute) ** gamma) ** (1.0 / gamma)


def _initial(samples: Sequence[StepSample]) -> np.ndarray:
    ones = [s.step_s for s in samples if s.workers == 1]
    compute = min(ones) if ones else min(s.compute_s or s.step_s for s in samples) * 0.5
    sync = max(min(s.step_s for s in samples) * 0.1, 1e-4)
    return np.array([compute * 0.8, compute * 0.2 / max(min(s.local_batch for s in samples), 1.0),
                     sync, sync * 0.1, sync * 2, sync * 0.2, 1.5])


def fit(samples: Sequence[StepSample], start: PerfParams | None = None) -> PerfParams:
    """The parameters that best explain `samples` (at least one). `start`: the last fit, where
    there is one (the next converges in a few iterations from it)."""
    if not samples:
        raise ValueError("fitting a step-time model needs at least one measured step")
    hosts = np.array([s.hosts for s in samples], dtype=float)
    workers = np.array([s.workers for s in samples], dtype=float)
    batch = np.array([s.local_batch for s in samples], dtype=float)
    steps = np.log(np.array([s.step_s for s in samples]))
    known = np.array([s.compute_s is not None for s in samples])
    computes = np.log(np.array([max(s.compute_s or 1.0, _FLOOR_S) for s in samples]))
    across_seen = bool(np.any(hosts > 1))
    within_seen = bool(np.any((hosts == 1) & (workers > 1)))
    varied_batch = len(set(batch.tolist())) > 1

    def unpack(x: np.ndarray) -> np.ndarray:
        return np.concatenate([np.exp(x[:6]), x[6:]])

    def residuals(x: np.ndarray) -> np.ndarray:
        p = unpack(x)
        out = [np.log(step_time(p, hosts, workers, batch)) - steps]
        if known.any():
            out.append(np.where(known, np.log(np.maximum(compute_time(p, batch), _FLOOR_S)) - computes, 0.0))
        # Priors, weak: what the samples cannot tell stays plausible rather than arbitrary.
        prior = [0.1 * (x[6] - 1.5)]  # overlap: near "mostly sequential" unless the samples say otherwise
        if not (across_seen and within_seen):
            # One regime unmeasured (never across hosts, or never several workers on one host):
            # its constants are not identifiable, so a ring inside a host is held no slower than
            # one across hosts (else a job seen only across hosts may be predicted slow on one
            # host, never be placed there, and never learn otherwise).
            prior += [2.0 * max(x[2] - x[4], 0.0), 2.0 * max(x[3] - x[5], 0.0)]
        if not varied_batch:  # one batch size: compute per sample is not identifiable; keep it small
            prior += [0.05 * (x[1] - (x[0] - math.log(max(batch[0], 1.0)) - 2.0))]
        out.append(np.array(prior))
        return np.concatenate(out)

    x0 = start.as_array() if start is not None else _initial(samples)
    x0 = np.concatenate([np.log(np.maximum(x0[:6], _FLOOR_S)), np.clip(x0[6:], *OVERLAP_RANGE)])
    lower = np.array([math.log(_FLOOR_S)] * 6 + [OVERLAP_RANGE[0]])
    upper = np.array([math.log(1e4)] * 6 + [OVERLAP_RANGE[1]])
    x0 = np.clip(x0, lower + 1e-9, upper - 1e-9)
    # (imported here: scipy.optimize is a heavy import that every `ringmaster` command would pay
    # at start, and only a job whose size is chosen by its fitted throughput ever fits)
    import scipy.optimize

    result = scipy.optimize.least_squares(residuals, x0, bounds=(lower, upper), method="trf", max_nfev=200,
                                          x_scale=1.0)
    return PerfParams(*[float(v) for v in unpack(result.x)])


@dataclass(frozen=True)
class Scaling:
    """What the scheduler knows of how a job speeds up: its fitted step-time model, how its global
    batch grows with its size, and (optionally) its gradient noise scale.

    `batch`: samples per worker per step when `per_worker_batch` (Horovod scripts keep the
    per-worker batch, so the global batch grows with the ring), else the global batch, split
    between the workers (then `max_local_batch` bounds what one worker computes at once: beyond
    it the step accumulates gradients over several passes). `explored`: the largest size measured;
    predictions beyond twice it are not trusted (the scheduler grows a job there step by step)."""

    params: PerfParams
    batch: float
    per_worker_batch: bool = True
    max_local_batch: float | None = None
    noise_scale: float | None = None
    explored: int = 1
    #: A global batch in whole micro-batches of this many samples (`ElasticSampler(global_batch_size=
    #: batch, micro_batch_size=...)`, with `per_worker_batch` false): the ring shares the step's
    #: micro-batches, the busiest worker computing ceil(K / workers) of them; past K workers the
    #: extra ones have nothing to compute.
    micro_batch: float | None = None

    def throughput(self, workers: np.ndarray | int, hosts: np.ndarray | int) -> np.ndarray:
        """Samples per second (an array for arrays)."""
        workers_a = np.asarray(workers, dtype=float)
        if self.micro_batch and not self.per_worker_batch:
            micro = np.full_like(workers_a, self.micro_batch)
            passes = np.maximum(np.ceil(max(round(self.batch / self.micro_batch), 1) / workers_a - 1e-8), 1.0)
            total = step_time(self.params, hosts, workers_a, micro) + (passes - 1) * compute_time(self.params, micro)
            return self.batch / total
        local = np.full_like(workers_a, self.batch) if self.per_worker_batch else np.ceil(self.batch / workers_a - 1e-8)
        passes = np.ones_like(local)
        if self.max_local_batch:
            passes = np.maximum(np.ceil(local / self.max_local_batch - 1e-8), 1.0)
        atomic = np.ceil(local / passes - 1e-8)
        one = step_time(self.params, hosts, workers_a, atomic)
        total = one + (passes - 1) * compute_time(self.params, atomic)
        return workers_a * atomic * passes / total

    def efficiency(self, workers: np.ndarray | int) -> np.ndarray:
        """Progress per sample relative to the job at one worker (1 without a noise scale)."""
        workers_a = np.asarray(workers, dtype=float)
        if self.noise_scale is None or not self.per_worker_batch:
            return np.ones_like(workers_a)
        return (self.noise_scale + self.batch) / (self.noise_scale + self.batch * workers_a)

    def goodput(self, workers: np.ndarray | int, hosts: np.ndarray | int) -> np.ndarray:
        return self.throughput(workers, hosts) * self.efficiency(workers)

    def speedups(self, most: int, host_slots: int) -> np.ndarray:
        """Speedup over one worker at 0..most workers packed on hosts of `host_slots` slots
        (index n: n workers; index 0 is 0)."""
        n = np.arange(1, most + 1)
        hosts = np.ceil(n / max(host_slots, 1))
        rates = self.goodput(n, hosts)
        return np.concatenate([[0.0], rates / rates[0]])
