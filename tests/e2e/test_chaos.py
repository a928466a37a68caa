"""A seeded chaos run in CI: one elastic job survives every kind of fault, with nothing lost.

See `tests/chaos.py` for the faults and the checks; `bench/chaos.py` runs the long schedule.
A failure names the seed: `python bench/chaos.py --seed N` replays it.
"""

from __future__ import annotations

import os

import pytest
from chaos import MEMORY_KINDS, ChaosRun, plan_faults

pytestmark = pytest.mark.slow
SEED = int(os.environ.get("RINGMASTER_CHAOS_SEED", "20261123"))


def test_plan_is_seeded_and_covers_every_kind() -> None:
    plan = plan_faults(SEED, MEMORY_KINDS, 9, 4.0)
    assert plan == plan_faults(SEED, MEMORY_KINDS, 9, 4.0)
    assert {p.kind for p in plan[: len(MEMORY_KINDS)]} == set(MEMORY_KINDS)
    assert all(2.0 <= p.after_s <= 6.0 for p in plan)
    assert plan != plan_faults(SEED + 1, MEMORY_KINDS, 9, 4.0)


def test_a_job_survives_a_seeded_schedule_of_faults(tmp_path) -> None:
    run = ChaosRun(tmp_path / "job", SEED, plan_faults(SEED, MEMORY_KINDS, len(MEMORY_KINDS), 2.5), say=print)
    report = run.run()
    print(report.table())
    absorbed = [f for f in report.faults if f.recovery_s is not None]
    assert len(absorbed) == len(report.faults) >= 6, report.table()
    assert {"kill_worker", "kill_host", "stop_worker"} <= {f.kind for f in report.faults}, report.table()
    assert report.steps_kept <= report.steps_computed
