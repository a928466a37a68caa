"""What each job measured of itself (step times by size) and declared (its batch, its gradient
noise, its global batch), kept across its suspensions, for the goodput policy and the API."""

from __future__ import annotations

from typing import Iterable

from ringmaster.rendezvous.pool.scaling_fits import ScalingFits
from ringmaster.rendezvous.scheduling.throughput import Scaling
from ringmaster.rendezvous.server.app import RendezvousServer
from ringmaster.rendezvous.server.step_times import Measured


class JobMeasures:
    def __init__(self) -> None:
        self.fits = ScalingFits()  # each job's measured scaling (--policy goodput)
        self._measured: dict[str, dict[tuple[int, int], Measured]] = {}  # step times by (hosts, workers)
        self._hints: dict[str, tuple[int, float]] = {}  # reported (batch per worker, noise scale)
        #: declared (global batch, micro-batch, most workers)
        self._global_batches: dict[str, tuple[int, int, int]] = {}

    def step_times(self, job_id: str, server: RendezvousServer | None) -> list[Measured]:
        """The job's step times by size, its running rendezvous' (`server`) merged into what
        earlier runs measured (kept across a suspension; a size measured again replaces it)."""
        if server is not None and server.metrics is not None:
            known = self._measured.setdefault(job_id, {})
            known.update({(m.hosts, m.workers): m for m in server.metrics.step_times.samples()})
            self._hints[job_id] = server.metrics.scaling_hints()
            declared = server.metrics.global_batch()
            if declared is not None:
                self._global_batches[job_id] = declared[:3]
        return [m for _, m in sorted(self._measured.get(job_id, {}).items())]

    def global_batch(self, job_id: str, server: RendezvousServer | None) -> tuple[int, int, int] | None:
        """What the job's script declared of its global batch (size, micro-batch, most workers)."""
        self.step_times(job_id, server)
        return self._global_batches.get(job_id)

    def scaling(self, job_id: str, server: RendezvousServer | None) -> Scaling | None:
        """How the job sped up at the sizes it ran, with what its script reported (hvd.report)."""
        measured = self.step_times(job_id, server)
        batch, noise = self._hints.get(job_id, (0, 0.0))
        declared = self._global_batches.get(job_id)
        return self.fits.scaling(job_id, measured, batch, noise, declared[:2] if declared is not None else None)

    def forget_all_but(self, live: Iterable[str]) -> None:
        for gone in set(self._measured) - set(live):
            del self._measured[gone]
            self._hints.pop(gone, None)
            self._global_batches.pop(gone, None)
            self.fits.forget(gone)
