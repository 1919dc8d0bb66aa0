"""Build the extension fastattn._core from fastattn/_core.pyx and the C sources of src_c/.

* The ISA paths are the FA_ISA(name, NAME, arch, required) lines of
  src_c/runtime/isa_list.h.  src_c/kernels/kernels_isa.c is compiled once per
  ISA, with -DFA_ISA_NAME=<name> and the flags of src_c/simd/<name>.flags
  (`cc:` gcc/clang, `msvc:`); every other .c file under src_c/ is compiled
  for the baseline of the target (no host-specific -march flag), and
  runtime/dispatch.c picks a path at run time.  On a non-x86 target only the
  ISAs of arch `any` (generic) are built.
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
* An extension with no source under src_c/ (e.g. a test-hook module) gets no
  kernels; fastattn/_build_config.py records each ISA's flags by ISA name.
"""
import os
import platform
import re
import shlex
import sys
import sysconfig
import tempfile
import textwrap
from concurrent.futures import ThreadPoolExecutor

import numpy as np
from Cython.Build import cythonize
from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = "src_c"
ISA_UNIT = os.path.join(SRC, "kernels", "kernels_isa.c")  # compiled once per ISA


def src_files(*suffixes):
    """Every file under src_c/ with one of the suffixes, sorted, as setup.py-relative paths."""
    found = []
    for root, _, files in os.walk(os.path.join(HERE, SRC)):
        rel = os.path.relpath(root, HERE)
        found += [os.path.join(rel, f) for f in files if f.endswith(suffixes)]
    return sorted(found)


def isa_list():
    """The ISAs of src_c/runtime/isa_list.h: [(name, arch, {'cc': [...], 'msvc': [...], ...})]."""
    isas = []
    with open(os.path.join(HERE, SRC, "runtime", "isa_list.h")) as f:
        for line in f:
            m = re.match(r"FA_ISA\(\s*(\w+)\s*,\s*(\w+)\s*,\s*(\w+)\s*,", line)
            if m:
                name, arch = m.group(1), m.group(3)
                flags = {}
                with open(os.path.join(HERE, SRC, "simd", name + ".flags")) as ff:
                    for fl in ff:
                        key, sep, val = fl.partition(":")
                        if sep and not key.lstrip().startswith("#"):
                            flags[key.strip()] = shlex.split(val)
                isas.append((name, arch, flags))
    if not isas or isas[0][1] != "any":
        sys.exit("src_c/runtime/isa_list.h: the first ISA must be portable (arch any)")
    return isas


def is_x86():
    mach = (os.environ.get("_PYTHON_HOST_PLATFORM") or sysconfig.get_platform() or
            platform.machine()).lower()
    return any(t in mach for t in ("x86_64", "amd64", "i686", "x86", "win32")) and \
        "arm" not in mach and "aarch64" not in mach


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
        x86 = is_x86()
        isas = [(n, f) for n, arch, f in isa_list() if arch == "any" or (arch == "x86" and x86)]
        isa_flags = {n: f.get("msvc" if msvc else "cc", []) for n, f in isas}
        emulation = os.environ.get("FASTATTN_AVX512_EMULATION", "")
        if emulation:
            simde = {n: f["simde"] for n, f in isas if "simde" in f}
            if emulation != "simde" or msvc or not simde:
                sys.exit(f"FASTATTN_AVX512_EMULATION={emulation!r}: only 'simde', with gcc "
                         "or clang on x86-64, is supported")
            if not self._try_compile(list(simde.values())[0], [],
                                     "#define SIMDE_ENABLE_NATIVE_ALIASES\n"
                                     "#include <simde/x86/avx512.h>\nint f(void){return 0;}\n"):
                sys.exit("FASTATTN_AVX512_EMULATION=simde: cannot compile with "
                         "<simde/x86/avx512.h> (Debian/Ubuntu: apt-get install libsimde-dev)")
            isa_flags.update(simde)
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
                if not any(n != "generic" for n, _ in isas):
                    macros.append(("FA_NO_X86_KERNELS", "1"))
                if emulation:
                    macros.append(("FA_AVX512_EMULATED", "1"))
                    # and the bfloat16 tiers' instructions: simd/bf16_emulate.h
                    macros.append(("FA_BF16_EMULATED", "1"))
                isa_jobs = [(ISA_UNIT, base + isa_flags[n] + extra, macros + [("FA_ISA_NAME", n)],
                             os.path.join(self.build_temp, "isa_" + n)) for n, _ in isas]
            jobs = common[:1] + isa_jobs + common[1:]

            def compile_one(job):
                src, flags, defs, out = job
                return self.compiler.compile([src], output_dir=out, macros=defs,
                                             include_dirs=ext.include_dirs, extra_postargs=flags)

            workers = 1 if msvc else max(1, min(len(jobs), os.cpu_count() or 1))
            with ThreadPoolExecutor(max_workers=workers) as pool:
                ext.extra_objects = [o for objs in pool.map(compile_one, jobs) for o in objs]
            ext.sources = []
        self._write_build_config(base + omp_c + extra, omp is not None, isa_flags)
        super().build_extensions()

    def _write_build_config(self, flags, openmp, isa_files):
        # isa_files: ISA -> the flags its kernels were compiled with
        cc = self.compiler.compiler[0] if hasattr(self.compiler, "compiler") else self.compiler.compiler_type
        text = textwrap.dedent(f"""\
            # Generated by setup.py at build time; not part of the sources.
            compiler = {cc!r}
            cflags = {" ".join(flags)!r}
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
