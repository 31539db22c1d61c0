"""``python -m bench``; the guard matters: helper processes are spawned and re-import this module."""

import sys

from bench.cli import main

if __name__ == "__main__":
    sys.exit(main())
