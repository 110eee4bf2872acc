"""Runs pycuda's setup.py with every C++ file of an extension compiled in parallel.

setuptools compiles the sources of one extension one after another (its -j runs whole
extensions in parallel, and nearly all of pycuda's work is in _driver), so this replaces
CCompiler.compile with one that uses $JOBS threads (default: the core count).
Usage, in the unpacked pycuda source: python parallel_setup.py SETUP_ARGUMENTS...
"""
import concurrent.futures
import os
import runpy
import sys

import setuptools  # noqa: F401  (puts setuptools' distutils in place)
from distutils import ccompiler


def parallel_compile(self, sources, output_dir=None, macros=None, include_dirs=None, debug=0,
                     extra_preargs=None, extra_postargs=None, depends=None):
    macros, objects, extra_postargs, pp_opts, build = self._setup_compile(
        output_dir, macros, include_dirs, sources, depends, extra_postargs)
    cc_args = self._get_cc_args(pp_opts, debug, extra_preargs)

    def compile_one(obj):
        if obj in build:
            source, ext = build[obj]
            self._compile(obj, source, ext, cc_args, extra_postargs, pp_opts)

    jobs = int(os.environ.get("JOBS") or os.cpu_count() or 1)
    with concurrent.futures.ThreadPoolExecutor(jobs) as pool:
        list(pool.map(compile_one, objects))
    return objects


if __name__ == "__main__":
    ccompiler.CCompiler.compile = parallel_compile
    sys.argv = ["setup.py"] + sys.argv[1:]
    sys.path.insert(0, os.getcwd())          # setup.py imports aksetup_helper beside it
    runpy.run_path("setup.py", run_name="__main__")
