"""Run-time configuration: python -m fastattn info / show_config()."""

import subprocess
import sys

import fastattn
from fastattn import _config


def test_config_reports_isa_threads_and_build():
    c = _config.config()
    assert c["isa"] == fastattn.get_isa()
    assert c["isa"] in c["available_isas"]
    assert c["available_isas"][0] == "generic"
    assert c["threads"] >= 1
    # the build record written by setup.py is found (not "unknown")
    assert c["compiler"] != "unknown" and c["cflags"] != "unknown"
    assert "-march=native" not in c["cflags"]
    if c["openmp"]:
        assert "openmp" in c["cflags"] or "/openmp" in c["cflags"]


def test_info_command_prints_the_configuration():
    r = subprocess.run([sys.executable, "-m", "fastattn", "info"], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    for word in ("ISA path in use", "OpenMP", "threads", "compiler", "flags"):
        assert word in r.stdout
    assert fastattn.get_isa() in r.stdout
