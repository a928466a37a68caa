"""What `ringmaster demo` reads from its job's log (`Demo._note`): the counts its acts wait on."""

from __future__ import annotations

import io
import json

from ringmaster.cli.demo import QUICK_PACE, Demo


def _line(kind: str, host: str, **fields: object) -> str:
    """An event line as `ringmaster run --log-format json` writes it."""
    return json.dumps({"logger": "ringmaster.agent", "level": "INFO", "message": kind, "host": host, "time": 1.0,
                       "kind": kind, "generation": None, **fields}) + "\n"


def test_a_lost_host_takes_its_warm_spares_with_it(tmp_path) -> None:
    """The scale-up act waits for warm spares on hostB: spares of a killed agent must not count for
    the agent started after it (they died with it), or the act starts its workers cold."""
    demo = Demo(tmp_path, QUICK_PACE, seed=0, console=io.StringIO())
    for pid in (1, 2):
        demo._note(_line("spare.ready", "hostB", pid=pid, took_s=5.0))
    demo._note(_line("spare.ready", "hostA", pid=3, took_s=5.0))
    assert demo.progress.warm_spares == {"hostB": 2, "hostA": 1}

    demo._note(_line("host.lost", "hostB", reason="closed its connection"))
    assert demo.progress.warm_spares == {"hostB": 0, "hostA": 1}
    demo._note(_line("spare.ready", "hostB", pid=4, took_s=5.0))
    demo._note(_line("agent.launching", "hostB", how="on this machine"))  # (a new agent: none of its own yet)
    assert demo.progress.warm_spares["hostB"] == 0

    for pid in (5, 6):
        demo._note(_line("spare.ready", "hostB", pid=pid, took_s=5.0))
    demo._note(_line("spare.used", "hostB", worker="hostB/7", pid=5, warm=True, age_s=8.0))
    demo._note(_line("spare.used", "hostB", worker="hostB/8", pid=9, warm=False, age_s=1.0))  # (a cold one)
    assert demo.progress.warm_spares == {"hostB": 1, "hostA": 1}
