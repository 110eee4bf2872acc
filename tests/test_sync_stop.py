"""One stop for the whole job, in real two-rank mpiexec runs on loopback: a stop or snapshot
signal sent to one rank, to mpiexec, to the launcher, or as a Ctrl-C to the terminal's process
group becomes the same action on both ranks at the same iteration. The job writes one
consistent snapshot set and exits 0, and resuming from it ends with the weights of the run that
never stopped. A rank that cannot write its part of a snapshot ends the job naming itself."""
import glob
import os
import re
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from poseidon_caffe.io import read_net_weights
from poseidon_caffe.solver.snapshot import read_state
from poseidon_caffe.launch.command import build_command

PY = sys.executable

NET = """name: "stop"
layer { name: "data" type: "DummyData" top: "data" top: "target"
  dummy_data_param { shape { dim: 4 dim: 1 dim: 6 dim: 6 } shape { dim: 4 dim: 3 }
    data_filler { type: "gaussian" std: 1 } data_filler { type: "gaussian" std: 1 } } }
layer { name: "conv" type: "Convolution" bottom: "data" top: "conv"
  convolution_param { num_output: 2 kernel_size: 3 weight_filler { type: "xavier" } } }
layer { name: "drop" type: "Dropout" bottom: "conv" top: "conv"
  dropout_param { dropout_ratio: 0.3 } }
layer { name: "ip" type: "InnerProduct" bottom: "conv" top: "ip"
  inner_product_param { num_output: 3 weight_filler { type: "xavier" } } }
layer { name: "loss" type: "EuclideanLoss" bottom: "ip" bottom: "target" top: "loss" }
"""

# a hang would end in the sync timeout with status 1: keep it short so a failure is quick
ENV = dict(os.environ, POSEIDON_NO_PROGRESS="1", POSEIDON_SYNC_TIMEOUT="60")


def write_solver(tmp_path, prefix, max_iter):
    if not (tmp_path / "net.prototxt").exists():
        (tmp_path / "net.prototxt").write_text(NET)
    solver = tmp_path / ("%s_solver.prototxt" % prefix)
    solver.write_text('net: "%s"\nbase_lr: 0.01 momentum: 0.9 weight_decay: 0.001\n'
                      'lr_policy: "fixed" display: 5 random_seed: 11 max_iter: %d\n'
                      'snapshot_prefix: "%s"\n'
                      % (tmp_path / "net.prototxt", max_iter, tmp_path / prefix))
    return str(solver)


def command(tmp_path, solver, snapshot="", out="out", staleness=0):
    return build_command([(0, "127.0.0.1", 9999)], [0, 1], solver, snapshot=snapshot,
                                  use_gpu=False, python=PY, out_dir=str(tmp_path / out),
                                  staleness=staleness)


def plain_run(args):
    """Run the launcher's command to its end, without the rank supervisor (its start-up costs
    a second per rank and changes nothing in the training)."""
    supervise = [PY, "-m", "poseidon_caffe.tools.supervise", "--"]
    plain = []
    while args:
        if args[:4] == supervise:
            args = args[4:]
            continue
        plain.append(args.pop(0))
    done = subprocess.run(plain, capture_output=True, text=True, timeout=120, env=ENV)
    assert done.returncode == 0, done.stderr[-3000:]


class Job:
    """A long run (max_iter far away) whose output goes to files, started in a session of its
    own so that signalling its process group plays a Ctrl-C."""

    def __init__(self, tmp_path, args):
        self.tmp_path = tmp_path
        self.stdout = open(tmp_path / "job.out", "w")
        self.stderr = open(tmp_path / "job.err", "w")
        self.proc = subprocess.Popen(args, stdout=self.stdout, stderr=self.stderr, env=ENV,
                                     start_new_session=True)

    def err(self):
        return (self.tmp_path / "job.err").read_text()

    def rank_log(self, rank):
        # the launcher puts each client's logs in a folder of its own below the output folder
        paths = sorted(self.tmp_path.glob("**/caffe.rank%d.log" % rank))
        return paths[0].read_text() if paths else ""

    def wait_for(self, pattern, ranks=(0, 1)):
        for _ in range(1200):
            if all(re.search(pattern, self.rank_log(r)) for r in ranks):
                return
            assert self.proc.poll() is None, self.err()[-3000:]
            time.sleep(0.05)
        raise AssertionError("no %r in the rank logs" % pattern)

    def training(self):
        self.wait_for(r"Iteration 10 \(")

    def rank_pid(self, rank):
        return int(re.search(r"Worker rank %d of 2 on host \S+ \(pid (\d+)\)" % rank,
                             self.rank_log(rank)).group(1))

    def finish(self):
        try:
            self.proc.wait(timeout=120)
        finally:
            if self.proc.poll() is None:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
            self.stdout.close()
            self.stderr.close()
        return self.proc.returncode


def snapshot_sets(tmp_path, prefix="job"):
    """{iteration: sorted file names} of every snapshot file with ``prefix``."""
    sets = {}
    for path in glob.glob(str(tmp_path / ("%s_iter_*" % prefix))):
        name = os.path.basename(path)
        it = int(re.match(r"%s_iter_(\d+)\." % prefix, name).group(1))
        sets.setdefault(it, []).append(name)
    return {it: sorted(names) for it, names in sets.items()}


def assert_consistent(tmp_path, it, prefix="job"):
    """The whole set of iteration ``it``: model, solver state naming it, and every rank's
    random and data-cursor state."""
    stem = "%s_iter_%d" % (prefix, it)
    assert snapshot_sets(tmp_path, prefix)[it] == sorted(
        [stem + ".caffemodel", stem + ".solverstate", stem + ".rngstate",
         stem + ".rank1.rngstate"])
    state_it, learned, _, _ = read_state(str(tmp_path / (stem + ".solverstate")))
    assert state_it == it and learned.endswith(stem + ".caffemodel")


def stopped_and_resumed(tmp_path, job, code, snapshots=1):
    """Check the stop (status 0, both ranks stopped at one iteration, one set per snapshot),
    then resume it for 3 iterations and compare with a run that never stopped."""
    err = job.err()
    assert code == 0, err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    for rank in (0, 1):
        assert "Optimization stopped early." in job.rank_log(rank)
    sets = snapshot_sets(tmp_path)
    assert len(sets) == snapshots, sets
    for it in sets:
        assert_consistent(tmp_path, it)
    # rank 1's file is named by its own iteration: both ranks stopped after the same one
    last = max(sets)
    resumed = write_solver(tmp_path, "job", last + 3)
    plain_run(command(tmp_path, resumed, snapshot=str(tmp_path / (
        "job_iter_%d.solverstate" % last)), out="out_resumed"))
    plain_run(command(tmp_path, write_solver(tmp_path, "straight", last + 3),
                      out="out_straight"))
    _, a = read_net_weights(str(tmp_path / ("job_iter_%d.caffemodel" % (last + 3))))
    _, b = read_net_weights(str(tmp_path / ("straight_iter_%d.caffemodel" % (last + 3))))
    _, stopped = read_net_weights(str(tmp_path / ("job_iter_%d.caffemodel" % last)))
    for name in ("conv", "ip"):
        for x, y, s in zip(a[name], b[name], stopped[name]):
            np.testing.assert_array_equal(x, y)
            assert not np.array_equal(x, s)       # the resumed run trained on
    return last


def start(tmp_path, through_launcher=False):
    solver = write_solver(tmp_path, "job", 10 ** 6)
    if through_launcher:
        (tmp_path / "localserver").write_text("0 127.0.0.1 9999\n")
        args = [PY, "-m", "poseidon_caffe.tools.launch", "--solver", solver, "--hostfile",
                str(tmp_path / "localserver"), "--devices", "0,1", "--output_root",
                str(tmp_path / "runs")]
        job = Job(tmp_path, args)
        # the launcher names the output folder after Poseidon's convention
        job.out = tmp_path / "runs" / "caffe.data.S0.M1.T2"
        return job
    return Job(tmp_path, command(tmp_path, solver))


@pytest.mark.mpi
def test_sigint_to_one_rank_stops_both_at_the_same_iteration(tmp_path):
    job = start(tmp_path)
    job.training()
    os.kill(job.rank_pid(1), signal.SIGINT)
    stopped_and_resumed(tmp_path, job, job.finish())


@pytest.mark.mpi
def test_with_staleness_both_ranks_still_stop_after_the_same_iteration(tmp_path):
    # the answer is read staleness + 1 boundaries later; weights of a stale-synchronous run
    # depend on timing, so only the stop itself is compared
    job = Job(tmp_path, command(tmp_path, write_solver(tmp_path, "job", 10 ** 6), staleness=2))
    job.training()
    os.kill(job.rank_pid(0), signal.SIGINT)
    assert job.finish() == 0, job.err()[-3000:]
    for rank in (0, 1):
        assert "Optimization stopped early." in job.rank_log(rank)
    (it,) = snapshot_sets(tmp_path)
    assert_consistent(tmp_path, it)


@pytest.mark.mpi
def test_a_stop_during_a_long_test_pass_ends_it(tmp_path):
    solver = write_solver(tmp_path, "job", 10 ** 6)
    with open(solver, "a") as f:
        f.write("test_iter: 1000000 test_interval: 1000\n")   # the pass at iteration 0
    job = Job(tmp_path, command(tmp_path, solver))
    job.wait_for(r"Iteration 0, Testing net \(#0\)")
    time.sleep(0.5)
    job.proc.send_signal(signal.SIGINT)
    assert job.finish() == 0, job.err()[-3000:]
    for rank in (0, 1):
        assert "Test interrupted." in job.rank_log(rank)
        assert "Optimization stopped early." in job.rank_log(rank)
    assert list(snapshot_sets(tmp_path)) == [0]
    assert_consistent(tmp_path, 0)


@pytest.mark.mpi
def test_sigint_to_mpiexec_stops_the_job_with_one_snapshot(tmp_path):
    job = start(tmp_path)
    job.training()
    job.proc.send_signal(signal.SIGINT)
    stopped_and_resumed(tmp_path, job, job.finish())


@pytest.mark.mpi
def test_sighup_then_sigint_to_the_launcher_snapshot_then_stop(tmp_path):
    job = start(tmp_path, through_launcher=True)
    job.training()
    job.proc.send_signal(signal.SIGHUP)       # passed on as SIGUSR1: snapshot, go on
    job.wait_for(r"Snapshotting solver state", ranks=(0,))
    first = min(snapshot_sets(tmp_path))
    job.wait_for(r"Iteration %d \(" % ((first // 5 + 2) * 5))     # and trains on
    job.proc.send_signal(signal.SIGINT)
    last = stopped_and_resumed(tmp_path, job, job.finish(), snapshots=2)
    assert first < last
    assert "KeyboardInterrupt" not in job.err()


@pytest.mark.mpi
def test_ctrl_c_to_the_launchers_process_group(tmp_path):
    job = start(tmp_path, through_launcher=True)
    job.training()
    os.killpg(job.proc.pid, signal.SIGINT)
    stopped_and_resumed(tmp_path, job, job.finish())


@pytest.mark.mpi
def test_signals_half_a_second_apart_on_different_ranks(tmp_path):
    job = start(tmp_path)
    job.training()
    os.kill(job.rank_pid(1), signal.SIGHUP)       # a snapshot, and on
    time.sleep(0.5)
    os.kill(job.rank_pid(0), signal.SIGINT)       # a stop
    stopped_and_resumed(tmp_path, job, job.finish(), snapshots=2)


@pytest.mark.mpi
def test_a_second_sigint_after_the_stop_changes_nothing(tmp_path):
    job = start(tmp_path)
    job.training()
    pids = [job.rank_pid(0), job.rank_pid(1)]
    os.kill(pids[1], signal.SIGINT)
    time.sleep(0.5)
    try:
        os.kill(pids[0], signal.SIGINT)
    except ProcessLookupError:
        pass                                      # rank 0 had already finished
    assert job.finish() == 0, job.err()[-3000:]
    (it,) = snapshot_sets(tmp_path)
    assert_consistent(tmp_path, it)


FAKE_MPIEXEC = r"""
import os, signal, sys, time
record = open(sys.argv[1], "a")
def note(signum, frame):
    record.write(signal.Signals(signum).name + "\n")
    record.flush()
    if signum == signal.SIGTERM:
        sys.exit(7)
for sig in (signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGTERM):
    signal.signal(sig, note)
record.write("group %d of %d, stdin %r\n" % (os.getpgid(0), os.getpid(), sys.stdin.read()))
record.flush()
while True:
    time.sleep(0.05)
"""


def test_launcher_forwards_signals_and_exits_with_the_commands_status(tmp_path):
    """SIGHUP goes on as SIGUSR1 (MPICH's mpiexec passes that on, and dies of SIGHUP), SIGINT
    and SIGTERM as they are; the command runs in a process group of its own with no input."""
    (tmp_path / "fake.py").write_text(FAKE_MPIEXEC)
    record = tmp_path / "record"
    code = ("import sys; from poseidon_caffe.launch.launcher import run; "
            "sys.exit(run(%r))" % [PY, str(tmp_path / "fake.py"), str(record)])
    proc = subprocess.Popen([PY, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        for sig, seen in ((None, 1), (signal.SIGHUP, 2), (signal.SIGINT, 3),
                          (signal.SIGTERM, 4)):
            if sig is not None:
                proc.send_signal(sig)
            for _ in range(400):
                if record.exists() and len(record.read_text().splitlines()) >= seen:
                    break
                time.sleep(0.05)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    lines = record.read_text().splitlines()
    group, pid = re.match(r"group (\d+) of (\d+), stdin ''", lines[0]).groups()
    assert group == pid
    assert lines[1:] == ["SIGUSR1", "SIGINT", "SIGTERM"]
    assert proc.returncode == 7, err
    assert "Traceback" not in err


COUNTING_WORKER = r"""
import os, signal, sys, time
signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGUSR1])
out = open(os.path.join(sys.argv[1], "rank%s" % os.environ["PMI_RANK"]), "w")
out.write("ready, parent %d\n" % os.getppid())
out.flush()
end = time.monotonic() + 30
while time.monotonic() < end:
    got = signal.sigtimedwait([signal.SIGUSR1], 0.1)   # each delivery, not a pending flag
    if got is not None:
        out.write("from %d\n" % got.si_pid)
        out.flush()
        end = min(end, time.monotonic() + 2)             # time for a second one to come
"""


@pytest.mark.mpi
def test_a_signal_to_mpiexec_reaches_each_worker_once(tmp_path):
    """MPICH's proxy signals each rank's process group and the supervisor passes the signal
    on: the worker, in a group of its own, gets it once, from its supervisor."""
    (tmp_path / "worker.py").write_text(COUNTING_WORKER)
    mpiexec = os.path.join(os.path.dirname(PY), "mpiexec")
    proc = subprocess.Popen([mpiexec, "-n", "2", PY, "-m", "poseidon_caffe.tools.supervise",
                             "--", PY, str(tmp_path / "worker.py"), str(tmp_path)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        records = [tmp_path / "rank0", tmp_path / "rank1"]
        for _ in range(600):
            if all(r.exists() and r.read_text().startswith("ready") for r in records):
                break
            time.sleep(0.05)
        proc.send_signal(signal.SIGUSR1)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    for record in records:
        lines = record.read_text().splitlines()
        assert len(lines) == 2, lines
        supervisor = re.match(r"ready, parent (\d+)$", lines[0]).group(1)
        assert lines[1] == "from " + supervisor


@pytest.mark.mpi
def test_rank_that_cannot_write_its_snapshot_file_ends_the_job_naming_itself(tmp_path):
    job = start(tmp_path)
    job.training()
    # a folder where rank 1's file of any iteration would go cannot be replaced by a file
    for it in range(10 ** 4):
        os.mkdir(tmp_path / ("job_iter_%d.rank1.rngstate" % it))
    os.kill(job.rank_pid(0), signal.SIGINT)
    code = job.finish()
    err = job.err()
    assert code != 0
    pattern = (r"rank 1 on host \S+ \(pid %d\) failed in writing the snapshot file (\S+)"
               % job.rank_pid(1))
    found = re.search(pattern, err)
    assert found, err[-3000:]
    assert re.search(r"job_iter_\d+\.rank1\.rngstate", found.group(1))
    # rank 0 wrote no solver state: nothing names an incomplete set
    assert not glob.glob(str(tmp_path / "job_iter_*.solverstate"))


def test_sigusr1_is_taken_as_sighup_and_late_signals_are_ignored_after_a_job():
    from poseidon_caffe.solver import signals
    names = (signal.SIGINT, signal.SIGHUP, signal.SIGUSR1)
    before = {sig: signal.getsignal(sig) for sig in names}
    try:
        with signals.SignalHandler(sigint_effect="stop", sighup_effect="snapshot") as handler:
            os.kill(os.getpid(), signal.SIGUSR1)
            time.sleep(0.01)
            assert handler.requested_action() == signals.SNAPSHOT
            assert handler.requested_action() == signals.NONE
        assert {sig: signal.getsignal(sig) for sig in names} == before
        with signals.SignalHandler() as handler:
            handler.ignore_after_exit()
        assert all(signal.getsignal(sig) == signal.SIG_IGN for sig in names)
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)


def test_one_snapshot_signal_reaching_ranks_on_either_side_of_a_boundary_is_taken_once():
    from poseidon_caffe.solver import signals
    from poseidon_caffe.sync.stop import JobDecision
    agreement = JobDecision()                 # the agreement's decision, without MPI

    def answer(codes, clock_ms):
        return np.array(list(codes) + [clock_ms], dtype=np.int64)
    # rank 0 asked at one boundary, rank 1 (the same signal) at the next: one snapshot
    assert agreement.decide(answer([1, 0], 10_000), 10) == signals.SNAPSHOT
    assert agreement.decide(answer([0, 1], 10_040), 11) == signals.NONE
    # a second signal to a rank that already asked is a new request
    assert agreement.decide(answer([1, 0], 10_080), 12) == signals.SNAPSHOT
    # and so is one to the other rank once the window (1 s, or two boundaries) has passed
    assert agreement.decide(answer([0, 1], 12_000), 20) == signals.SNAPSHOT
    # a stop is never coalesced, and outranks a snapshot
    assert agreement.decide(answer([2, 1], 12_010), 21) == signals.STOP
    assert agreement.decide(answer([0, 0], 12_020), 22) == signals.NONE
    # on a loaded host an iteration can outlast the clock's window: the next boundary's
    # request from the other rank is still the same signal
    assert agreement.decide(answer([1, 0], 20_000), 30) == signals.SNAPSHOT
    assert agreement.decide(answer([0, 1], 23_500), 31) == signals.NONE
    # but three boundaries and more than a second later it is a new one
    assert agreement.decide(answer([1, 0], 40_000), 40) == signals.SNAPSHOT
    assert agreement.decide(answer([0, 1], 45_000), 43) == signals.SNAPSHOT
