"""`python -m ringmaster.worker.agent ...` runs a host agent (`ringmaster agent` does the same)."""

from ringmaster.worker.agent.command import main
from ringmaster.common.processes import exit_now

exit_now(main())
