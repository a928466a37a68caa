"""What a worker imports at its start: `import ringmaster.torch` brings torch and Ringmaster's
own modules, not the parts of torch that only jobs of sharded state use (FSDP2, DTensor, DCP:
0.9 s of every worker's start on this machine when `generation_mesh` imported FSDP2's
collectives). `hvd.elastic.ShardedState` brings them on first use."""

from __future__ import annotations

import subprocess
import sys

SHARDED_ONLY = ("torch.distributed.fsdp", "torch.distributed.tensor", "torch.distributed.checkpoint")

PROBE = f"""
import sys
import ringmaster.torch as hvd
hvd.elastic.mesh, hvd.elastic.run, hvd.elastic.TorchState  # (the names a plain elastic script uses)
print(sorted(m for m in sys.modules if m.startswith({SHARDED_ONLY!r})))
hvd.elastic.ShardedState
print(sorted(m for m in sys.modules if m.startswith({SHARDED_ONLY!r}))[:3])
"""


def test_a_plain_worker_imports_no_fsdp2_dtensor_or_dcp_until_it_uses_sharded_state() -> None:
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    before, after = done.stdout.splitlines()
    assert before == "[]", f"imported at a plain worker's start: {before}"
    assert after != "[]"  # (the probe can see them: ShardedState brings them)
