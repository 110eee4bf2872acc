#!/usr/bin/env python
"""Run BVLC Caffe's own pycaffe test suite, unmodified, against poseidon-caffe.

    python scripts/run_bvlc_pycaffe_tests.py /path/to/caffe [--only test_net.py ...]

Given a checkout of BVLC Caffe, this installs the ``import caffe`` alias into a throwaway
directory (never into your environment), then runs each file of ``python/caffe/test/`` with
pytest (or unittest when pytest is missing) in a scratch working directory, and prints one line
per file. The checkout's own ``python/`` folder is not put on the path, so its compiled pycaffe
is never the one tested; the alias refuses to install where another ``caffe`` is importable.
BVLC's tests import ``six``: install it, or pass ``--extra-path`` with a folder that holds it.
Exit status: 0 when every file run passed.
"""
import argparse
import glob
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_file(test_file, env, cwd, use_pytest):
    if use_pytest:
        cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", test_file]
    else:
        test_dir = os.path.dirname(test_file)
        cmd = [sys.executable, "-m", "unittest", "discover", "-s", test_dir, "-t", test_dir,
               "-p", os.path.basename(test_file)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=cwd)
    output = (proc.stdout + proc.stderr).strip().splitlines()
    summary = [line for line in output if line.strip()][-1:] or ["(no output)"]
    return proc.returncode, summary[0].strip("= "), proc.stdout + proc.stderr


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("caffe_root", help="a BVLC Caffe checkout (holding python/caffe/test)")
    parser.add_argument("--only", nargs="+", default=[],
                        help="test file names to run (default: every test_*.py there)")
    parser.add_argument("--extra-path", action="append", default=[],
                        help="a folder to add to PYTHONPATH (e.g. one holding six)")
    parser.add_argument("--verbose", action="store_true", help="print each file's full output")
    args = parser.parse_args(argv)

    test_dir = os.path.join(os.path.abspath(args.caffe_root), "python", "caffe", "test")
    if not os.path.isdir(test_dir):
        sys.stderr.write("%s has no python/caffe/test folder: give the root of a BVLC Caffe "
                         "checkout\n" % args.caffe_root)
        return 2
    files = sorted(glob.glob(os.path.join(test_dir, "test_*.py")))
    if args.only:
        wanted = {os.path.basename(n) for n in args.only}
        missing = wanted - {os.path.basename(f) for f in files}
        if missing:
            sys.stderr.write("not in %s: %s\n" % (test_dir, ", ".join(sorted(missing))))
            return 2
        files = [f for f in files if os.path.basename(f) in wanted]

    scratch = tempfile.mkdtemp(prefix="bvlc_pycaffe_")
    try:
        alias_dir = os.path.join(scratch, "alias")
        work_dir = os.path.join(scratch, "work")
        os.makedirs(alias_dir)
        os.makedirs(work_dir)
        path = [ROOT, alias_dir] + [os.path.abspath(p) for p in args.extra_path]
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(path), POSEIDON_NO_PROGRESS="1")
        install = subprocess.run([sys.executable, "-m", "poseidon_caffe.cli", "alias",
                                  "install", "--target", alias_dir],
                                 capture_output=True, text=True, env=env, cwd=work_dir)
        if install.returncode != 0:
            sys.stderr.write(install.stderr)
            return 2
        needs_six = any("import six" in open(f).read() for f in files)
        probe = subprocess.run([sys.executable, "-c", "import six"], env=env, cwd=work_dir,
                               capture_output=True) if needs_six else None
        if probe is not None and probe.returncode != 0:
            sys.stderr.write("BVLC's tests import six, which is not importable: pip install six, "
                             "or pass --extra-path with a folder holding it\n")
            return 2
        use_pytest = importlib.util.find_spec("pytest") is not None
        print("BVLC pycaffe tests from %s, through the alias in %s (%s)"
              % (test_dir, alias_dir, "pytest" if use_pytest else "unittest"))
        failed = []
        for test_file in files:
            code, summary, output = run_file(test_file, env, work_dir, use_pytest)
            name = os.path.basename(test_file)
            print("%-36s %s  (%s)" % (name, "PASS" if code == 0 else "FAIL", summary))
            if code != 0:
                failed.append(name)
            if args.verbose or code != 0 and len(files) == 1:
                print(output)
        print("%d of %d files passed%s" % (len(files) - len(failed), len(files),
                                          "; failed: " + ", ".join(failed) if failed else ""))
        return 1 if failed else 0
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
