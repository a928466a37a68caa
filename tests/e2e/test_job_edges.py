"""Bad input at a job's edges, as a careless or hostile user gives it: arguments that are not
UTF-8 (a shell passes any bytes), on `ringmaster run` and through a pool; a job whose own command
fails, which must not take the pool's hosts out. Real pools, rendezvous, agents and workers."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest
from harness import wait_for
from pool_rig import AUTH, Pool

pytestmark = pytest.mark.slow

#: Writes its arguments' bytes (as the OS gave them) to the file named first, hex-encoded.
ARGV_SCRIPT = """
import os, sys
with open(sys.argv[1], "w") as f:
    f.write(" ".join(os.fsencode(a).hex() for a in sys.argv[2:]))
"""


def _answers(url: str) -> bool:
    try:
        urllib.request.urlopen(url, timeout=2).close()
    except urllib.error.HTTPError:
        return True
    except OSError:
        return False
    return True


def test_an_argument_that_is_not_utf8_reaches_the_worker_as_the_same_bytes(run_job, tmp_path) -> None:
    script, out = tmp_path / "argv.py", tmp_path / "argv.txt"
    script.write_text(ARGV_SCRIPT)
    job = run_job("-np", "1", "python", script, out, "caf\udce9", "plain")  # (b"caf\xe9", as sys.argv holds it)
    assert job.wait(120) == 0, job.output
    assert out.read_text() == " ".join(b.hex() for b in (b"caf\xe9", b"plain"))


def test_a_pool_job_with_such_an_argument_runs_one_that_cannot_be_one_is_refused_no_host_taken_out(
        run_job, tmp_path) -> None:
    pool = Pool(run_job, tmp_path, "-H", "hA:1")
    script, out = tmp_path / "argv.py", tmp_path / "argv.txt"
    script.write_text(ARGV_SCRIPT)
    failing = pool.call("/jobs", {"command": ["python", "-c", "import time; time.sleep(4); raise SystemExit(3)"],
                                  "min_np": 1})["id"]
    api = pool.wait_job(failing, lambda j: j["state"] == "running" and j["api_url"], 120, "the job's API")["api_url"]
    pool.wait_job(failing, lambda j: j["state"] == "failed", 120, "the failing job to fail")
    # its rendezvous and control API end with it, not later
    wait_for(lambda: not _answers(f"{api}/healthz"), 10, "the failed job's control API to close")
    job = pool.call("/jobs", {"command": ["python", str(script), str(out), "caf\udce9"], "min_np": 1})["id"]
    pool.wait_job(job, lambda j: j["state"] == "succeeded", 120, "the job to run on the same host")
    assert out.read_text() == b"caf\xe9".hex()
    assert not pool.proc.events("pool.host_blacklisted")
    request = urllib.request.Request(f"{pool.url}/jobs", method="POST", headers={**AUTH,
                                                                                 "Content-Type": "application/json"},
                                     data=json.dumps({"command": ["python", "\ud800"], "min_np": 1}).encode())
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=10)
    assert refused.value.code == 422
    assert "command[1]" in refused.value.read().decode()
    assert len(pool.call("/jobs")) == 2  # (no third job)
