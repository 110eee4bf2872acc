"""The launcher: Poseidon's localserver host files parse (with clear errors), run_local.py and
the train_*.sh scripts build the expected mpiexec argument lists (dry run), and one real run
trains the MNIST example on two local workers."""
import io
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time

import pytest

from poseidon_caffe.launch import launcher
from poseidon_caffe.launch.command import build_command
from poseidon_caffe.launch.hosts import HostFileError, read_localserver
from poseidon_caffe.tools import launch

from jobs import SMALL_CONV_NET

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PY = sys.executable


def hostfile(tmp_path, text):
    path = tmp_path / "localserver"
    path.write_text(text)
    return str(path)


def test_localserver_parses_poseidon_format(tmp_path):
    path = hostfile(tmp_path, "0 127.0.0.1 9999\n\n1 localhost 10000\n")
    assert read_localserver(path) == [(0, "127.0.0.1", 9999), (1, "localhost", 10000)]
    assert read_localserver(os.path.join(ROOT, "localserver")) == [(0, "127.0.0.1", 9999)]


@pytest.mark.parametrize("text,message", [
    ("0 127.0.0.1\n", r"localserver:1: expected '<client_id> <ip> <port>' \(3 fields\), got 2"),
    ("zero 127.0.0.1 9999\n", r"localserver:1: client id 'zero' is not an integer"),
    ("0 127.0.0.1 port\n", r"localserver:1: port 'port' is not an integer"),
    ("0 127.0.0.1 9999\n0 127.0.0.1 9998\n", r"localserver:2: duplicate client id 0 \(first on line 1\)"),
    ("0 no-such-host.invalid 9999\n", r"localserver:1: unknown host 'no-such-host.invalid'"),
    ("\n", r"lists no machines"),
])
def test_localserver_errors_name_file_line_and_problem(tmp_path, text, message):
    with pytest.raises(HostFileError, match=message):
        read_localserver(hostfile(tmp_path, text))


def rank_command(solver, extra=()):
    return [PY, "-m", "poseidon_caffe.tools.supervise", "--", PY, "-m", "poseidon_caffe.cli",
            "train", "-solver=%s" % solver, "-sync=auto", "-svb=true", "-dwbp=true",
            "-staleness=2", "-ranks_per_host=2", "-output_dir=out"] + list(extra)


def test_one_segment_per_host_and_device():
    hosts = [(0, "10.0.0.1", 9999), (1, "10.0.0.2", 9999)]
    args = build_command(hosts, [0, 3], "s.prototxt", staleness=2, svb=True,
                                  out_dir="out", use_gpu=True, mpiexec="mpiexec", python=PY)
    expected = ["mpiexec", "-hosts", "10.0.0.1:2,10.0.0.2:2"]
    for n, device in enumerate([0, 3, 0, 3]):
        if n:
            expected.append(":")
        expected += ["-n", "1"] + rank_command("s.prototxt", ["-gpu=%d" % device])
    assert args == expected


def dry_run(cmd, env=None):
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60, cwd=ROOT,
                          env=dict(os.environ, **(env or {})))
    assert proc.returncode == 0, proc.stderr
    return shlex.split(proc.stdout.strip().splitlines()[-1])


def example_in(tmp_path, example):
    """The example's run_local.py in a tree of its own under tmp_path: the script takes its
    folder's grandparent as the job's root, so its outputs go there and not into a checkout
    that a user's real runs have written to."""
    tree = tmp_path / "tree"
    (tree / "examples" / example).mkdir(parents=True)
    script = tree / "examples" / example / "run_local.py"
    shutil.copyfile(os.path.join(ROOT, "examples", example, "run_local.py"), script)
    return str(tree), str(script)


@pytest.mark.parametrize("example", ["googlenet", "alexnet", "mnist"])
def test_run_local_dry_run(tmp_path, example):
    path = hostfile(tmp_path, "0 127.0.0.1 9999\n1 localhost 9999\n")
    tree, script = example_in(tmp_path, example)
    env = {"PYTHONPATH": ROOT}
    args = dry_run([PY, script, path, "--dry-run"], env=env)
    assert args[1:3] == ["-hosts", "127.0.0.1:1,localhost:1"]
    assert args.count(":") == 1
    dataset = "mnist" if example == "mnist" else "imagenet"
    solver = {"mnist": "examples/mnist/lenet_solver.prototxt"}.get(
        example, "examples/%s/solver.prototxt" % example)
    assert "-solver=%s" % solver in args
    out = os.path.join(tree, "output", "caffe.%s.S0.M2.T1" % dataset)
    assert "-output_dir=%s" % out in args
    assert not os.path.exists(os.path.join(tree, "output"))     # a dry run makes nothing
    # Poseidon's defaults for the example: svb, and the Bösen knobs passed on to be logged
    svb, rows = {"mnist": ("false", 1), "alexnet": ("true", 256), "googlenet": ("true", 32)}[example]
    assert args.count("-svb=%s" % svb) == 2
    assert args.count("-num_rows_per_table=%d" % rows) == 2
    assert args.count("-consistency_model=SSPPush") == 2
    assert [a for a in args if a.startswith("-client_id=")] == ["-client_id=0", "-client_id=1"]
    # Poseidon's per-host form: client 0 leads with hydra's manual launcher
    lead = dry_run([PY, script, "0", path, "--dry-run"], env=env)
    assert lead[:3] == [args[0], "-launcher", "manual"] and lead[3:] == args[1:]
    assert not os.path.exists(os.path.join(tree, "output"))


@pytest.mark.parametrize("example, svb", [("googlenet", "true"), ("alexnet", "false")])
def test_train_script_dry_run(tmp_path, example, svb):
    path = hostfile(tmp_path, "0 127.0.0.1 9999\n")
    args = dry_run(["bash", os.path.join(ROOT, "examples", example, "train_%s.sh" % example), path],
                   env={"DRY_RUN": "1", "PYTHON": PY})
    assert args[1:3] == ["-hosts", "127.0.0.1:1"]
    assert "-solver=examples/%s/solver.prototxt" % example in args
    assert "-staleness=0" in args and "-svb=%s" % svb in args
    assert "-output_dir=%s" % os.path.join(ROOT, "output", "caffe.imagenet.S0.M1.T1") in args


def test_bad_host_file_is_reported_by_run_local(tmp_path):
    path = hostfile(tmp_path, "0 127.0.0.1 9999 extra\n")
    proc = subprocess.run([PY, os.path.join(ROOT, "examples", "mnist", "run_local.py"), path,
                           "--dry-run"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "localserver:1: expected '<client_id> <ip> <port>' (3 fields), got 4" in proc.stderr


def test_run_local_script_takes_the_settings_from_the_script_globals(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)            # run_local_script moves into the repository root
    path = hostfile(tmp_path, "0 127.0.0.1 9999\n")
    script_globals = dict(solver="s.prototxt", devices=[0, 1], table_staleness=3, svb=True,
                          num_rows_per_table=7, dataset="mnist", os=os, ROOT="elsewhere",
                          __name__="__main__", not_a_setting=5)
    out = io.StringIO()
    assert launch.run_local_script(script_globals, str(tmp_path), [path, "--dry-run"],
                                     out) == 0
    args = shlex.split(out.getvalue())
    assert "-solver=s.prototxt" in args and args.count("-staleness=3") == 2
    assert args.count("-svb=true") == 2 and args.count("-num_rows_per_table=7") == 2
    assert "-output_dir=%s" % (tmp_path / "output" / "caffe.mnist.S3.M1.T2") in args
    assert not any("not_a_setting" in a or "ROOT" in a for a in args)

    def interrupted(path):                 # a Ctrl-C while the host names resolve
        raise KeyboardInterrupt
    monkeypatch.setattr(launcher, "read_localserver", interrupted)
    assert launch.run_local_script(script_globals, str(tmp_path), [path], out) == 130


def _sigint_by_default():
    """SIGINT as a terminal's Ctrl-C finds a program: a test run started where SIGINT is
    ignored (a shell's background job without job control) hands that on to its children,
    and Python then starts with no KeyboardInterrupt to raise."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.parametrize("example", ["googlenet", "alexnet", "mnist"])
def test_ctrl_c_while_run_local_starts_exits_quietly(tmp_path, example):
    """A SIGINT while run_local.py still loads the library: status 130, no traceback."""
    script = tmp_path / "examples" / example / "run_local.py"
    script.parent.mkdir(parents=True)
    shutil.copy(os.path.join(ROOT, "examples", example, "run_local.py"), script)
    # the package the script loads from its repository root says it has begun, then hangs
    loading = tmp_path / "loading"
    (tmp_path / "poseidon_caffe").mkdir()
    (tmp_path / "poseidon_caffe" / "__init__.py").write_text(
        "import time\nopen(%r, 'w').close()\ntime.sleep(60)\n" % str(loading))
    proc = subprocess.Popen([PY, str(script), "--dry-run"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, preexec_fn=_sigint_by_default)
    try:
        deadline = time.monotonic() + 30
        while not loading.exists():
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.01)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert (proc.returncode, out, err) == (130, "", "")


@pytest.mark.mpi
def test_mnist_trains_on_two_local_workers(tmp_path):
    from poseidon_caffe.data.mnist_embedded import ensure_mnist_lmdbs
    mnist = os.path.join(ROOT, "examples", "mnist")
    train_db, test_db = ensure_mnist_lmdbs(str(tmp_path / "digits"))
    text = open(os.path.join(mnist, "lenet_solver.prototxt")).read()
    net = tmp_path / "lenet_train_test.prototxt"
    net.write_text(open(os.path.join(mnist, "lenet_train_test.prototxt")).read()
                   .replace("examples/mnist/mnist_train_lmdb", train_db)
                   .replace("examples/mnist/mnist_test_lmdb", test_db))
    lines = [l for l in text.splitlines()
             if not l.split(":")[0].strip() in ("net", "max_iter", "display", "test_interval",
                                                "test_iter", "snapshot", "snapshot_prefix")]
    lines += ['net: "%s"' % net, "max_iter: 6", "display: 1", "test_interval: 6", "test_iter: 2",
              'snapshot_prefix: "%s"' % (tmp_path / "lenet")]
    solver = tmp_path / "solver.prototxt"
    solver.write_text("\n".join(lines) + "\n")
    out = tmp_path / "out"
    args = build_command([(0, "127.0.0.1", 9999)], [0, 1], str(solver), svb=True,
                                  out_dir=str(out), use_gpu=False, python=PY)
    proc = subprocess.run(args, capture_output=True, text=True, timeout=240, cwd=ROOT,
                          env=dict(os.environ, POSEIDON_NO_PROGRESS="1"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Test net output #0: accuracy" in proc.stderr
    assert "Optimization Done." in proc.stderr
    # at every display the bytes of whole iterations are reported, next to the plan's figure
    reported = re.findall(r"Sync (?:\S+ \S+|total): ([\d.]+ \w+) off-host per iteration "
                          r"\(predicted ([\d.]+ \w+)", proc.stderr)
    assert len(reported) >= 7 and all(m == p for m, p in reported), reported
    assert os.path.exists(tmp_path / "lenet_iter_6.caffemodel")
    for rank in (0, 1):
        assert "Worker rank %d of 2" % rank in (out / ("caffe.rank%d.log" % rank)).read_text()
    rows = (out / "solver.netoutputs").read_text().splitlines()
    assert rows[0] == "iteration,seconds,smoothed_loss,loss" and len(rows) == 7


def test_num_app_threads_must_match_the_device_list(tmp_path, capsys):
    path = hostfile(tmp_path, "0 127.0.0.1 9999\n")
    code = launch.main(["--solver", "s.prototxt", "--hostfile", path, "--devices", "0,1",
                          "--num_app_threads", "1", "--dry-run"])
    assert code == 2
    assert "--devices lists 2 devices but --num_app_threads is 1" in capsys.readouterr().err
    assert launch.main(["--solver", "s.prototxt", "--hostfile", path, "--devices", "0,1",
                          "--num_app_threads", "2", "--dry-run"]) == 0


@pytest.mark.mpi
def test_timeline_is_chrome_trace_json_with_layers_and_exchanges(tmp_path):
    import json
    (tmp_path / "net.prototxt").write_text(SMALL_CONV_NET)
    solver = tmp_path / "solver.prototxt"
    solver.write_text('net: "%s"\nbase_lr: 0.01 lr_policy: "fixed" display: 0 max_iter: 3\n'
                      % (tmp_path / "net.prototxt"))
    mpiexec = os.path.join(os.path.dirname(PY), "mpiexec")
    trace = tmp_path / "trace.json"
    proc = subprocess.run([mpiexec, "-n", "2", PY, "-m", "poseidon_caffe.cli", "train",
                           "-solver=%s" % solver, "-sync=allreduce", "-timeline=%s" % trace],
                          capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, POSEIDON_NO_PROGRESS="1"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    # rank 0 writes the file named; every other rank writes FILE.rank<r>.json beside it
    for rank, name in ((0, "trace.json"), (1, "trace.rank1.json")):
        events = json.loads((tmp_path / name).read_text())["traceEvents"]
        spans = [e for e in events if e["ph"] == "X"]
        assert all(e["pid"] == rank and e["dur"] >= 0 for e in spans)
        names = {e["name"] for e in spans if e["cat"] == "compute" and e["tid"] == 0}
        # every layer's forward and every layer that needs a gradient's backward, each iteration
        for layer in ("data", "conv", "ip", "loss"):
            assert sum(e["name"] == "forward " + layer for e in spans) == 3
        for layer in ("conv", "ip", "loss"):
            assert "backward " + layer in names
        exchanges = [e for e in spans if e["cat"] == "exchange"]
        # an exchange is drawn on the thread of its channel: 1 + the channel's number
        threads = {e["tid"]: e["args"]["name"] for e in events if e["name"] == "thread_name"}
        assert exchanges and all(threads[e["tid"]] == "communication, channel %d"
                                 % (e["tid"] - 1) for e in exchanges)
        assert {e["args"]["clock"] for e in exchanges} == {0, 1, 2}
