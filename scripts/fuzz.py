"""Long fuzzing run of every reader: the properties of tests/test_fuzz_readers.py with random
seeds and a large budget, round after round until the examples or the minutes are spent.

    python scripts/fuzz.py [--examples N] [--minutes M] [--target caffemodel] [-x]

Each round is one pytest run of the properties with ``--examples`` examples per reader and a
fresh random seed; a failure prints hypothesis' shrunk input (keep it as a regression test in
tests/test_fuzz_readers.py, then fix the reader).
"""
import argparse
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--examples", type=int, default=2000, help="examples per reader and round")
    parser.add_argument("--minutes", type=float, default=0,
                        help="keep running rounds until this many minutes have passed "
                             "(default: one round)")
    parser.add_argument("--target", default="", help="only the readers whose name contains "
                        "this (net_prototxt, solver_prototxt, caffemodel, solverstate, "
                        "binaryproto, lmdb_datum, io_datum, host_file, flags)")
    parser.add_argument("-x", "--stop-first", action="store_true",
                        help="stop at the first failing reader")
    a = parser.parse_args()
    env = dict(os.environ, POSEIDON_FUZZ_PROFILE="long", POSEIDON_FUZZ_EXAMPLES=str(a.examples),
               PYTHONPATH=os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")])))
    args = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
            os.path.join(ROOT, "tests", "test_fuzz_readers.py"),
            "-k", "test_reader_loads_or_names_the_file" + (" and %s" % a.target if a.target
                                                           else "")]
    if a.stop_first:
        args.append("-x")
    deadline = time.time() + a.minutes * 60
    rounds = failed = 0
    while True:
        rounds += 1
        print("round %d: %d examples per reader" % (rounds, a.examples), flush=True)
        rc = subprocess.call(args, cwd=ROOT, env=env)
        if rc:
            failed += 1
            if a.stop_first:
                break
        if time.time() >= deadline:
            break
    print("%d round(s), %d with failures" % (rounds, failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
