"""`python -m ringmaster.worker.agent ...` runs a host agent (`ringmaster agent` does the same)."""

from ringmaster.cli.agent import main
from ringmaster.worker.agent.processes import exit_now

exit_now(main())
