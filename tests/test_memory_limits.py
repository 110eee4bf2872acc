"""The memory a run may use: a container's cgroup limit as well as the host's MemAvailable,
data layers that read nothing before the nets are known to fit, and train and test nets
checked together. Figures are worked out by hand (float32: 4 bytes a value); peak memory is
the refused process's own maximum resident size (wait4)."""
import os
import subprocess
import sys

import lmdb
import numpy as np
import pytest

from poseidon_caffe import TEST, TRAIN, io as pio, memory
from poseidon_caffe.net import Net
from poseidon_caffe.proto import caffe_pb2

from peak_memory import run_measuring_peak

MiB = 1 << 20
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def fake_host(tmp_path, mem_available_kb, cgroup_lines, mount_lines, files):
    """A folder laid out as / is: proc/meminfo, proc/self/cgroup and mountinfo, and the
    cgroup files given as {path under the root: text}."""
    (tmp_path / "proc/self").mkdir(parents=True)
    (tmp_path / "proc/meminfo").write_text(
        "MemTotal:       99999999 kB\nMemFree:          1000 kB\n"
        "MemAvailable:   %d kB\n" % mem_available_kb)
    (tmp_path / "proc/self/cgroup").write_text("".join(l + "\n" for l in cgroup_lines))
    (tmp_path / "proc/self/mountinfo").write_text("".join(l + "\n" for l in mount_lines))
    for path, text in files.items():
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(text)
    return str(tmp_path)


V2_MOUNT = "30 23 0:26 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate"


def test_cgroup_v2_limit_less_its_usage_is_the_figure(tmp_path):
    root = fake_host(tmp_path, 8 * 1024 * 1024, ["0::/job/rank"], [V2_MOUNT], {
        "sys/fs/cgroup/job/memory.max": "max\n",
        "sys/fs/cgroup/job/memory.current": "%d\n" % (900 * MiB),
        "sys/fs/cgroup/job/rank/memory.max": "%d\n" % (700 * MiB),
        "sys/fs/cgroup/job/rank/memory.current": "%d\n" % (200 * MiB),
        # the inactive file cache is the kernel's to take back: not counted as used
        "sys/fs/cgroup/job/rank/memory.stat": "anon 1000\ninactive_file %d\nactive_file 7\n"
                                              % (50 * MiB)})
    # 700 MiB - (200 MiB - 50 MiB) = 550 MiB, under the host's 8 GiB
    assert memory.available_memory({}, root) == (
        550 * MiB, "the memory cgroup /job/rank has 550.0 MiB left of its 700.0 MiB limit")


def test_a_tighter_parent_cgroup_sets_the_figure(tmp_path):
    root = fake_host(tmp_path, 8 * 1024 * 1024, ["0::/job/rank"], [V2_MOUNT], {
        "sys/fs/cgroup/job/memory.max": "%d\n" % (600 * MiB),
        "sys/fs/cgroup/job/memory.current": "%d\n" % (500 * MiB),
        "sys/fs/cgroup/job/rank/memory.max": "%d\n" % (700 * MiB),
        "sys/fs/cgroup/job/rank/memory.current": "%d\n" % (200 * MiB)})
    # the rank's group leaves 500 MiB, its parent 100 MiB: the parent's is the figure; two
    # ranks on the host take half each
    assert memory.available_memory({"MPI_LOCALNRANKS": "2"}, root) == (
        50 * MiB, "the memory cgroup /job has 100.0 MiB left of its 600.0 MiB limit, "
                  "50.0 MiB for each of its 2 ranks")


def test_cgroup_v1_in_a_container_and_an_unlimited_group(tmp_path):
    # a container: /proc/self/cgroup names the host's path, the mount's root is that group
    mount = ("35 31 0:32 /docker/abc /sys/fs/cgroup/memory rw,relatime - cgroup cgroup "
             "rw,memory")
    files = {"sys/fs/cgroup/memory/memory.limit_in_bytes": "%d\n" % (700 * 1000 * 1000),
             "sys/fs/cgroup/memory/memory.usage_in_bytes": "%d\n" % (300 * 1000 * 1000),
             "sys/fs/cgroup/memory/memory.stat": "cache 5\ntotal_inactive_file %d\n"
                                                 % (100 * 1000 * 1000)}
    root = fake_host(tmp_path / "a", 8 * 1024 * 1024,
                     ["5:devices:/docker/abc", "4:memory:/docker/abc", "0::/"], [mount], files)
    # 700 MB - (300 MB - 100 MB) = 500,000,000 bytes = 476.8 MiB; 700 MB = 667.6 MiB
    assert memory.available_memory({}, root) == (
        500_000_000, "the memory cgroup /docker/abc has 476.8 MiB left of its 667.6 MiB limit")
    # v1 writes "no limit" as 9223372036854771712: the host's MemAvailable is the figure
    files["sys/fs/cgroup/memory/memory.limit_in_bytes"] = "9223372036854771712\n"
    root = fake_host(tmp_path / "b", 3 * 1024 * 1024, ["4:memory:/docker/abc"], [mount], files)
    assert memory.available_memory({}, root) == (3 << 30, "this machine has 3.0 GiB")


def test_the_host_figure_when_it_is_the_smaller(tmp_path):
    root = fake_host(tmp_path, 256 * 1024, ["0::/job"], [V2_MOUNT], {
        "sys/fs/cgroup/job/memory.max": "%d\n" % (700 * MiB),
        "sys/fs/cgroup/job/memory.current": "%d\n" % (200 * MiB)})
    assert memory.available_memory({}, root) == (256 * MiB, "this machine has 256.0 MiB")
    # POSEIDON_MEMORY_LIMIT overrides both
    assert memory.available_memory({"POSEIDON_MEMORY_LIMIT": "1G"}, root)[0] == 1 << 30


# -- a real cgroup ---------------------------------------------------------------------------
def own_memory_cgroup():
    """(version, folder) of this process's memory cgroup where a child can be made, or a
    reason why not."""
    if os.geteuid() != 0:
        return None, "making a cgroup needs root"
    for version, folder, _, _ in memory._memory_cgroups("/"):
        limit = "memory.limit_in_bytes" if version == 1 else "memory.max"
        probe = os.path.join(folder, "poseidon-probe-%d" % os.getpid())
        try:
            os.mkdir(probe)
        except OSError:
            continue
        try:
            if os.path.exists(os.path.join(probe, limit)):
                return (version, folder), None
        finally:
            os.rmdir(probe)
    return None, "no memory cgroup (v1 or v2) here lets a child group be made"


def run_in_cgroup(limit, argv, cwd, env):
    """Run argv in a new child memory cgroup with ``limit`` bytes; (exit code, stderr)."""
    where, reason = own_memory_cgroup()
    if where is None:
        pytest.skip(reason)
    version, folder = where
    child = os.path.join(folder, "poseidon-test-%d" % os.getpid())
    os.mkdir(child)
    try:
        name = "memory.limit_in_bytes" if version == 1 else "memory.max"
        with open(os.path.join(child, name), "w") as f:
            f.write(str(limit))
        if version == 2:
            with open(os.path.join(child, "memory.swap.max"), "w") as f:
                f.write("0")

        def enter():
            with open(os.path.join(child, "cgroup.procs"), "w") as f:
                f.write(str(os.getpid()))
        proc = subprocess.run(argv, cwd=str(cwd), capture_output=True, text=True, timeout=300,
                              env=env, preexec_fn=enter)
        return proc.returncode, proc.stderr
    finally:
        os.rmdir(child)


def test_a_net_over_a_real_cgroup_limit_is_refused_not_killed(tmp_path):
    # 150 x 1000 x 1000 floats: 600,000,000 bytes (572.2 MiB) in a 300 MiB group, on a host
    # that has more; it used to be allocated and killed by the kernel without a word
    (tmp_path / "big.prototxt").write_text(
        'name: "big" layer { name: "data" type: "Input" top: "data" input_param { shape { '
        'dim: 150 dim: 1000 dim: 1000 } } }\n'
        'layer { name: "relu" type: "ReLU" bottom: "data" top: "data" }')
    argv = [sys.executable, "-m", "poseidon_caffe.cli", "time", "-model", "big.prototxt",
            "-phase", "TEST", "-iterations", "1"]
    env = {k: v for k, v in os.environ.items() if k != "POSEIDON_MEMORY_LIMIT"}
    code, err = run_in_cgroup(300 * MiB, argv, tmp_path, env)
    errors = [line for line in err.splitlines() if line.startswith("E")]
    assert code == 1 and "Traceback" not in err, err[-2000:]
    assert len(errors) == 1, err[-2000:]
    assert "net big needs 572.2 MiB for blobs (largest: layer data, 572.2 MiB); the memory " \
           "cgroup " in errors[0] and errors[0].endswith(" left of its 300.0 MiB limit")


# -- data layers read nothing before the check ----------------------------------------------
def write_digits(path, count):
    """An LMDB of ``count`` 1x28x28 byte Datum records."""
    draws = np.random.default_rng(0)
    env = lmdb.open(str(path), map_size=1 << 26)
    with env.begin(write=True) as txn:
        for i in range(count):
            datum = caffe_pb2.Datum(channels=1, height=28, width=28, label=i % 10,
                                    data=draws.integers(0, 256, 784, np.uint8).tobytes())
            txn.put(b"%08d" % i, datum.SerializeToString())
    env.close()


def lenet(tmp_path, batch):
    with open(os.path.join(ROOT, "examples", "mnist", "lenet_train_test.prototxt")) as f:
        text = f.read()
    text = (text.replace("examples/mnist/mnist_train_lmdb", str(tmp_path / "train"))
            .replace("examples/mnist/mnist_test_lmdb", str(tmp_path / "test"))
            .replace("batch_size: 64", "batch_size: %d" % batch))
    (tmp_path / "lenet.prototxt").write_text(text)
    write_digits(tmp_path / "train", 200)
    write_digits(tmp_path / "test", 100)
    (tmp_path / "solver.prototxt").write_text(
        'net: "lenet.prototxt" base_lr: 0.01 lr_policy: "fixed" max_iter: 1 test_iter: 1 '
        'test_interval: 100 snapshot_prefix: "%s"' % (tmp_path / "s"))


def peak_of(argv, cwd, env):
    """(exit code, stderr, peak resident MiB) of one child process, its own rusage."""
    return run_measuring_peak(argv, cwd, env)


def test_a_refused_net_never_loads_a_batch(tmp_path):
    """LeNet with a TRAIN batch of 300,000 digits needs far more than the 2 GiB allowed; its
    Data layer must not read a batch (300,000 x 784 floats: 897 MiB) before the refusal, nor
    while the process exits."""
    lenet(tmp_path, 300_000)
    env = dict(os.environ, POSEIDON_MEMORY_LIMIT="2G")      # the same on any machine
    code, err, peak = peak_of([sys.executable, "-m", "poseidon_caffe.cli", "train", "-solver",
                               "solver.prototxt"], tmp_path, env)
    errors = [line for line in err.splitlines() if line.startswith("E")]
    assert code == 1 and len(errors) == 1, err[-2000:]
    assert "net LeNet needs" in errors[0] and errors[0].endswith(
        "the limit POSEIDON_MEMORY_LIMIT is 2.0 GiB")
    assert peak < 400, peak


def test_the_batches_in_flight_count_and_start_at_the_first_forward(tmp_path, monkeypatch):
    monkeypatch.delenv("POSEIDON_MEMORY_LIMIT", raising=False)
    lenet(tmp_path, 50)
    net = Net(str(tmp_path / "lenet.prototxt"), TRAIN)
    data = net.layers[0]
    assert data.prefetcher is None                  # built and checked, nothing read yet
    # prefetch 4 (the default): 4 queued, 1 being loaded, 1 being copied into the tops, each
    # 50 x 1 x 28 x 28 data and 50 labels
    batch = (50 * 784 + 50) * 4
    est = net.memory_estimate()
    assert est["prefetch"] == 6 * batch == 942_000
    assert est["total"] == est["data"] + est["diff"] + est["workspace"] + 942_000
    net.forward()
    assert data.prefetcher.thread.is_alive()
    data.close()
    # without a thread (prefetch 0) the one batch loaded in forward counts
    text = (tmp_path / "lenet.prototxt").read_text().replace(
        "batch_size: 50", "batch_size: 50 prefetch: 0")
    zero = Net(pio.parse_net_text(text, "lenet.prototxt"), TRAIN)
    assert zero.memory_estimate()["prefetch"] == batch


# -- train and test nets together --------------------------------------------------------------
SHARED_NET = """name: "big"
layer { name: "data" type: "DummyData" top: "data" top: "target"
  dummy_data_param { shape { dim: 8 dim: 1000 } shape { dim: 8 dim: 2000 } } }
layer { name: "ip" type: "InnerProduct" bottom: "data" top: "ip"
  inner_product_param { num_output: 2000 weight_filler { type: "gaussian" std: 0.01 } } }
layer { name: "loss" type: "EuclideanLoss" bottom: "ip" bottom: "target" top: "loss" }
"""


def test_train_and_test_nets_and_history_must_fit_together(tmp_path, monkeypatch):
    from poseidon_caffe.solver import SolverError, get_solver
    (tmp_path / "net.prototxt").write_text(SHARED_NET)
    (tmp_path / "solver.prototxt").write_text(
        'net: "%s" base_lr: 0.1 lr_policy: "fixed" max_iter: 1 momentum: 0.9 test_iter: 1 '
        'test_interval: 1' % (tmp_path / "net.prototxt"))
    params = 2000 * 1000 * 4 + 2000 * 4                       # 8,008,000
    # the TRAIN net: data + target + params + ip's top + the loss; diffs of the params, of
    # ip's top and of the loss
    train = (32_000 + 64_000 + params + 64_000 + 4) + (params + 64_000 + 4)
    assert train == 16_240_008
    # the TEST net holds the same blobs and top diffs (ip still learns, as Caffe works out
    # backward in either phase) without the parameters' diffs; ip's weights are the training
    # net's at every test, so they count once
    test = (32_000 + 64_000 + params + 64_000 + 4) + (64_000 + 4) - params
    history = params                                             # SGD: one set
    total = train + test + history
    assert total == 24_472_016                                   # 23.3 MiB
    # 20 MiB: each net fits alone (15.5 MiB at most), all together do not
    monkeypatch.setenv("POSEIDON_MEMORY_LIMIT", "20M")
    with pytest.raises(SolverError) as info:
        get_solver(str(tmp_path / "solver.prototxt"))
    assert str(info.value) == (
        "%s: the nets and the SGD solver's history need 23.3 MiB together (train net "
        "15.5 MiB, test net #0 218.8 KiB, history 7.6 MiB); the limit POSEIDON_MEMORY_LIMIT "
        "is 20.0 MiB" % (tmp_path / "solver.prototxt"))
    monkeypatch.setenv("POSEIDON_MEMORY_LIMIT", "24M")       # 25,165,824 bytes: it fits
    solver = get_solver(str(tmp_path / "solver.prototxt"))
    assert solver.net.memory_needed == train
    assert solver.test_nets[0].memory_needed - params == test


# -- counts of iterations ------------------------------------------------------------------------
@pytest.mark.parametrize("command", ["test", "time"])
@pytest.mark.parametrize("count", ["-5", "0"])
def test_test_and_time_refuse_a_count_below_one(tmp_path, command, count):
    (tmp_path / "net.prototxt").write_text(SHARED_NET)
    Net(str(tmp_path / "net.prototxt"), TEST).save(str(tmp_path / "w.caffemodel"))
    argv = [sys.executable, "-m", "poseidon_caffe.cli", command, "-model", "net.prototxt",
            "-iterations", count]
    if command == "test":
        argv += ["-weights", "w.caffemodel"]
    proc = subprocess.run(argv, cwd=str(tmp_path), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1
    assert proc.stderr.count("\n") == 1 and proc.stderr.rstrip().endswith(
        "-iterations must be a positive number of iterations, not %s" % count)
