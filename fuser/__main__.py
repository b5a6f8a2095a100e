"""``python -m fuser``: the command line (fuser/tools/cli.py)."""
import sys

from fuser.tools.cli import main

sys.exit(main())
