"""`python -m ringmaster.cli ...` is the `ringmaster` command."""

import sys

from ringmaster.cli.main import main

sys.exit(main())
