"""The pool's Prometheus metrics (`GET /metrics` of the pool's API): its slots and how they are
used, its jobs by state, the queue and how long jobs waited, and per job (labelled `job`,
`queue`) its size and bounds, steps/s and resizes. Read from the pool at each scrape; one registry
per pool. Each job's own metrics stay on its own control API (`api_url` in `ringmaster jobs`).
"""

from __future__ import annotations

import collections
import time
from typing import Callable, Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector

from ringmaster.rendezvous.pool.service import PoolService
from ringmaster.rendezvous.pool.table import ENDED, LIVE

#: Buckets of the histogram of waits (seconds from submission to first start).
WAIT_BUCKETS = (1.0, 5.0, 15.0, 60.0, 300.0, 900.0, 3600.0, 4 * 3600.0, 24 * 3600.0)


class PoolMetrics(Collector):
    def __init__(self, pool: PoolService, clock: Callable[[], float] = time.time) -> None:
        self.pool = pool
        self.clock = clock
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self)

    def render(self) -> bytes:
        return generate_latest(self.registry)

    def collect(self) -> Iterator:
        pool, now = self.pool, self.clock()
        usable = pool.pool_hosts.usable_hosts(now)
        live = pool.table.live()
        used = sum(n for job in live for h, n in job.placement.items() if h in usable)
        total = sum(usable.values())
        slots = GaugeMetricFamily("ringmaster_pool_slots", "The pool's slots: usable (on hosts not blacklisted), used "
                                                           "by "
                                  "jobs, free, and on blacklisted hosts", labels=["state"])
        for state, value in (("usable", total), ("used", used), ("free", max(0, total - used)),
                             ("blacklisted", sum(n for h, n in pool.pool_hosts.hosts.items() if h not in usable))):
            slots.add_metric([state], value)
        yield slots
        yield GaugeMetricFamily("ringmaster_pool_utilisation", "Used slots over usable slots (0 to 1)",
                                value=used / total if total else 0.0)
        states = collections.Counter(job.state for job in pool.table.jobs.values())
        jobs = GaugeMetricFamily("ringmaster_pool_jobs", "The pool's jobs by state (ended ones: those still "
                                                         "remembered)",
                                 labels=["state"])
        for state in (*LIVE, *ENDED):
            jobs.add_metric([state], states.get(state, 0))
        yield jobs
        waiting = [job for job in live if job.state in ("queued", "suspended")]
        yield GaugeMetricFamily("ringmaster_pool_queue_length", "Jobs waiting for slots (queued or suspended)",
                                value=len(waiting))
        yield GaugeMetricFamily("ringmaster_pool_oldest_wait_seconds", "How long the job waiting longest has waited",
                                value=max((now - job.submitted for job in waiting if job.state == "queued"),
                                          default=0.0))
        waits = sorted(job.started_at - job.submitted for job in pool.table.jobs.values() if job.started_at is not None)
        buckets, count = [], 0
        for bound in WAIT_BUCKETS:
            while count < len(waits) and waits[count] <= bound:
                count += 1
            buckets.append((str(bound), count))
        buckets.append(("+Inf", len(waits)))
        yield HistogramMetricFamily("ringmaster_pool_wait_seconds", "From submission to a job's first start",
                                    buckets=buckets, sum_value=sum(waits))
        size = GaugeMetricFamily("ringmaster_pool_job_size", "Slots a job holds", labels=["job", "queue"])
        bounds = GaugeMetricFamily("ringmaster_pool_job_bound", "A job's --min-np and --max-np", labels=["job",
                                                                                                         "queue",
                                                                                                         "bound"])
        rate = GaugeMetricFamily("ringmaster_pool_job_steps_per_second", "A running job's committed steps per second",
                                 labels=["job", "queue"])
        resizes = CounterMetricFamily("ringmaster_pool_job_resizes", "Times the pool changed a job's size (starts, "
                                      "resizes, suspensions)", labels=["job", "queue"])
        for job in live:
            size.add_metric([job.id, job.queue], job.size)
            bounds.add_metric([job.id, job.queue, "min"], job.min_np)
            bounds.add_metric([job.id, job.queue, "max"], job.max_np)
            resizes.add_metric([job.id, job.queue], len(job.sizes))
            lease = pool.leases.get(job.id)
            steps = lease.server.metrics.steps_per_second() if lease is not None and lease.server.metrics else None
            if steps is not None:
                rate.add_metric([job.id, job.queue], steps)
        yield from (size, bounds, rate, resizes)
