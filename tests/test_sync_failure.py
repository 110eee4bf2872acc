"""A rank that dies ends the whole job quickly with an error naming the rank, its host and the
cause; the last snapshot then resumes the run to completion."""
import glob
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from poseidon_caffe.launch.command import build_command

from jobs import SMALL_CONV_NET

pytestmark = pytest.mark.mpi          # every test here runs mpiexec


def write_job(tmp_path, max_iter):
    (tmp_path / "net.prototxt").write_text(SMALL_CONV_NET)
    solver = tmp_path / "solver.prototxt"
    solver.write_text('net: "%s"\nbase_lr: 0.01 momentum: 0.9 lr_policy: "fixed" display: 0\n'
                      'max_iter: %d snapshot: 5 snapshot_prefix: "%s" random_seed: 3\n'
                      % (tmp_path / "net.prototxt", max_iter, tmp_path / "snap"))
    return str(solver)


def command(tmp_path, solver, snapshot=""):
    hosts = [(0, "127.0.0.1", 9999)]
    return build_command(hosts, [0, 1], solver, snapshot=snapshot, use_gpu=False,
                                  python=sys.executable, out_dir=str(tmp_path / "out"))


def test_killed_rank_ends_the_job_with_its_name_and_the_snapshot_resumes(tmp_path):
    solver = write_job(tmp_path, 1000000)
    env = dict(os.environ, POSEIDON_NO_PROGRESS="1")
    # the job's output goes to files: a pipe nobody reads would stall it
    out, err_file = open(tmp_path / "job.out", "w"), open(tmp_path / "job.err", "w")
    job = subprocess.Popen(command(tmp_path, solver), stdout=out, stderr=err_file, env=env)
    try:
        log1 = tmp_path / "out" / "caffe.rank1.log"
        for _ in range(600):
            if glob.glob(str(tmp_path / "snap_iter_10.solverstate")):
                break
            assert job.poll() is None, (tmp_path / "job.err").read_text()[-2000:]
            time.sleep(0.1)
        pid = int(re.search(r"pid (\d+)", log1.read_text()).group(1))
        os.kill(pid, signal.SIGKILL)
        job.wait(timeout=60)
    finally:
        if job.poll() is None:
            job.kill()
        out.close()
        err_file.close()
    err = (tmp_path / "job.err").read_text()
    assert job.returncode != 0
    assert re.search(r"rank 1 on host \S+ \(pid %d\) was killed by signal 9 \(SIGKILL\)" % pid,
                     err), err[-2000:]

    # resume from the newest snapshot and run five more iterations
    states = sorted(glob.glob(str(tmp_path / "snap_iter_*.solverstate")),
                    key=lambda p: int(re.search(r"_iter_(\d+)\.", p).group(1)))
    last = states[-1]
    it = int(re.search(r"_iter_(\d+)\.", last).group(1))
    solver = write_job(tmp_path, it + 5)
    done = subprocess.run(command(tmp_path, solver, snapshot=last), capture_output=True,
                          text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Resuming from %s" % last in done.stderr
    assert os.path.exists(str(tmp_path / ("snap_iter_%d.caffemodel" % (it + 5))))


RAISER = r'''
import sys, types
from mpi4py import MPI
from google.protobuf import text_format
from poseidon_caffe import sync
from poseidon_caffe.proto import caffe_pb2
from poseidon_caffe.solver import get_solver
sp = caffe_pb2.SolverParameter()
text_format.Merge('base_lr: 0.01 lr_policy: "fixed" display: 0 max_iter: 100', sp)
text_format.Merge(open(sys.argv[1]).read(), sp.net_param)
solver = get_solver(sp)
runner = sync.attach(solver, types.SimpleNamespace(ranks_per_host=1))
solver.step(3)
if MPI.COMM_WORLD.rank == 1:
    raise RuntimeError("disk full while reading a batch")
solver.step(100)
'''


def test_rank_that_raises_ends_the_job_naming_rank_host_and_cause(tmp_path):
    (tmp_path / "net.prototxt").write_text(SMALL_CONV_NET)
    script = tmp_path / "raiser.py"
    script.write_text(RAISER)
    mpiexec = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    proc = subprocess.run([mpiexec, "-n", "2", sys.executable, str(script),
                           str(tmp_path / "net.prototxt")], capture_output=True, text=True,
                          timeout=120, env=dict(os.environ, POSEIDON_NO_PROGRESS="1"))
    assert proc.returncode != 0
    assert re.search(r"rank 1 on host \S+ \(pid \d+\) failed in training: RuntimeError: disk "
                     r"full while reading a batch", proc.stderr), proc.stderr[-2000:]


# -- a rank that stops answering (SIGSTOP: a stuck driver, a frozen host) ----------------------
STALL_TIMEOUT = 5          # POSEIDON_SYNC_TIMEOUT of these jobs, in seconds


def write_endless_job(tmp_path):
    (tmp_path / "net.prototxt").write_text(SMALL_CONV_NET)
    solver = tmp_path / "solver.prototxt"
    solver.write_text('net: "%s"\nbase_lr: 0.01 lr_policy: "fixed" display: 0\n'
                      'max_iter: 1000000 snapshot: 0 random_seed: 3\n' % (tmp_path / "net.prototxt"))
    return str(solver)


def gone(pid):
    """Whether process ``pid`` has ended (a zombie nobody has reaped yet has)."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def stall_rank_1(job, log_dir, tmp_path):
    """Once both ranks train, stop rank 1's worker with SIGSTOP (it stays alive, holding its
    connections, and answers nothing); wait for the job to end. Returns (pid, job's stderr)."""
    logs = [log_dir / ("caffe.rank%d.log" % r) for r in (0, 1)]
    for _ in range(1200):
        if all(p.exists() and "Starting Optimization" in p.read_text() for p in logs):
            break
        assert job.poll() is None, (tmp_path / "job.err").read_text()[-2000:]
        time.sleep(0.1)
    time.sleep(1)                  # some iterations in
    pid = int(re.search(r"Worker rank 1 of 2 on host \S+ \(pid (\d+)\)",
                        logs[1].read_text()).group(1))
    os.kill(pid, signal.SIGSTOP)
    try:
        # a bound for a hang, not a speed figure: the job ends within the timeout plus moments
        job.wait(timeout=60)
    finally:
        if job.poll() is None:
            job.kill()
            job.wait()
        if not gone(pid):
            os.kill(pid, signal.SIGKILL)
    return pid, (tmp_path / "job.err").read_text()


def check_stall_report(job, pid, err):
    assert job.returncode != 0
    # the rank that waited names the one it waited for, and the job is torn down
    assert re.search(r"\*\*\* rank 0 on host \S+ \(pid \d+\) failed in the communication "
                     r"thread: SyncTimeout: .*: no answer within %d s from rank 1 \(host 0, "
                     r"\S+\); ending the job" % STALL_TIMEOUT, err), err[-3000:]
    for _ in range(100):
        if gone(pid):
            break
        time.sleep(0.1)
    assert gone(pid)


def test_a_stopped_rank_ends_the_job_naming_it(tmp_path):
    solver = write_endless_job(tmp_path)
    env = dict(os.environ, POSEIDON_NO_PROGRESS="1", POSEIDON_SYNC_TIMEOUT=str(STALL_TIMEOUT))
    with open(tmp_path / "job.out", "w") as out, open(tmp_path / "job.err", "w") as err:
        job = subprocess.Popen(command(tmp_path, solver), stdout=out, stderr=err, env=env)
        pid, text = stall_rank_1(job, tmp_path / "out", tmp_path)
    check_stall_report(job, pid, text)


RUN_LOCAL_SCRIPT = """import sys
sys.path.insert(0, %r)
solver = %r
devices = [0, 1]
dataset = "small"
use_gpu = False
if __name__ == "__main__":
    from poseidon_caffe.tools.launch import run_local_script
    sys.exit(run_local_script(globals(), %r))
"""


def test_a_stopped_rank_ends_a_run_local_job_naming_it(tmp_path):
    solver = write_endless_job(tmp_path)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    script = tmp_path / "run_local.py"
    script.write_text(RUN_LOCAL_SCRIPT % (root, solver, str(tmp_path)))
    (tmp_path / "hosts").write_text("0 127.0.0.1 9999\n")
    env = dict(os.environ, POSEIDON_NO_PROGRESS="1", POSEIDON_SYNC_TIMEOUT=str(STALL_TIMEOUT))
    with open(tmp_path / "job.out", "w") as out, open(tmp_path / "job.err", "w") as err:
        job = subprocess.Popen([sys.executable, str(script), str(tmp_path / "hosts")],
                               stdout=out, stderr=err, env=env, cwd=str(tmp_path))
        pid, text = stall_rank_1(job, tmp_path / "output" / "caffe.small.S0.M1.T2" / "logs.0",
                                 tmp_path)
    check_stall_report(job, pid, text)


# a net whose InnerProduct weights (144 x 2000) are updated on the sync engine's worker thread,
# and a learning rate that makes the loss NaN at iteration 1
NAN_NET = SMALL_CONV_NET.replace("num_output: 3", "num_output: 2000")


def test_a_nan_loss_on_two_ranks_is_reported_alone(tmp_path):
    (tmp_path / "net.prototxt").write_text(NAN_NET)
    solver = tmp_path / "solver.prototxt"
    solver.write_text('net: "%s"\nbase_lr: 1e30 lr_policy: "fixed" display: 0 max_iter: 50\n'
                      'random_seed: 3\n' % (tmp_path / "net.prototxt"))
    proc = subprocess.run(command(tmp_path, str(solver)), capture_output=True, text=True,
                          timeout=120, env=dict(os.environ, POSEIDON_NO_PROGRESS="1"))
    assert proc.returncode != 0
    assert "Iteration 1: the loss is nan" in proc.stderr, proc.stderr[-3000:]
    # the ranks leaving end the job; the engine's threads add nothing of their own
    reports = [line for line in proc.stderr.splitlines() if line.startswith("***")]
    assert reports and all("exited before the job finished" in line for line in reports), \
        proc.stderr[-3000:]
    assert "failed in the communication thread" not in proc.stderr
