"""`python -m ringmaster.worker.agent ...` runs a host agent (`ringmaster agent` does the same)."""

from ringmaster.common.processes import exit_now
from ringmaster.worker.agent.command import main

if __name__ == "__main__":  # (not on an import: the documentation's build inspects every module)
    exit_now(main())
