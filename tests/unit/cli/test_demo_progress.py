"""What `ringmaster demo` reads from its job's log (`Demo._note`): the counts its acts wait on."""

from __future__ import annotations

import io
import json

from ringmaster.cli.demo import QUICK_PACE, Demo


def _line(kind: str, host: str, **fields: object) -> str:
    """An event line as `ringmaster run --log-format json` writes it."""
    return json.dumps({"logger": "ringmaster.agent", "level": "INFO", "message": kind, "host": host, "time": 1.0,
                       "kind": kind, "generation": None, **fields}) + "\n"


def test_a_lost_host_takes_its_worker_template_with_it(tmp_path) -> None:
    """The scale-up act waits for hostB's worker template: a killed agent's template must not count
    for the agent started after it (it died with it), or the act starts its workers cold."""
    demo = Demo(tmp_path, QUICK_PACE, seed=0, console=io.StringIO())
    demo._note(_line("template.ready", "hostB", pid=1))
    demo._note(_line("template.ready", "hostA", pid=3))
    assert demo.progress.templates == {"hostB", "hostA"}

    demo._note(_line("host.lost", "hostB", reason="closed its connection"))
    assert demo.progress.templates == {"hostA"}
    demo._note(_line("template.ready", "hostB", pid=4))
    demo._note(_line("agent.launching", "hostB", how="on this machine"))  # (a new agent: none of its own yet)
    assert demo.progress.templates == {"hostA"}
    demo._note(_line("template.ready", "hostB", pid=5))
    demo._note(_line("template.off", "hostA", reason="ended (exit code 3)"))
    assert demo.progress.templates == {"hostB"}
