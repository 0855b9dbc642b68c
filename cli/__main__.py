"""`python -m cli`: the `nebula` command."""

import sys

from cli.main import main

sys.exit(main())
