import sys

from dsv4deploy.preflight.cli import main

sys.exit(main())
