"""How a Ray job's training call reaches its workers and their results come back.

The executor serializes the training function with its arguments (Ray's cloudpickle: the job's
own code, sent by its own driver through Ray, as Ray sends every task), the node's agent actor
writes it into a private folder, and each worker process loads it from there, calls it (inside,
`import ringmaster.torch as hvd` works as in any worker) and writes what it returned under its
final rank, for the actor to hand back to the driver. Nothing read here comes from outside the
job: the folder is the actor's own (0700).
"""

from __future__ import annotations

import os
import re

#: The worker's environment names the call's file and the folder of results.
CALL_ENV = "RINGMASTER_RAY_CALL"
RESULTS_ENV = "RINGMASTER_RAY_RESULTS"
CALL_FILE = "call.pkl"
#: The largest return value a worker hands back (serialized); larger ones are an error that says so.
MAX_RESULT_BYTES = 256 << 20
_RESULT = re.compile(r"rank-([0-9]{1,7})\.pkl")


def result_files(folder: str, limit: int) -> dict[int, bytes]:
    """rank -> the bytes of its result file in `folder`, for each well-named file within `limit`."""
    out: dict[int, bytes] = {}
    for name in os.listdir(folder):
        match = _RESULT.fullmatch(name)
        path = os.path.join(folder, name)
        if match is None or not os.path.isfile(path) or os.path.getsize(path) > limit:
            continue
        with open(path, "rb") as file:
            out[int(match.group(1))] = file.read(limit + 1)
    return out
