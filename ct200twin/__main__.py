"""``python -m ct200twin up|down|status|gpus|hub|ssh``: the twin's own command line (cli.py)."""

import sys

from ct200twin.cli import main

sys.exit(main())
