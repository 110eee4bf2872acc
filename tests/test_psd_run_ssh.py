"""poseidon-run over real logins: three netlab hosts, each with its own OpenSSH server (host
key, one authorised key, no passwords), poseidon-run started in host 0 against them. The normal
run; a worker and a dedicated server killed outright (the job ends within seconds, non-zero,
the console naming the rank, its node and host, and the signal); SIGINT, SIGTERM and SIGHUP
sent to poseidon-run's own pid; the pre-flight lines for a refused login, a changed host key
and a virtualenv without the project. Nothing of a job is left in any namespace or in /dev/shm.
"""
import json
import os
import pathlib
import re
import signal
import subprocess
import sys
import time

import pytest

from sshd_rig import SshdCluster, missing_reason, shm_files

pytestmark = pytest.mark.mpi

PY = sys.executable
VENV = sys.prefix if os.path.exists(os.path.join(sys.prefix, "bin", "activate")) else ""
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REASON = missing_reason() or (None if VENV else "the tests must run in the project's "
                                                 "virtualenv (the nodes activate it)")
if REASON:
    pytestmark = [pytest.mark.mpi, pytest.mark.skip(reason=REASON)]


@pytest.fixture
def rig(tmp_path):
    os.chmod(tmp_path, 0o755)
    with SshdCluster(tmp_path, hosts=3) as cluster:
        yield cluster
    # nothing of the lab is left: namespaces gone with it
    from poseidon_caffe import netlab
    assert not set(cluster.lab.all_namespaces()) & set(netlab.namespaces())


@pytest.fixture(scope="module")
def digits(tmp_path_factory):
    from poseidon_caffe.data.mnist_embedded import ensure_mnist_lmdbs
    return ensure_mnist_lmdbs(str(tmp_path_factory.mktemp("digits")))


def _p(rig):
    return pathlib.Path(rig.folder)


def lenet(tmp_path, digits, max_iter):
    from jobs import write_lenet_job
    solver = write_lenet_job(tmp_path, "lenet", 8, digits[0], digits[1], display=1,
                             max_iter=max_iter)
    text = open(solver).read().replace("base_lr: 0.05", "base_lr: 0.01")   # no divergence
    open(solver, "w").write(text)
    return solver


def config(rig, servers=(), **extra):
    a = rig.addresses
    keys = dict(username="root", pem_file=rig.path("client_key"), master_node=a[0],
                worker_nodes=[a[1], a[2]], server_nodes=[a[i] for i in servers],
                virtualenv=VENV)
    keys.update(extra)
    path = os.path.join(rig.folder, "cluster.json")
    with open(path, "w") as f:
        json.dump(keys, f)
    return path


# the ranks' sync timeout: a job still running then would end by it, not by what is tested
SYNC_TIMEOUT_S = 20


def start(rig, cluster_json, command, timeout_s=str(SYNC_TIMEOUT_S)):
    env = dict(os.environ, POSEIDON_NO_PROGRESS="1", POSEIDON_RUN_SSH=rig.ssh_command(),
               POSEIDON_SYNC_TIMEOUT=timeout_s)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p)
    return rig.run_on(0, [PY, "-m", "poseidon_caffe.tools.poseidon_run", "-c", cluster_json,
                          "-o", rig.path("logs"), command], cwd=rig.folder, env=env,
                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                      start_new_session=True)


def wait_for_iteration(rig, proc, n, timeout=60):
    log = rig.path("logs/rank0.log")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if os.path.exists(log) and "Iteration %d," % n in open(log, errors="replace").read():
            return
        assert proc.poll() is None, proc.communicate()[0][-3000:]
        time.sleep(0.1)
    raise AssertionError("rank 0 never reached iteration %d" % n)


def finish(proc, timeout=60):
    """(exit status, console) of poseidon-run; killed and failed when it outlives timeout."""
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        raise AssertionError("poseidon-run still ran after %d s:\n%s" % (timeout, out[-3000:]))
    return proc.returncode, out


def train_pid(rig, host):
    """The training process (supervise's child) on ``host``."""
    skip = set()
    for word in ("supervise", "poseidon_run", "mpiexec"):
        skip.update(rig.processes(host, word))
    [pid] = [p for p in rig.processes(host, "poseidon-caffe train") if p not in skip]
    return pid


def assert_nothing_left(rig, shm_before, since):
    time.sleep(0.5)
    assert rig.job_processes() == {}
    # MPICH's segments made while the job ran and mapped by nobody now are this job's leftovers
    maps = ""
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                maps += open("/proc/%s/maps" % pid).read()
            except OSError:
                pass
    stale = [f for f in shm_files() - shm_before
             if os.path.exists(f) and os.stat(f).st_mtime >= since - 1 and f not in maps]
    assert stale == []


def test_normal_run_trains_over_real_ssh(rig, digits):
    solver = lenet(_p(rig), digits, 3)
    before, since = shm_files(), time.time()
    proc = start(rig, config(rig), "poseidon-caffe train -solver=%s -sync=auto" % solver)
    code, out = finish(proc, 120)
    assert code == 0, out[-3000:]
    assert "2 nodes ready" in out and "Optimization Done." in out
    assert "job ended with exit status 0" in out
    assert os.path.exists(rig.path("lenet_iter_3.caffemodel"))
    # each rank's output and its own log, as README says
    assert "Worker rank 1 of 2" in open(rig.path("logs/caffe.rank1.log")).read()
    assert_nothing_left(rig, before, since)


# under -sync=auto the dedicated server has nothing to do; under ps it serves every blob
@pytest.mark.parametrize("victim, servers, sync", [("worker 1", (), "auto"),
                                                   ("server 0", (0,), "auto"),
                                                   ("server 0", (0,), "ps")])
def test_a_rank_killed_outright_ends_the_job_naming_it(rig, digits, victim, servers, sync):
    solver = lenet(_p(rig), digits, 100000)
    before, since = shm_files(), time.time()
    proc = start(rig, config(rig, servers),
                 "poseidon-caffe train -solver=%s -sync=%s" % (solver, sync))
    wait_for_iteration(rig, proc, 3)
    host, rank, node = (2, 1, rig.addresses[2]) if victim == "worker 1" else \
        (0, 2, rig.addresses[0])
    os.kill(train_pid(rig, host), signal.SIGKILL)
    killed = time.monotonic()
    code, out = finish(proc)
    seconds = time.monotonic() - killed
    print("%s killed: the job ended %.1f s later, status %d" % (victim, seconds, code))
    assert code == 128 + signal.SIGKILL, out[-3000:]
    # ended by the death being seen, long before any rank's sync timeout could end it (a
    # liveness bound: before, the job waited for that timeout, or for ever)
    assert seconds < SYNC_TIMEOUT_S / 2, out[-3000:]
    # the console names the dead rank, its node, its host and the signal, before any other
    deaths = [l for l in out.splitlines() if l.startswith("poseidon-run: rank ")]
    assert deaths, out[-3000:]
    assert re.match(r"poseidon-run: rank %d \(%s on node %s\): rank %d on host \S+ \(pid \d+\) "
                    r"was killed by signal 9 \(SIGKILL\)" % (rank, victim, re.escape(node), rank),
                    deaths[0]), deaths
    if victim == "worker 1":
        assert "on host lab-h2" in deaths[0]
    assert re.search(r"job ended with exit status 137 after [\d.]+ s: rank %d \(%s"
                     % (rank, victim), out)
    assert_nothing_left(rig, before, since)


# with a dedicated server that has nothing to do (-sync=auto) the workers still decide
@pytest.mark.parametrize("signum, status, servers", [(signal.SIGINT, 0, ()),
                                                     (signal.SIGTERM, 143, ()),
                                                     (signal.SIGINT, 0, (0,))])
def test_a_signal_to_poseidon_runs_pid_reaches_every_rank(rig, digits, signum, status, servers):
    solver = lenet(_p(rig), digits, 100000)
    before, since = shm_files(), time.time()
    proc = start(rig, config(rig, servers),
                 "poseidon-caffe train -solver=%s -sync=auto" % solver)
    wait_for_iteration(rig, proc, 3)
    os.kill(proc.pid, signum)                 # the pid alone, not its group
    sent = time.monotonic()
    code, out = finish(proc)
    seconds = time.monotonic() - sent
    print("%s to poseidon-run: ended %.1f s later, status %d"
          % (signal.Signals(signum).name, seconds, code))
    assert code == status, out[-3000:]
    # ended by the signal (training would run on to max_iter, 100000 iterations), before
    # any rank's sync timeout: a liveness bound, not a speed
    assert seconds < SYNC_TIMEOUT_S - 5
    assert "%s: passed on to every rank" % signal.Signals(signum).name in out
    snapshots = [f for f in os.listdir(rig.folder) if re.match(r"lenet_iter_\d+\.caffemodel$", f)]
    if signum == signal.SIGINT:               # Caffe's stop: a snapshot, then the end
        assert snapshots, out[-2000:]
    assert_nothing_left(rig, before, since)


def test_sighup_to_poseidon_run_is_a_snapshot_and_training_goes_on(rig, digits):
    solver = lenet(_p(rig), digits, 100000)
    proc = start(rig, config(rig), "poseidon-caffe train -solver=%s -sync=auto" % solver)
    wait_for_iteration(rig, proc, 3)
    os.kill(proc.pid, signal.SIGHUP)
    deadline = time.monotonic() + 30
    while not [f for f in os.listdir(rig.folder) if f.endswith(".caffemodel")]:
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.1)
    time.sleep(1)
    assert proc.poll() is None                # a snapshot, not an end
    os.kill(proc.pid, signal.SIGINT)
    code, out = finish(proc)
    assert code == 0, out[-3000:]


def test_preflight_names_a_refused_login_a_changed_host_key_and_a_bare_virtualenv(rig, tmp_path):
    a = rig.addresses
    # a key that no host authorises: the host answered, the login was refused
    other = config(rig, pem_file=rig.path("other_key"))
    code, out = finish(start(rig, other, "true"))
    assert code == 2
    assert re.search(r"node %s \(worker 0\) answered but refused the login: .*Permission denied"
                     % re.escape(a[1]), out), out
    # a host whose key changed: ssh's own hint to remove the old one is kept
    with open(rig.path("known_hosts"), "w") as f:
        f.write("%s %s" % (a[2], open(rig.path("other_key.pub")).read()))
    code, out = finish(start(rig, config(rig), "true"))
    assert code == 2
    [line] = [l for l in out.splitlines() if a[2] in l and "host key" in l]
    assert "ssh-keygen" in line and "-R" in line, line
    os.remove(rig.path("known_hosts"))
    # a virtualenv without the project: refused before the job, in one line
    bare = str(tmp_path / "bare_venv")
    subprocess.run(["python3", "-m", "venv", "--without-pip", bare], check=True, timeout=120)
    code, out = finish(start(rig, config(rig, virtualenv=bare), "true"))
    assert code == 2, out
    assert re.search(r"node %s \(worker 0\) is reachable but not ready: %s has no "
                     r"hydra_pmi_proxy" % (re.escape(a[1]), re.escape(bare)), out), out
    assert "2 nodes ready" not in out
