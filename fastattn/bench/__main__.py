"""``python -m fastattn.bench ARGS`` is ``python -m fastattn bench ARGS``."""

import sys

from .cli import main

sys.exit(main())
