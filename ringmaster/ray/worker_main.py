"""What each worker of a Ray job runs: `python -m ringmaster.ray.worker_main`.

It loads the training call the node's agent actor wrote (`call`), calls it, and writes what it
returned under the worker's final rank, for the actor to hand back to the driver.
"""

from __future__ import annotations

import os
import sys
import tempfile

from ringmaster.ray.call import CALL_ENV, MAX_RESULT_BYTES, RESULTS_ENV


def _final_rank() -> int:
    """The rank this worker ended with: the library's, if the function started it, else the one
    it was started with (torchrun's RANK)."""
    import ringmaster.torch as hvd

    if hvd.is_initialized():
        return hvd.rank()
    return int(os.environ.get("RANK", "0"))


def _write_result(folder: str, rank: int, data: bytes) -> None:
    """Atomically, so the actor never reads half a result."""
    fd, temporary = tempfile.mkstemp(dir=folder, prefix=".result-")
    with os.fdopen(fd, "wb") as file:
        file.write(data)
    os.replace(temporary, os.path.join(folder, f"rank-{rank}.pkl"))


def main() -> int:
    from ray import cloudpickle

    call_path, results = os.environ.get(CALL_ENV), os.environ.get(RESULTS_ENV)
    if not call_path or not results:
        print(f"ringmaster.ray.worker_main runs only as a worker of ElasticRayExecutor ({CALL_ENV} is not set)",
              file=sys.stderr)
        return 2
    with open(call_path, "rb") as file:
        fn, args, kwargs = cloudpickle.load(file)
    value = fn(*args, **kwargs)
    data = cloudpickle.dumps(value)
    if len(data) > MAX_RESULT_BYTES:
        print(f"ringmaster.ray: the training function returned {len(data)} bytes (serialized); at most "
              f"{MAX_RESULT_BYTES} come back to the driver: return less (write large results to storage)",
              file=sys.stderr)
        return 1
    _write_result(results, _final_rank(), data)
    return 0


if __name__ == "__main__":
    sys.exit(main())
