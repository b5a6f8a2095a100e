"""``python -m fuser``: see fuser/cli.py."""
import sys

from fuser.cli import main

sys.exit(main())
