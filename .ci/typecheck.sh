#!/usr/bin/env bash
# Type checks, with the [tool.mypy] configuration of pyproject.toml:
#   1. mypy.stubtest: fastattn/_core.pyi and fastattn/_testing.pyi agree with
#      the compiled modules (names, kinds, argument names and defaults);
#   2. mypy --strict on tests/typing_example.py (every public function, used
#      as a strictly typed user would) and on the stubs themselves;
#   3. the example runs.
# Needs the extension built (pip install -e .) and mypy installed.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python}
T0=$SECONDS
"$PY" -c 'import mypy' 2>/dev/null || "$PY" -m pip install -q --disable-pip-version-check mypy
"$PY" -m mypy --version
echo "== stubtest fastattn._core fastattn._testing"
"$PY" -m mypy.stubtest --mypy-config-file pyproject.toml fastattn._core fastattn._testing
echo "== mypy --strict tests/typing_example.py fastattn/_core.pyi fastattn/_testing.pyi"
"$PY" -m mypy --config-file pyproject.toml --strict tests/typing_example.py fastattn/_core.pyi \
    fastattn/_testing.pyi
echo "== run the typing example"
"$PY" tests/typing_example.py > /dev/null
echo "== typecheck.sh: all good in $((SECONDS - T0)) s"
