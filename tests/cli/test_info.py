"""Run-time configuration: python -m fastattn info / show_config()."""

import fastattn
from fastattn import _config, _core
from support import run_python


def test_config_reports_isa_threads_and_build():
    c = _config.config()
    assert c["isa"] == fastattn.get_isa()
    assert c["isa"] in c["available_isas"]
    assert c["available_isas"][0] == _core.ISA_NAMES[0]
    assert c["threads"] >= 1
    # the build record written by setup.py is found (not "unknown")
    assert c["compiler"] != "unknown" and c["cflags"] != "unknown"
    assert "-march=native" not in c["cflags"]
    if c["openmp"]:
        assert "openmp" in c["cflags"] or "/openmp" in c["cflags"]


def test_info_command_prints_the_configuration():
    r = run_python(module="fastattn", argv=["info"], timeout=60)
    for word in ("ISA path in use", "OpenMP", "threads", "compiler", "flags"):
        assert word in r.stdout
    assert fastattn.get_isa() in r.stdout
