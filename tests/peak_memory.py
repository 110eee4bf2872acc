"""The peak resident memory of a command, its own: started by a small Python process that
reports the command's rusage. Linux carries the high-water mark of the memory a process
replaces at exec into its peak, so a command forked straight from the test process (which
can hold gigabytes by then) would report the test process's peak, not its own."""
import json
import os
import subprocess
import sys

MEASURE = r"""
import json, os, subprocess, sys
with open(sys.argv[1], "w") as err:
    proc = subprocess.Popen(sys.argv[3:], stdout=subprocess.DEVNULL, stderr=err)
    _, status, usage = os.wait4(proc.pid, 0)
with open(sys.argv[2], "w") as out:
    json.dump({"code": os.waitstatus_to_exitcode(status), "maxrss_kib": usage.ru_maxrss}, out)
"""


def run_measuring_peak(argv, cwd, env=None):
    """(exit code, stderr text, peak resident MiB) of ``argv`` run in ``cwd``."""
    err, out = os.path.join(str(cwd), "stderr.txt"), os.path.join(str(cwd), "peak.json")
    subprocess.run([sys.executable, "-c", MEASURE, err, out] + list(argv), cwd=str(cwd),
                   env=env, check=True, timeout=600)
    with open(out) as f:
        result = json.load(f)
    with open(err) as f:
        text = f.read()
    return result["code"], text, result["maxrss_kib"] / 1024
