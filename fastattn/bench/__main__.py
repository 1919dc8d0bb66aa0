"""``python -m fastattn.bench ARGS`` is ``python -m fastattn bench ARGS``."""

import sys

from .cli import main

if __name__ == "__main__":     # not when a spawned process re-imports it
    sys.exit(main())
