#!/usr/bin/env python
"""``python bench/run.py ARGS`` is ``python -m fastattn bench ARGS``.

See bench/README.md.  The benchmark itself lives in fastattn/bench/ so
that it ships with the installed package.
"""

import os
import sys

try:
    from fastattn.bench import main
except ImportError:
    # Not installed: fall back to the source tree next to this script.
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from fastattn.bench import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
