"""Build the one extension, fastattn._core, from fastattn/_core.pyx and src_c/*.c.

* The ISA kernels (src_c/kernels_avx2.c, kernels_avx512.c) are compiled alone,
  each with its own -m flags; everything else is compiled for the baseline
  of the target (no host-specific -march flag), and dispatch.c picks a path at run
  time.  On a non-x86 target only the generic kernels are built.
* OpenMP is used when the compiler supports it; otherwise the build goes on
  serial, with a warning, and fastattn.show_config() says so.
* FASTATTN_CFLAGS (extra flags for every C file, e.g. the sanitizers) and
  FASTATTN_NO_OPENMP=1 are read from the environment.
* FASTATTN_AVX512_EMULATION=simde makes a test build (CI's sanitizer step):
  kernels_avx512.c is compiled for AVX2 with SIMDe (Debian: libsimde-dev)
  implementing its _mm512 intrinsics, and dispatch.c offers the avx512 path
  wherever AVX2 runs, so the AVX-512 kernels are executed and tested on a
  CPU without AVX-512.  Slow, and never for a wheel: show_config() says so.
"""
import os
import platform
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
COMMON_SOURCES = ["attention.c", "softmax.c", "dispatch.c", "kernels_generic.c"]
ISA_SOURCES = {  # file -> (gcc/clang flags, MSVC flags)
    "kernels_avx2.c": (["-mavx2", "-mfma"], ["/arch:AVX2"]),
    "kernels_avx512.c": (["-mavx512f", "-mavx2", "-mfma"], ["/arch:AVX512"]),
}
# -O1: SIMDe under -O3 and the sanitizers takes minutes to compile (a test build)
SIMDE_FLAGS = ["-mavx2", "-mfma", "-DFA_AVX512_SIMDE", "-Wno-psabi", "-O1"]


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
        isa_sources = dict(ISA_SOURCES) if is_x86() else {}
        emulation = os.environ.get("FASTATTN_AVX512_EMULATION", "")
        if emulation:
            if emulation != "simde" or msvc or not isa_sources:
                sys.exit(f"FASTATTN_AVX512_EMULATION={emulation!r}: only 'simde', with gcc "
                         "or clang on x86-64, is supported")
            if not self._try_compile(SIMDE_FLAGS, [], "#define SIMDE_ENABLE_NATIVE_ALIASES\n"
                                     "#include <simde/x86/avx512.h>\nint f(void){return 0;}\n"):
                sys.exit("FASTATTN_AVX512_EMULATION=simde: cannot compile with "
                         "<simde/x86/avx512.h> (Debian/Ubuntu: apt-get install libsimde-dev)")
            isa_sources["kernels_avx512.c"] = (SIMDE_FLAGS, [])
            for ext in self.extensions:
                ext.define_macros.append(("FA_AVX512_EMULATED", "1"))
        for ext in self.extensions:
            if not isa_sources:
                ext.define_macros.append(("FA_NO_X86_KERNELS", "1"))
            ext.extra_compile_args = base + omp_c + extra
            ext.extra_link_args = omp_l + extra
            # Every C file (the Cython module's, the ISA kernels each with their
            # own flags, the rest of src_c/) is compiled here, in parallel, the
            # slowest first; build_ext then only links.  MSVC initialises
            # itself lazily: one at a time there.
            common = [(f, base + omp_c + extra) for f in ext.sources]
            # The ISA kernels go only where the rest of src_c/ goes (not into
            # fastattn._testing, which reaches _core's copy by cimport).
            with_c_lib = any(os.path.dirname(f) == SRC for f in ext.sources)
            jobs = common[:1] + [(os.path.join(SRC, f), base + (m if msvc else g) + extra)
                                 for f, (g, m) in isa_sources.items() if with_c_lib] + common[1:]

            def compile_one(job, ext=ext):
                return self.compiler.compile(
                    [job[0]], output_dir=self.build_temp, macros=ext.define_macros,
                    include_dirs=ext.include_dirs, extra_postargs=job[1])

            workers = 1 if msvc else max(1, min(len(jobs), os.cpu_count() or 1))
            with ThreadPoolExecutor(max_workers=workers) as pool:
                ext.extra_objects = [o for objs in pool.map(compile_one, jobs) for o in objs]
            ext.sources = []
        self._write_build_config(base + omp_c + extra, omp is not None,
                                 {f: (m if msvc else g) for f, (g, m) in isa_sources.items()})
        super().build_extensions()

    def _write_build_config(self, flags, openmp, isa_files):
        # isa_files: kernel file -> the flags it was compiled with
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
    sources=["fastattn/_core.pyx"] + [os.path.join(SRC, f) for f in COMMON_SOURCES],
    include_dirs=[SRC, np.get_include()],
    define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")],
    depends=[os.path.join(SRC, f) for f in os.listdir(os.path.join(HERE, SRC))],
)

setup(
    ext_modules=cythonize([ext, Extension("fastattn._testing", ["fastattn/_testing.pyx"],
                                          include_dirs=[np.get_include()])],
                          compiler_directives={"language_level": "3"}),
    cmdclass={"build_ext": BuildExt},
)
