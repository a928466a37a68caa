"""Each pool job's scaling as its workers measured it: the step-time model of
`scheduling.throughput` fit to the job's step times by size (`server.step_times`), for the
`goodput` policy. A fit is redone only when the job has measured something new (a size it had
not run, or many more steps), starting from its last fit.

Horovod scripts keep their per-worker batch, so a job's samples per second are taken to grow
with workers / step time (its batch per worker is the unit: the policy compares speedups, not
samples); a script that reports its batch and gradient noise scale (`hvd.report`) has each
larger global batch counted for what it learns (Pollux's statistical efficiency). A script that
declares a global batch (`ElasticSampler(global_batch_size=...)`) learns the same per step at
any size: a step's samples are fixed, and more workers shorten it only until each computes one
micro-batch.
"""

from __future__ import annotations

import logging

from ringmaster.rendezvous.scheduling.throughput import PerfParams, Scaling, StepSample, fit
from ringmaster.rendezvous.server.step_times import Measured

_log = logging.getLogger(__name__)


class ScalingFits:
    """The last fit of each job, by job id."""

    def __init__(self) -> None:
        self._fits: dict[str, tuple[tuple[tuple[Measured, ...], tuple[int, int] | None], PerfParams]] = {}

    def scaling(self, job_id: str, measured: list[Measured], batch: int = 0, noise_scale: float = 0.0,
                global_batch: tuple[int, int] | None = None) -> Scaling | None:
        """The job's scaling, or None before it measured a size. `batch` and `noise_scale`: what its
        script reported (hvd.report; 0: not), with which larger global batches count for less;
        `global_batch`: the (samples per step, per micro-batch) it declared, with which every
        size's step is the same samples, the busiest worker's share of them its step's work."""
        if not measured:
            return None
        key = (tuple(measured), global_batch)
        last = self._fits.get(job_id)
        if last is None or last[0][1] != global_batch or self._changed(last[0][0], key[0]):
            samples = [StepSample(m.hosts, m.workers, _local(m.workers, global_batch), m.step_s,
                                  m.compute_s if m.compute_s > 0 else None) for m in measured]
            try:
                params = fit(samples, last[1] if last is not None else None)
            except (ValueError, ArithmeticError) as exc:  # a fit that fails leaves the last one standing
                _log.warning("job %s: its scaling could not be fit to %d sizes: %s", job_id, len(samples), exc)
                if last is None:
                    return None
                params = last[1]
            self._fits[job_id] = (key, params)
            last = self._fits[job_id]
        explored = max(m.workers for m in measured)
        if global_batch is not None:
            return Scaling(last[1], batch=float(global_batch[0]), per_worker_batch=False,
                           micro_batch=float(global_batch[1]), explored=explored)
        return Scaling(last[1], batch=float(batch or 1), per_worker_batch=True,
                       noise_scale=noise_scale if batch and noise_scale > 0 else None, explored=explored)

    @staticmethod
    def _changed(before: tuple[Measured, ...], now: tuple[Measured, ...]) -> bool:
        if [(m.hosts, m.workers) for m in before] != [(m.hosts, m.workers) for m in now]:
            return True
        return any(n.steps >= 2 * b.steps for b, n in zip(before, now))

    def forget(self, job_id: str) -> None:
        self._fits.pop(job_id, None)


def _local(workers: int, global_batch: tuple[int, int] | None) -> float:
    """Samples the busiest worker computes per step at `workers` workers: the unit (a Horovod
    script's batch per worker) without a global batch, else its share of whole micro-batches."""
    if global_batch is None:
        return 1.0
    size, micro = global_batch
    return float(-(-(size // micro) // workers) * micro)
