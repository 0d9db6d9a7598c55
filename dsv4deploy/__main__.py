import sys

from dsv4deploy.cli.main import main

sys.exit(main())
