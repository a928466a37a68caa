"""`python -m ringmaster.worker.agent ...` runs a host agent (`ringmaster agent` does the same)."""

import sys

from ringmaster.cli.agent import main

sys.exit(main())
