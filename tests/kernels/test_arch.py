"""The target architecture as a dimension of the build: setup.py's reading of
src_c/runtime/isa_list.h (every line's arch known, the target's lines
chosen), the target it finds, and what the built extension says about it
(the ISAs compiled in, the ones this CPU runs, the recorded machine)."""

from __future__ import annotations

import importlib.util
import pathlib
import platform
import sys

import pytest

import fastattn
from fastattn import _config, _core

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def setup_py():
    """setup.py as a module: its helpers, without building (the build runs
    only under __main__)."""
    pytest.importorskip("setuptools", reason="setup.py's helpers import setuptools")
    path = ROOT / "setup.py"
    if not path.exists():
        pytest.skip(f"no setup.py at {ROOT}: the tests run apart from their checkout")
    spec = importlib.util.spec_from_file_location("fastattn_setup_py", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


FAKE_LIST = """\
/* a comment naming FA_ISA(name, NAME, arch, required) is not a line */
FA_ISA(generic, GENERIC, any, 0)
FA_ISA(avx2, AVX2, x86, FA_CPU_X86_AVX2 | FA_OS_X86_YMM)
FA_ISA(neon, NEON, aarch64, FA_CPU_ARM_ASIMD)
FA_ISA(sve, SVE, aarch64, (FA_CPU_ARM_SVE | FA_CPU_ARM_ASIMD))
"""


# ---------------------------------------------------------------------------
# setup.py: the list
# ---------------------------------------------------------------------------

def test_isa_list_of_the_checkout_is_the_extensions_list(setup_py):
    """setup.py reads the same lines, in the same order, as the C enum."""
    text = (ROOT / "src_c" / "runtime" / "isa_list.h").read_text()
    assert tuple(n for n, _ in setup_py.parse_isa_list(text)) == _core.ISA_NAMES


def test_isa_list_parses_every_known_arch(setup_py):
    assert setup_py.parse_isa_list(FAKE_LIST) == [
        ("generic", "any"), ("avx2", "x86"), ("neon", "aarch64"), ("sve", "aarch64")]


@pytest.mark.parametrize("line, message", [
    ("FA_ISA(rvv, RVV, riscv64, FA_CPU_RISCV_V)", r"'rvv' has arch 'riscv64'.*does not know"),
    ("FA_ISA(rvv, RVV, riscv64)", r"expected FA_ISA\(name, NAME, arch, required\)"),
    ("FA_ISA(neon, NEONX, aarch64, 0)", r"NAME must be 'NEON'"),
    ("FA_ISA(avx2, AVX2, x86, 0)", r"each name must appear once"),
], ids=["unknown_arch", "missing_column", "NAME_not_upper_name", "duplicate_name"])
def test_isa_list_bad_line_stops_the_build(setup_py, line, message):
    text = FAKE_LIST + line + "\n"
    with pytest.raises(SystemExit, match=message) as e:
        setup_py.parse_isa_list(text, where="isa_list.h")
    assert str(e.value).startswith("isa_list.h:6:")        # names the file and line


@pytest.mark.parametrize("text", ["", "FA_ISA(avx2, AVX2, x86, 0)\nFA_ISA(generic, GENERIC, any, 0)\n"],
                         ids=["empty", "first_line_not_portable"])
def test_isa_list_without_a_portable_first_line_stops_the_build(setup_py, text):
    with pytest.raises(SystemExit, match="first ISA must be portable"):
        setup_py.parse_isa_list(text)


@pytest.mark.parametrize("machine, names", [
    ("x86_64", ["generic", "avx2"]),
    ("x86", ["generic", "avx2"]),
    ("aarch64", ["generic", "neon", "sve"]),
    ("ppc64le", ["generic"]),
    ("universal2", ["generic"]),
], ids=["x86_64", "x86_32bit", "aarch64", "unknown_machine", "universal2"])
def test_select_isas_takes_the_portable_lines_and_the_targets(setup_py, machine, names):
    lines = setup_py.parse_isa_list(FAKE_LIST)
    assert [n for n, _ in setup_py.select_isas(lines, machine)] == names


def test_every_list_line_has_a_flags_file(setup_py):
    for name in _core.ISA_NAMES:
        assert "cc" in setup_py.read_flags(name) and "msvc" in setup_py.read_flags(name)


# ---------------------------------------------------------------------------
# setup.py: the target
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("spelling, machine", [
    ("x86_64", "x86_64"), ("AMD64", "x86_64"), ("x64", "x86_64"), ("i686", "x86"),
    ("win32", "x86"), ("aarch64", "aarch64"), ("arm64", "aarch64"), ("ARM64", "aarch64"),
    ("ppc64le", "ppc64le"),
])
def test_normalise_machine(setup_py, spelling, machine):
    assert setup_py.normalise_machine(spelling) == machine


@pytest.mark.parametrize("host, machine", [
    ("linux-aarch64", "aarch64"), ("macosx-11.0-arm64", "aarch64"),
    ("macosx-10.9-x86_64", "x86_64"), ("macosx-10.9-universal2", "universal2"),
    ("win-amd64", "x86_64"), ("win-arm64", "aarch64"), ("linux-riscv64", "riscv64"),
])
def test_target_machine_honours_the_cross_build_platform(setup_py, monkeypatch, host, machine):
    """_PYTHON_HOST_PLATFORM (cibuildwheel, crossenv) wins over the compiler,
    whose default target may be the build machine's."""
    monkeypatch.setenv("_PYTHON_HOST_PLATFORM", host)
    got, source = setup_py.target_machine(["cc"], "linux-x86_64")
    assert got == machine and host in source


@pytest.mark.parametrize("arch_flags, machine", [
    (["-arch", "arm64"], "aarch64"), (["-arch", "x86_64"], "x86_64"),
    (["-arch", "arm64", "-arch", "x86_64"], "universal2"),
], ids=["arm64", "x86_64", "two_arches_universal2"])
def test_target_machine_reads_macos_arch_flags(setup_py, monkeypatch, arch_flags, machine):
    monkeypatch.delenv("_PYTHON_HOST_PLATFORM", raising=False)
    assert setup_py.target_machine(["clang", "-O2"] + arch_flags, None)[0] == machine


def test_target_machine_asks_the_compiler(setup_py, monkeypatch):
    """`CC -dumpmachine`: a cross compiler's target, not the build machine's
    (a stand-in compiler prints the triple)."""
    monkeypatch.delenv("_PYTHON_HOST_PLATFORM", raising=False)
    cc = [sys.executable, "-c", "print('aarch64-unknown-linux-gnu')"]
    machine, source = setup_py.target_machine(cc, "linux-x86_64")
    assert machine == "aarch64" and "aarch64-unknown-linux-gnu" in source


def test_target_machine_falls_back_to_the_platform(setup_py, monkeypatch):
    """A compiler that cannot say (MSVC, or -dumpmachine failing): build_ext's platform."""
    monkeypatch.delenv("_PYTHON_HOST_PLATFORM", raising=False)
    failing = [sys.executable, "-c", "raise SystemExit(3)"]
    assert setup_py.target_machine(failing, "win-arm64")[0] == "aarch64"
    assert setup_py.target_machine(None, "win-amd64")[0] == "x86_64"


# ---------------------------------------------------------------------------
# the built extension
# ---------------------------------------------------------------------------

def test_built_isas_are_lines_of_the_list_in_order():
    built = _config.built_isas()
    assert built[0] == _core.ISA_NAMES[0] == "generic"
    assert list(built) == [n for n in _core.ISA_NAMES if n in built]


def test_available_isas_are_built():
    assert set(fastattn.available_isas()) <= set(_config.built_isas())
    assert fastattn.get_isa() in _config.built_isas()


NOT_BUILT = [n for n in _core.ISA_NAMES if n not in _core.BUILT_ISAS] or [pytest.param(
    None, marks=pytest.mark.skip(reason="every line of isa_list.h is built for this target"))]


@pytest.mark.parametrize("name", NOT_BUILT)
def test_isa_of_another_architecture_is_refused(name):
    """A line not built for this target is never supported, nor selectable."""
    before = fastattn.get_isa()
    assert not _core.cpu_supports(name)
    with pytest.raises(ValueError, match="not available"):
        fastattn.set_isa(name)
    assert fastattn.get_isa() == before


def test_build_config_records_this_machine_and_the_isas_built(setup_py):
    from fastattn import _build_config as bc
    assert bc.arch == setup_py.normalise_machine(platform.machine())
    assert bc.isas == _config.built_isas() == tuple(bc.isa_flags)
    text = (ROOT / "src_c" / "runtime" / "isa_list.h").read_text()
    lines = setup_py.parse_isa_list(text)
    chosen = setup_py.select_isas(lines, bc.arch)
    # the ARM test build (FASTATTN_NEON_EMULATION=simde) adds the aarch64 lines
    # that have a simde: flags line (not sve)
    emulated = tuple(n for n, a in lines if a == "aarch64" and "simde" in setup_py.read_flags(n)
                     ) if _core.neon_emulated() else ()
    assert bc.isas == tuple(n for n, _ in chosen) + emulated


def test_show_config_names_the_arch_and_the_isas_built(capsys):
    c = _config.config()
    assert c["arch"] not in ("", "unknown")
    assert c["built_isas"] == list(_config.built_isas())
    fastattn.show_config()
    out = capsys.readouterr().out
    assert f"arch            : {c['arch']}" in out and ", ".join(c["built_isas"]) in out
