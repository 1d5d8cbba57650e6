"""``python -m holotron.train``: the command line is holotron/train/cli.py."""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
