"""Snapshot sets under real failures: a writer killed between the files of a set, two jobs on one
prefix, a disk that fills up, and the temporaries a killed writer leaves. Every job here is a
real process (the command line, or a script that kills itself with SIGKILL at a chosen write)."""
import errno
import glob
import os
import re
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

from poseidon_caffe import staging
from poseidon_caffe.io import read_net_weights
from poseidon_caffe.proto import caffe_pb2
from poseidon_caffe.solver import prefix_lock

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PY = sys.executable
MPIEXEC = os.path.join(os.path.dirname(PY), "mpiexec")

# random data every forward and a Dropout layer: only a resume that restores the random state
# repeats the uninterrupted run
NET = """
name: "noisy"
layer { name: "data" type: "DummyData" top: "data" top: "label"
  dummy_data_param { shape { dim: 8 dim: 5 } shape { dim: 8 }
    data_filler { type: "gaussian" std: 1 } data_filler { type: "constant" value: 1 } } }
layer { name: "ip1" type: "InnerProduct" bottom: "data" top: "ip1"
  inner_product_param { num_output: 6 weight_filler { type: "gaussian" std: 0.3 }
                        bias_filler { type: "constant" value: 0.1 } } }
layer { name: "drop" type: "Dropout" bottom: "ip1" top: "ip1" dropout_param { dropout_ratio: 0.3 } }
layer { name: "ip2" type: "InnerProduct" bottom: "ip1" top: "ip2"
  inner_product_param { num_output: 3 weight_filler { type: "gaussian" std: 0.3 } } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip2" bottom: "label" top: "loss" }
"""

# trains the solver given, SIGKILLing itself at iteration 10 just before the second file of
# the set that follows the model: whichever order the files go in, the set is left half made
KILLED_BETWEEN_FILES = """
import os, signal, sys
from poseidon_caffe.solver import get_solver, snapshot
written = []
def dying(write):
    def wrapped(path, *args, **kwargs):
        if "_iter_10." in path:
            written.append(path)
            if len(written) == 2:
                os.kill(os.getpid(), signal.SIGKILL)
        return write(path, *args, **kwargs)
    return wrapped
snapshot.write_state = dying(snapshot.write_state)
snapshot.write_rngstate = dying(snapshot.write_rngstate)
get_solver(sys.argv[1]).solve()
"""

# trains the solver given and SIGKILLs itself in the middle of its first snapshot file: its
# temporary is written, not yet renamed
KILLED_MID_FILE = """
import os, signal, sys
from poseidon_caffe.solver import get_solver
os.fsync = lambda fd: os.kill(os.getpid(), signal.SIGKILL)
get_solver(sys.argv[1]).solve()
"""

ENV = dict(os.environ, POSEIDON_NO_PROGRESS="1", PYTHONPATH=REPO)


def write_job(folder, name, max_iter, snapshot=5, prefix=None):
    """<folder>/net.prototxt and <folder>/<name>_solver.prototxt (seeded, snapshots every
    ``snapshot`` iterations under ``prefix``, by default <folder>/<name>); the solver's path."""
    os.makedirs(str(folder), exist_ok=True)
    net = os.path.join(str(folder), "net.prototxt")
    with open(net, "w") as f:
        f.write(NET)
    solver = os.path.join(str(folder), "%s_solver.prototxt" % name)
    with open(solver, "w") as f:
        f.write('net: "%s" base_lr: 0.05 momentum: 0.9 lr_policy: "step" gamma: 0.5 '
                'stepsize: 4 max_iter: %d snapshot: %d snapshot_prefix: "%s" random_seed: 1701\n'
                % (net, max_iter, snapshot, prefix or os.path.join(str(folder), name)))
    return solver


def cli(*args, timeout=120):
    return subprocess.run([PY, "-m", "poseidon_caffe.cli"] + list(args), capture_output=True,
                          text=True, timeout=timeout, env=ENV)


def run_script(source, *args):
    return subprocess.run([PY, "-c", source] + list(args), capture_output=True, text=True,
                          timeout=120, env=ENV)


def weights(path):
    return read_net_weights(str(path))[1]


def assert_same_weights(a, b):
    wa, wb = weights(a), weights(b)
    assert sorted(wa) == sorted(wb)
    for name in wa:
        for x, y in zip(wa[name], wb[name]):
            np.testing.assert_array_equal(x, y)


def warnings_in(stderr):
    return [line for line in stderr.splitlines() if line.startswith("W")]


def newest_solver_state(prefix):
    """The solver state of the highest iteration on disk: what a user resumes from."""
    found = glob.glob(prefix + "_iter_*.solverstate")
    return max(found, key=lambda p: int(re.search(r"_iter_(\d+)\.solverstate$", p).group(1)))


# -- a set is made in one order: the solver state last -----------------------------------------
def test_a_kill_between_the_files_of_a_set_leaves_only_sets_that_resume_exactly(tmp_path):
    straight = write_job(tmp_path, "straight", 15)
    assert cli("train", "-solver=" + straight).returncode == 0
    killed = write_job(tmp_path, "killed", 15)
    died = run_script(KILLED_BETWEEN_FILES, killed)
    assert died.returncode == -signal.SIGKILL, died.stderr[-2000:]
    assert os.path.exists(tmp_path / "killed_iter_10.caffemodel")

    # resumed from the newest solver state on disk, it ends where the uninterrupted run does
    state = newest_solver_state(str(tmp_path / "killed"))
    resumed = cli("train", "-solver=" + killed, "-snapshot=" + state)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert_same_weights(tmp_path / "killed_iter_15.caffemodel",
                        tmp_path / "straight_iter_15.caffemodel")
    # because iteration 10's set, left incomplete, had no solver state to resume from
    assert state.endswith("killed_iter_5.solverstate")
    assert warnings_in(resumed.stderr) == []


def test_a_set_that_lost_its_side_file_warns_once_but_a_caffe_snapshot_resumes_quietly(tmp_path):
    ours = write_job(tmp_path / "ours", "snap", 10)
    assert cli("train", "-solver=" + ours).returncode == 0
    os.remove(str(tmp_path / "ours" / "snap_iter_10.rngstate"))
    longer = write_job(tmp_path / "ours", "snap", 12)
    resumed = cli("train", "-solver=" + longer,
                  "-snapshot=%s" % (tmp_path / "ours" / "snap_iter_10.solverstate"))
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    [line] = warnings_in(resumed.stderr)
    assert "snap_iter_10.solverstate is incomplete" in line
    assert "%s is missing" % (tmp_path / "ours" / "snap_iter_10.rngstate") in line
    assert "will not repeat an uninterrupted one" in line

    # Caffe's snapshot: the same model and a solver state by Caffe's rules, no side file at all
    caffe_dir = tmp_path / "caffe"
    caffe_dir.mkdir()
    model = caffe_dir / "lenet_iter_10.caffemodel"
    model.write_bytes((tmp_path / "ours" / "snap_iter_5.caffemodel").read_bytes())
    state = caffe_pb2.SolverState()
    state.ParseFromString((tmp_path / "ours" / "snap_iter_5.solverstate").read_bytes())
    state.iter = 10
    state.learned_net = str(model)
    (caffe_dir / "lenet_iter_10.solverstate").write_bytes(state.SerializeToString())
    solver = write_job(caffe_dir, "lenet", 12)
    resumed = cli("train", "-solver=" + solver,
                  "-snapshot=%s" % (caffe_dir / "lenet_iter_10.solverstate"))
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert warnings_in(resumed.stderr) == []
    assert "No lenet_iter_10.rngstate beside" in resumed.stderr


# -- one job per prefix --------------------------------------------------------------------------
def start_train(solver, *extra):
    return subprocess.Popen([PY, "-m", "poseidon_caffe.cli", "train", "-solver=" + solver]
                            + list(extra), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True, env=ENV)


def wait_for(path, proc, seconds=60):
    deadline = time.monotonic() + seconds
    while not glob.glob(path):
        assert proc.poll() is None, proc.stderr.read()[-2000:]
        assert time.monotonic() < deadline, "no %s after %d s" % (path, seconds)
        time.sleep(0.05)


def test_a_second_job_on_a_prefix_is_refused_and_a_killed_jobs_resume_is_not(tmp_path):
    prefix = str(tmp_path / "shared")
    first = write_job(tmp_path, "first", 10 ** 7, snapshot=2, prefix=prefix)
    second = write_job(tmp_path, "second", 20, snapshot=2, prefix=prefix)
    job = start_train(first)
    try:
        wait_for(prefix + "_iter_*.solverstate", job)
        refused = cli("train", "-solver=" + second)
        assert refused.returncode == 1
        errors = [line for line in refused.stderr.splitlines() if line.startswith("E")]
        assert len(errors) == 1, refused.stderr[-2000:]
        assert ("snapshot prefix '%s' is in use by another job (host %s, pid %d; lock file %s.lock)"
                % (prefix, socket.gethostname(), job.pid, prefix)) in errors[0]
        assert "Iteration" not in refused.stderr           # it trained nothing
        assert job.poll() is None                          # and the first job goes on
    finally:
        job.send_signal(signal.SIGKILL)
        job.wait(timeout=30)
        job.stderr.close()

    # the dead job's lock file stays, but holds nobody: its resume goes ahead
    state = newest_solver_state(prefix)
    it = int(re.search(r"_iter_(\d+)\.", state).group(1))
    resume = write_job(tmp_path, "resume", it + 2, snapshot=2, prefix=prefix)
    resumed = cli("train", "-solver=" + resume, "-snapshot=" + state)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert os.path.exists("%s_iter_%d.solverstate" % (prefix, it + 2))


# holds a snapshot prefix's lock as a job's snapshot writer does, until killed
HOLDER = """
import sys, time
from poseidon_caffe.solver import prefix_lock
prefix_lock.claim(sys.argv[1])
print("holding", flush=True)
time.sleep(600)
"""


@pytest.mark.mpi
def test_a_distributed_job_is_refused_at_start_and_only_rank_0_takes_the_prefix(tmp_path):
    prefix = str(tmp_path / "dist")
    solver = write_job(tmp_path, "dist", 4, snapshot=2, prefix=prefix)
    args = [MPIEXEC, "-n", "2", PY, "-m", "poseidon_caffe.cli", "train", "-solver=" + solver,
            "-ranks_per_host=1"]
    holder = subprocess.Popen([PY, "-c", HOLDER, prefix], stdout=subprocess.PIPE, text=True,
                              env=ENV)
    try:
        assert holder.stdout.readline() == "holding\n"
        refused = subprocess.run(args, capture_output=True, text=True, timeout=180, env=ENV)
        assert refused.returncode != 0
        assert ("snapshot prefix '%s' is in use by another job (host %s, pid %d;"
                % (prefix, socket.gethostname(), holder.pid)) in refused.stderr
        assert not glob.glob(prefix + "_iter_*")
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=30)
        holder.stdout.close()
    # the holder was killed -9: nothing holds the prefix now, and both ranks of the job run
    # on it (rank 1 takes no lock, or rank 0's would refuse it)
    ran = subprocess.run(args, capture_output=True, text=True, timeout=180, env=ENV)
    assert ran.returncode == 0, ran.stderr[-3000:]
    assert os.path.exists(prefix + "_iter_4.solverstate")
    assert os.path.exists(prefix + "_iter_4.rank1.rngstate")

    # a set that lost rank 1's side file resumes with one warning naming it
    os.remove(prefix + "_iter_4.rank1.rngstate")
    longer = write_job(tmp_path, "longer", 6, snapshot=2, prefix=prefix)
    resumed = subprocess.run([MPIEXEC, "-n", "2", PY, "-m", "poseidon_caffe.cli", "train",
                              "-solver=" + longer, "-ranks_per_host=1",
                              "-snapshot=%s_iter_4.solverstate" % prefix],
                             capture_output=True, text=True, timeout=180, env=ENV)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    [line] = warnings_in(resumed.stderr)
    assert "%s_iter_4.rank1.rngstate is missing" % prefix in line


# -- a full disk -----------------------------------------------------------------------------
@pytest.fixture
def small_disk(tmp_path):
    """A tmpfs of ``pages`` pages at tmp_path/disk (root only); unmounted afterwards."""
    mounted = []

    def mount(pages):
        where = tmp_path / "disk"
        where.mkdir()
        size = pages * os.sysconf("SC_PAGE_SIZE")
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=%d" % size, "tmpfs",
                               str(where)], capture_output=True, text=True)
        if done.returncode != 0:
            pytest.skip("cannot mount a small tmpfs here (%s)" % done.stderr.strip())
        mounted.append(where)
        return where
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    yield mount
    for where in mounted:
        subprocess.run(["umount", "-l", str(where)], check=False)


def test_a_full_disk_names_the_file_the_iteration_and_the_set_to_resume_from(tmp_path,
                                                                             small_disk):
    # room for the lock file and one set of three small files: the second set cannot be made
    disk = small_disk(4)
    prefix = str(disk / "snap")
    solver = write_job(tmp_path, "full", 15, snapshot=5, prefix=prefix)
    done = cli("train", "-solver=" + solver)
    assert done.returncode == 1
    errors = [line for line in done.stderr.splitlines() if line.startswith("E")]
    assert len(errors) == 1, done.stderr[-2000:]
    assert errors[0].endswith(
        "Iteration 10: the snapshot was not written (cannot write %s_iter_10.caffemodel: No "
        "space left on device); the last complete snapshot set to resume from is "
        "%s_iter_5.solverstate" % (prefix, prefix))
    assert "Traceback" not in done.stderr
    # the set named is whole, and nothing half-written is left beside it
    assert sorted(os.listdir(str(disk))) == ["snap.lock", "snap_iter_5.caffemodel",
                                             "snap_iter_5.rngstate", "snap_iter_5.solverstate"]


# -- what a killed writer leaves -------------------------------------------------------------
def test_the_next_snapshot_removes_a_killed_writers_temporaries_of_any_iteration(tmp_path):
    killed = write_job(tmp_path, "snap", 5)
    died = run_script(KILLED_MID_FILE, killed)
    assert died.returncode == -signal.SIGKILL, died.stderr[-2000:]
    [left] = [n for n in os.listdir(str(tmp_path)) if n.endswith(".tmp")]
    assert left.startswith(".snap_iter_5.caffemodel.p")

    # beside it: a running writer's temporary, and a dead writer's of another prefix
    host = staging._host()
    sleeper = subprocess.Popen([PY, "-c", "import time; time.sleep(120)"])
    try:
        running = ".snap_iter_7.caffemodel.p%d-0a0b-%s.tmp" % (sleeper.pid, host)
        other = ".other_iter_5.caffemodel.p%d-0c0d-%s.tmp" % (died_pid(left), host)
        for name in (running, other):
            (tmp_path / name).write_bytes(b"partial")
        # the next job snapshots another iteration (3) under the same prefix
        again = write_job(tmp_path, "snap", 3, snapshot=3)
        assert cli("train", "-solver=" + again).returncode == 0
        hidden = sorted(n for n in os.listdir(str(tmp_path)) if n.startswith("."))
        assert hidden == sorted([running, other])
    finally:
        sleeper.kill()
        sleeper.wait()


def died_pid(temporary):
    return int(re.search(r"\.p(\d+)-", temporary).group(1))


def test_without_flock_a_live_holder_on_this_host_keeps_the_prefix_and_a_dead_one_does_not(
        tmp_path, monkeypatch):
    def no_flock(fd, operation):
        raise OSError(errno.ENOLCK, "No locks available")
    monkeypatch.setattr(prefix_lock.fcntl, "flock", no_flock)
    prefix = str(tmp_path / "nfs")
    sleeper = subprocess.Popen([PY, "-c", "import time; time.sleep(120)"])
    try:
        with open(prefix + ".lock", "w") as f:
            f.write("host %s pid %d\n" % (socket.gethostname(), sleeper.pid))
        with pytest.raises(prefix_lock.PrefixInUse, match="pid %d" % sleeper.pid):
            prefix_lock.claim(prefix)
    finally:
        sleeper.kill()
        sleeper.wait()
    key = prefix_lock.claim(prefix)              # its holder is dead now: taken over
    try:
        assert prefix_lock.holder(prefix + ".lock") == (socket.gethostname(), os.getpid())
        assert prefix_lock.claim(prefix) == key  # a second solver of this process shares it
        prefix_lock.release(key)
    finally:
        prefix_lock.release(key)
