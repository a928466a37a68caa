"""`python -m ringmaster.cli ...` is the `ringmaster` command."""

import sys

from ringmaster.cli.main import main

if __name__ == "__main__":  # (not on an import: the documentation's build inspects every module)
    sys.exit(main())
