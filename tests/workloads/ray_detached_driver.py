"""A Ray driver that starts a detached Ringmaster job and waits for its result.

`python ray_detached_driver.py ADDRESS NAME LOG_PATH STEPS STORE [CHECKPOINT_DIR]`: the tests kill it
while it waits (the job must go on without it) and follow the job by name from another driver.
"""

from __future__ import annotations

import logging
import sys

import ray
import ray_training

from ringmaster.ray import ElasticRayExecutor


def main() -> int:
    address, name, log_path, steps, store = sys.argv[1:6]
    checkpoint_dir = sys.argv[6] if len(sys.argv) > 6 else None
    ray.init(address=address, logging_level=logging.WARNING)
    executor = ElasticRayExecutor(min_workers=2, max_workers=2, detached=True, name=name, store=store,
                                  checkpoint_dir=checkpoint_dir, checkpoint_every=10 if checkpoint_dir else None)
    executor.start()
    print("submitted", flush=True)
    results = executor.run(ray_training.train, kwargs={"log_path": log_path, "until_size": 2,
                                                       "steps_at_size": int(steps)})
    print("results", len(results), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
