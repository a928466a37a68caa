"""Warming a host's workers before its agent says hello: a host that joins a running job costs
the others the training script's own start, not Python's and torch's."""

from __future__ import annotations

import time
from typing import Callable

from ringmaster.worker.agent.starting.spare_pool import SparePool
from ringmaster.worker.agent.starting.template import WorkerTemplate

#: The longest an agent warms before it says hello (`--warm-join`): a slow start must not keep a host out.
WARM_JOIN_TIMEOUT_S = 60.0
#: Seconds between two looks at what is warm.
WARM_JOIN_POLL_S = 0.05


def warm_before_joining(template: WorkerTemplate | None, spares: SparePool, slots: int,
                        asked_to_stop: Callable[[], bool]) -> dict[str, object]:
    """Warm the worker template (every worker is forked from it: it alone is warmed), or else a
    spare for every slot, within WARM_JOIN_TIMEOUT_S; `asked_to_stop()` ends it at once. What was
    warm, as the agent's `AGENT_WARM` event says it (an empty dict: nothing to warm)."""
    if template is not None:
        started = time.monotonic()
        while time.monotonic() - started < WARM_JOIN_TIMEOUT_S and not asked_to_stop():
            if template.ready(WARM_JOIN_POLL_S) or not template.usable:
                break
        if template.usable:
            return {"spares": 0, "slots": slots, "template": template.ready(),
                    "took_s": round(time.monotonic() - started, 2)}
    target = max(spares.count, slots)
    if spares.count <= 0:
        return {}
    started = time.monotonic()
    spares.warm_for_join(target)
    while time.monotonic() - started < WARM_JOIN_TIMEOUT_S and not asked_to_stop():
        spares.tend()
        if spares.count <= 0 or spares.warm() >= target:
            break
        time.sleep(WARM_JOIN_POLL_S)  # (spares warm in their own processes: looked at, not waited on)
    return {"spares": spares.warm(), "slots": slots, "template": False, "took_s": round(time.monotonic() - started, 2)}
