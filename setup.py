"""Build the extension fastattn._core from fastattn/_core.pyx and the C sources of src_c/.

* The ISA paths are the FA_ISA(name, NAME, arch, required) lines of
  src_c/runtime/isa_list.h.  The target's machine is found once
  (target_machine: _PYTHON_HOST_PLATFORM, macOS's -arch flags, the
  compiler's -dumpmachine, else the platform), and the lines of arch `any`
  and of the target's architecture (ARCH_OF_MACHINE) are built, the build
  saying which; a line of an arch this file does not know stops the build.
  src_c/kernels/kernels_isa.c is compiled once per ISA built, with
  -DFA_ISA_NAME=<name> and the flags of src_c/simd/<name>.flags (`cc:`
  gcc/clang, `msvc:`); every other .c file under src_c/ is compiled for the
  baseline of the target (no host-specific -march flag), and
  runtime/dispatch.c picks a path at run time.  A target of no known
  architecture (e.g. a universal macOS build) gets the `any` lines only.
* OpenMP is used when the compiler supports it; otherwise the build goes on
  serial, with a warning, and fastattn.show_config() says so.
* FASTATTN_CFLAGS (extra flags for every C file, e.g. the sanitizers) and
  FASTATTN_NO_OPENMP=1 are read from the environment.
* FASTATTN_AVX512_EMULATION=simde makes a test build (CI's sanitizer step):
  the avx512 kernels are compiled for AVX2 (the `simde:` line of avx512.flags)
  with SIMDe (Debian: libsimde-dev) implementing their _mm512 intrinsics, and
  runtime/dispatch.c offers the avx512 path wherever AVX2 runs, so the AVX-512
  kernels are executed and tested on a CPU without AVX-512.  The same build
  emulates the AMX tile and AVX512-BF16 instructions in plain C
  (src_c/simd/bf16_emulate.h, FA_BF16_EMULATED; the `simde:` lines of
  amx.flags and avx512_bf16.flags), and offers the amx and avx512_bf16 paths
  wherever AVX2 runs too.  Slow, and never for a wheel: show_config() says so.
* FASTATTN_NEON_EMULATION=simde makes the ARM test build on x86-64: the lines
  of arch aarch64 that have a `simde:` line in their flags file (neon; not
  sve: SIMDe implements too little of SVE) are compiled too, with that line and SIMDe's <simde/arm/neon.h> (0.8.2 or later: Debian's 0.7.4
  lacks vdivq, vcvtnq and all bfloat16) from FASTATTN_SIMDE_INCLUDE, else from the
  simde-py package (`pip install simde-py`; its get_include()); with
  FA_NEON_EMULATED defined, runtime/arch.h keeps their table slots and
  runtime/dispatch.c offers them wherever AVX2 runs, so the whole suite runs
  the neon kernels (with FMA, so a fused multiply-add rounds as FMLA does).
  A test build only, like the AVX-512 one.
* An extension with no source under src_c/ (e.g. a test-hook module) gets no
  kernels; fastattn/_build_config.py records the target's machine, the ISAs
  built and each one's flags.
* The helpers above the `__main__` block (the list's parsing, the target)
  import without building anything: tests/kernels/test_arch.py checks them.
"""
import os
import platform
import re
import shlex
import subprocess
import sys
import sysconfig
import tempfile
import textwrap
from concurrent.futures import ThreadPoolExecutor

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = "src_c"
ISA_UNIT = os.path.join(SRC, "kernels", "kernels_isa.c")  # compiled once per ISA
ISA_LIST = os.path.join(SRC, "runtime", "isa_list.h")

# The `arch` value of runtime/isa_list.h's lines for each target machine (as
# normalise_machine names it); a machine not here gets the `any` lines only.
# A new architecture: its machine names here (and in MACHINE_ALIASES), and
# runtime/arch.h, runtime/cpu.h and runtime/cpu_<arch>.c on the C side.
ARCH_OF_MACHINE = {"x86_64": "x86", "x86": "x86", "aarch64": "aarch64"}
KNOWN_ARCHES = ("any",) + tuple(sorted(set(ARCH_OF_MACHINE.values())))
# Other spellings of a machine: platform tags (win-amd64), compiler triples
# (arm64-apple-darwin), platform.machine() (AMD64, arm64).
MACHINE_ALIASES = {"amd64": "x86_64", "x64": "x86_64", "i386": "x86", "i486": "x86",
                   "i586": "x86", "i686": "x86", "win32": "x86", "arm64": "aarch64",
                   "arm64e": "aarch64"}


def src_files(*suffixes):
    """Every file under src_c/ with one of the suffixes, sorted, as setup.py-relative paths."""
    found = []
    for root, _, files in os.walk(os.path.join(HERE, SRC)):
        rel = os.path.relpath(root, HERE)
        found += [os.path.join(rel, f) for f in files if f.endswith(suffixes)]
    return sorted(found)


_ISA_LINE = re.compile(r"FA_ISA\(\s*(\w+)\s*,\s*(\w+)\s*,\s*(\w+)\s*,\s*(.*?)\s*\)\s*$")


def parse_isa_list(text, where=ISA_LIST):
    """The lines FA_ISA(name, NAME, arch, required) of isa_list.h's text, as
    [(name, arch)] in order.  Stops (SystemExit) on such a line it cannot read,
    an arch it does not know, NAME not name in upper case, a name given twice,
    or a first line that is not portable (arch any)."""
    isas = []
    for no, line in enumerate(text.splitlines(), 1):
        if not line.startswith("FA_ISA("):
            continue
        m = _ISA_LINE.match(line)
        if not m:
            sys.exit(f"{where}:{no}: expected FA_ISA(name, NAME, arch, required), got {line!r}")
        name, upper, arch = m.group(1, 2, 3)
        if arch not in KNOWN_ARCHES:
            sys.exit(f"{where}:{no}: ISA {name!r} has arch {arch!r}, which setup.py does not "
                     f"know (known: {', '.join(KNOWN_ARCHES)}); a new architecture needs its "
                     "machine names in setup.py's ARCH_OF_MACHINE")
        if upper != name.upper() or name in [n for n, _ in isas]:
            sys.exit(f"{where}:{no}: ISA {name!r}: NAME must be {name.upper()!r} and each "
                     "name must appear once")
        isas.append((name, arch))
    if not isas or isas[0][1] != "any":
        sys.exit(f"{where}: the first ISA must be portable (arch any)")
    return isas


def read_flags(name):
    """src_c/simd/<name>.flags as {'cc': [...], 'msvc': [...], ...}."""
    path = os.path.join(HERE, SRC, "simd", name + ".flags")
    if not os.path.exists(path):
        sys.exit(f"{ISA_LIST}: ISA {name!r} has no flags file {os.path.relpath(path, HERE)}")
    flags = {}
    with open(path) as f:
        for fl in f:
            key, sep, val = fl.partition(":")
            if sep and not key.lstrip().startswith("#"):
                flags[key.strip()] = shlex.split(val)
    return flags


def select_isas(isas, machine):
    """The (name, arch) of isas built for a target machine: arch any, and its own."""
    return [(n, a) for n, a in isas if a == "any" or a == ARCH_OF_MACHINE.get(machine)]


def normalise_machine(name):
    """One spelling per machine: 'AMD64', 'x64' -> 'x86_64'; 'arm64' -> 'aarch64';
    'i686', 'win32' -> 'x86'; any other name lower-cased ('ppc64le')."""
    name = name.strip().lower()
    return MACHINE_ALIASES.get(name, name)


def target_machine(compiler_cmd=None, plat_name=None):
    """(machine, what said so) of the build's target, normalised: from
    _PYTHON_HOST_PLATFORM (cross builds set it: the compiler's default may be
    the host's), else the -arch flags of the compiler command (macOS; two or
    more: 'universal2'), else `compiler -dumpmachine` (gcc, clang: honours
    CC=aarch64-linux-gnu-gcc or --target), else the platform (plat_name:
    build_ext's, e.g. win-arm64 for MSVC; else sysconfig's)."""
    host = os.environ.get("_PYTHON_HOST_PLATFORM")
    if host:
        return normalise_machine(host.rsplit("-", 1)[-1]), f"_PYTHON_HOST_PLATFORM={host}"
    if compiler_cmd:
        flags = " ".join(compiler_cmd)
        arches = {normalise_machine(a) for a in re.findall(r"(?<!\S)-arch\s+(\S+)", flags)}
        if arches:
            one = arches.pop() if len(arches) == 1 else "universal2"
            return one, "the compiler's -arch flags"
        try:
            r = subprocess.run(list(compiler_cmd) + ["-dumpmachine"], capture_output=True,
                               text=True, timeout=60)
            triple = r.stdout.strip()
            if r.returncode == 0 and triple:
                return (normalise_machine(triple.split("-")[0]),
                        f"{compiler_cmd[0]} -dumpmachine: {triple}")
        except (OSError, subprocess.SubprocessError):
            pass
    plat = plat_name or sysconfig.get_platform() or platform.machine()
    return normalise_machine(plat.rsplit("-", 1)[-1]), f"the platform {plat}"


class BuildExt(build_ext):
    def _try_compile(self, flags, link_flags, code):
        with tempfile.TemporaryDirectory() as tmp:
            src = os.path.join(tmp, "t.c")
            with open(src, "w") as f:
                f.write(code)
            try:
                objs = self.compiler.compile([src], output_dir=tmp, extra_postargs=flags)
                self.compiler.link_shared_object(objs, os.path.join(tmp, "t.so"),
                                                 extra_postargs=link_flags)
                return True
            except Exception:
                return False

    def _openmp_flags(self):
        if os.environ.get("FASTATTN_NO_OPENMP") == "1":
            return None
        msvc = self.compiler.compiler_type == "msvc"
        code = "#include <omp.h>\nint f(void){int n=0;\n#pragma omp parallel\n{n=omp_get_num_threads();}\nreturn n;}\n"
        cands = [(["/openmp"], [])] if msvc else [
            (["-fopenmp"], ["-fopenmp"]),
            (["-Xpreprocessor", "-fopenmp"], ["-lomp"]),  # Apple clang + libomp
        ]
        for cflags, lflags in cands:
            if self._try_compile(cflags, lflags, code):
                return cflags, lflags
        return None

    def _target_isas(self):
        """The target's machine and the ISAs built for it, [(name, flags)], said once."""
        msvc = self.compiler.compiler_type == "msvc"
        cmd = None if msvc else getattr(self.compiler, "compiler_so", None)
        machine, source = target_machine(cmd, self.plat_name)
        with open(os.path.join(HERE, ISA_LIST)) as f:
            lines = parse_isa_list(f.read())
        flags = {n: read_flags(n) for n, _ in lines}   # every line's: a missing file stops
        isas = [(n, flags[n]) for n, _ in select_isas(lines, machine)]
        known = "" if machine in ARCH_OF_MACHINE else \
            f"; no architecture of {ISA_LIST}: its portable lines only"
        print(f"fastattn: building ISA tiers for {machine} ({source}{known}): "
              f"{', '.join(n for n, _ in isas)}")
        return machine, isas

    def _neon_emulation(self, machine):
        """FASTATTN_NEON_EMULATION=simde: [(name, flags)] of the aarch64 lines,
        compiled for x86-64 through SIMDe (their `simde:` line and its include
        directory); [] without it."""
        emulation = os.environ.get("FASTATTN_NEON_EMULATION", "")
        if not emulation:
            return []
        if emulation != "simde" or self.compiler.compiler_type == "msvc" or machine != "x86_64":
            sys.exit(f"FASTATTN_NEON_EMULATION={emulation!r}: only 'simde', with gcc or "
                     "clang on x86-64, is supported")
        inc = os.environ.get("FASTATTN_SIMDE_INCLUDE", "")
        if not inc:
            try:
                import simde_py
                inc = simde_py.get_include()
            except ImportError:
                inc = ""
        with open(os.path.join(HERE, ISA_LIST)) as f:
            lines = [n for n, a in parse_isa_list(f.read()) if a == "aarch64"]
        # the lines with a `simde:` flags line (sve has none: SIMDe lacks most
        # of SVE; kernels.h makes a left-out table NULL)
        lines = [n for n in lines if "simde" in read_flags(n)]
        isas = [(n, read_flags(n)["simde"] + ["-I" + inc]) for n in lines]
        code = ("#define SIMDE_ENABLE_NATIVE_ALIASES\n#include <simde/arm/neon.h>\n"
                "float32x4_t f(float32x4_t a)"
                "{return vfmaq_f32(vdivq_f32(a, a), vnegq_f32(a), vrndnq_f32(a));}\n"
                "int32x4_t g(float32x4_t a){return vcvtnq_s32_f32(a);}\n")
        if not inc or not isas or not self._try_compile(isas[0][1], [], code):
            sys.exit(f"FASTATTN_NEON_EMULATION=simde: cannot compile with <simde/arm/neon.h> "
                     f"(include directory {inc or '(none)'}): set FASTATTN_SIMDE_INCLUDE to "
                     "SIMDe >= 0.8.2's, or pip install simde-py")
        print(f"fastattn: emulating {', '.join(lines)} through SIMDe ({inc})")
        return isas

    def _emulation_flags(self, isas):
        """FASTATTN_AVX512_EMULATION=simde: {name: the flags of its `simde:` line}."""
        emulation = os.environ.get("FASTATTN_AVX512_EMULATION", "")
        if not emulation:
            return {}
        simde = {n: f["simde"] for n, f in isas if "simde" in f}
        if emulation != "simde" or self.compiler.compiler_type == "msvc" or not simde:
            sys.exit(f"FASTATTN_AVX512_EMULATION={emulation!r}: only 'simde', with gcc "
                     "or clang on x86-64, is supported")
        if not self._try_compile(list(simde.values())[0], [],
                                 "#define SIMDE_ENABLE_NATIVE_ALIASES\n"
                                 "#include <simde/x86/avx512.h>\nint f(void){return 0;}\n"):
            sys.exit("FASTATTN_AVX512_EMULATION=simde: cannot compile with "
                     "<simde/x86/avx512.h> (Debian/Ubuntu: apt-get install libsimde-dev)")
        return simde

    def build_extensions(self):
        msvc = self.compiler.compiler_type == "msvc"
        extra = shlex.split(os.environ.get("FASTATTN_CFLAGS", ""))
        base = ["/O2"] if msvc else ["-O3", "-std=c99", "-fno-math-errno"]
        omp = self._openmp_flags()
        if omp is None:
            print("WARNING: fastattn: the compiler has no OpenMP; building a serial "
                  "extension (fastattn.show_config() will say so)", file=sys.stderr)
            omp_c, omp_l = [], []
        else:
            omp_c, omp_l = omp
        machine, isas = self._target_isas()
        isa_flags = {n: f.get("msvc" if msvc else "cc", []) for n, f in isas}
        emulation = self._emulation_flags(isas)
        isa_flags.update(emulation)
        neon = self._neon_emulation(machine)
        isas += neon
        isa_flags.update(neon)
        for ext in self.extensions:
            ext.extra_compile_args = base + omp_c + extra
            ext.extra_link_args = omp_l + extra
            # Every C file (the Cython module's, the ISA kernels each with their
            # own flags and macro, the rest of src_c/) is compiled here, in
            # parallel, the slowest first; build_ext then only links.  MSVC
            # initialises itself lazily: one at a time there.  An extension
            # with no source under src_c/ gets no kernels.
            macros = list(ext.define_macros)
            common = [(f, base + omp_c + extra, macros, self.build_temp) for f in ext.sources]
            isa_jobs = []
            if any(os.path.normpath(f).startswith(SRC + os.sep) for f in ext.sources):
                if machine not in ARCH_OF_MACHINE:
                    macros.append(("FA_GENERIC_ONLY", "1"))   # runtime/arch.h
                if emulation:
                    macros.append(("FA_AVX512_EMULATED", "1"))
                    # and the bfloat16 tiers' instructions: simd/bf16_emulate.h
                    macros.append(("FA_BF16_EMULATED", "1"))
                if neon:
                    macros.append(("FA_NEON_EMULATED", "1"))   # runtime/arch.h, dispatch.c
                # The ISA's flags last: an emulation line's -O1 -g0 (simd/*.flags)
                # holds against FASTATTN_CFLAGS' -O or -g.
                isa_jobs = [(ISA_UNIT, base + extra + isa_flags[n], macros + [("FA_ISA_NAME", n)],
                             os.path.join(self.build_temp, "isa_" + n)) for n, _ in isas]
            jobs = common[:1] + isa_jobs + common[1:]

            def compile_one(job):
                src, flags, defs, out = job
                return self.compiler.compile([src], output_dir=out, macros=defs,
                                             include_dirs=ext.include_dirs, extra_postargs=flags)

            workers = 1 if msvc else max(1, min(len(jobs), os.cpu_count() or 1))
            with ThreadPoolExecutor(max_workers=workers) as pool:
                ext.extra_objects = [o for objs in pool.map(compile_one, jobs) for o in objs]
            # build_ext links only an extension whose sources or depends are
            # newer than it: the sources move to depends, so that a changed
            # .pyx (its generated .c) still relinks its module.
            ext.depends = list(ext.depends) + list(ext.sources)
            ext.sources = []
        self._write_build_config(base + omp_c + extra, omp is not None, isa_flags, machine)
        super().build_extensions()

    def _write_build_config(self, flags, openmp, isa_files, machine):
        # isa_files: ISA built -> the flags its kernels were compiled with
        cc = self.compiler.compiler[0] if hasattr(self.compiler, "compiler") else self.compiler.compiler_type
        text = textwrap.dedent(f"""\
            # Generated by setup.py at build time; not part of the sources.
            compiler = {cc!r}
            cflags = {" ".join(flags)!r}
            arch = {machine!r}
            isas = {tuple(isa_files)!r}
            isa_flags = {isa_files!r}
            openmp = {openmp!r}
            """)
        self._config_text = text
        target = os.path.join(self.build_lib, "fastattn", "_build_config.py")
        os.makedirs(os.path.dirname(target), exist_ok=True)
        with open(target, "w") as f:
            f.write(text)

    def copy_extensions_to_source(self):
        # In-place and editable builds: the build record goes beside the extension.
        super().copy_extensions_to_source()
        text = getattr(self, "_config_text", None)
        if text is not None:
            with open(os.path.join(HERE, "fastattn", "_build_config.py"), "w") as f:
                f.write(text)


if __name__ == "__main__":
    import numpy as np
    from Cython.Build import cythonize

    ext = Extension(
        "fastattn._core",
        sources=["fastattn/_core.pyx"] + [f for f in src_files(".c") if f != ISA_UNIT],
        include_dirs=[SRC, np.get_include()],
        define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")],
        depends=src_files(".c", ".h", ".flags"),
    )
    setup(
        ext_modules=cythonize([ext, Extension("fastattn._testing", ["fastattn/_testing.pyx"],
                                              include_dirs=[np.get_include()])],
                              compiler_directives={"language_level": "3"}),
        cmdclass={"build_ext": BuildExt},
    )
