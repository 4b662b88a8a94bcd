"""`python -m sp_dagster.cli`: the same as the `sp-dagster` command."""

import sys

from sp_dagster.cli import main

if __name__ == "__main__":
    sys.exit(main())
