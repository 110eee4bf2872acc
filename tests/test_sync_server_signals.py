"""A Ctrl-C to a job with a dedicated parameter-server rank: the workers stop at one iteration
and snapshot; the server, which the workers tell, is not ended by the signal itself (its death
would make the launcher end the job with an error)."""
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from test_sync_stop import ENV, snapshot_sets, write_solver

pytestmark = pytest.mark.mpi

PY = sys.executable
MPIEXEC = os.path.join(os.path.dirname(PY), "mpiexec")


# "auto" gives the server nothing to do (it waits for the end); "ps" serves every blob; the
# job without a server is the reference
@pytest.mark.parametrize("sync", ["auto", "ps", "no server"])
def test_ctrl_c_with_a_dedicated_server_stops_the_job_cleanly(tmp_path, sync):
    solver = write_solver(tmp_path, "job", 10 ** 6)
    err = open(tmp_path / "job.err", "w")
    ranks = ["-n", "2"] if sync == "no server" else ["-n", "3"]
    extra = [] if sync == "no server" else ["-server_ranks=1", "-sync=%s" % sync]
    proc = subprocess.Popen([MPIEXEC] + ranks + [PY, "-m", "poseidon_caffe.cli", "train",
                             "-solver=%s" % solver, "-output_dir=%s" % (tmp_path / "out")]
                            + extra,
                            stdout=subprocess.DEVNULL, stderr=err, env=ENV,
                            start_new_session=True)
    try:
        for _ in range(1200):
            if re.search(r"Iteration 10 \(", (tmp_path / "job.err").read_text()):
                break
            assert proc.poll() is None, (tmp_path / "job.err").read_text()[-3000:]
            time.sleep(0.05)
        os.killpg(proc.pid, signal.SIGINT)           # a Ctrl-C in the job's terminal
        code = proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        err.close()
    text = (tmp_path / "job.err").read_text()
    assert code == 0, text[-3000:]
    assert "Optimization stopped early." in text
    assert "killed by signal" not in text
    sets = snapshot_sets(tmp_path)
    assert len(sets) == 1, sets
    it, names = next(iter(sets.items()))
    assert "job_iter_%d.solverstate" % it in names
