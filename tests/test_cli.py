"""The poseidon-caffe command line in real subprocesses: train / resume / fine-tune / test /
time / device_query, flags with one dash or two, and SIGINT / SIGHUP during training."""
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import types

import numpy as np
import pytest

from jobs import TINY_NET as NET
from poseidon_caffe import cli
from poseidon_caffe.proto import caffe_pb2



def setup_files(tmp_path, max_iter=20, display=5, snapshot=10, extra=""):
    (tmp_path / "net.prototxt").write_text(NET)
    (tmp_path / "solver.prototxt").write_text(
        'net: "net.prototxt" base_lr: 0.1 momentum: 0.9 lr_policy: "fixed" display: %d '
        'max_iter: %d snapshot: %d snapshot_prefix: "snap" random_seed: 5 test_iter: 2 '
        'test_interval: 10 %s' % (display, max_iter, snapshot, extra))


def run(tmp_path, *args, timeout=120):
    proc = subprocess.run([sys.executable, "-m", "poseidon_caffe.cli"] + list(args),
                          cwd=str(tmp_path), capture_output=True, text=True, timeout=timeout)
    return proc.returncode, proc.stderr


def weights(path):
    model = caffe_pb2.NetParameter()
    model.ParseFromString(open(path, "rb").read())
    layer = [l for l in model.layer if l.name == "ip"][0]
    return np.array(layer.blobs[0].data)


def test_train_with_either_dash_style_gives_the_same_run(tmp_path):
    setup_files(tmp_path)
    code, err = run(tmp_path, "train", "-solver=solver.prototxt")
    assert code == 0, err
    assert "Optimization Done." in err
    first = weights(str(tmp_path / "snap_iter_20.caffemodel"))
    os.remove(tmp_path / "snap_iter_20.caffemodel")
    code, err = run(tmp_path, "train", "--solver", "solver.prototxt")
    assert code == 0, err
    np.testing.assert_array_equal(weights(str(tmp_path / "snap_iter_20.caffemodel")), first)
    assert re.search(r"Iteration 20, Testing net \(#0\)", err)
    assert "Snapshotting to binary proto file snap_iter_10.caffemodel" in err


def test_resume_and_finetune_from_the_command_line(tmp_path):
    setup_files(tmp_path)
    assert run(tmp_path, "train", "-solver", "solver.prototxt")[0] == 0
    uninterrupted = weights(str(tmp_path / "snap_iter_20.caffemodel"))
    os.remove(tmp_path / "snap_iter_20.caffemodel")
    code, err = run(tmp_path, "train", "--solver=solver.prototxt",
                    "--snapshot=snap_iter_10.solverstate")
    assert code == 0, err
    assert "Resuming from snap_iter_10.solverstate" in err
    np.testing.assert_array_equal(weights(str(tmp_path / "snap_iter_20.caffemodel")), uninterrupted)

    code, err = run(tmp_path, "train", "-solver=solver.prototxt",
                    "-weights=snap_iter_10.caffemodel,snap_iter_20.caffemodel")
    assert code == 0, err
    assert "Finetuning from snap_iter_10.caffemodel" in err
    assert "Finetuning from snap_iter_20.caffemodel" in err

    code, err = run(tmp_path, "train", "-solver=solver.prototxt", "-weights=a", "-snapshot=b")
    assert code == 1
    assert "not both" in err


def test_test_command_prints_batches_and_means(tmp_path):
    setup_files(tmp_path, max_iter=10)
    assert run(tmp_path, "train", "-solver=solver.prototxt")[0] == 0
    code, err = run(tmp_path, "test", "--model", "net.prototxt", "--weights",
                    "snap_iter_10.caffemodel", "-iterations", "4")
    assert code == 0, err
    batches = [float(v) for v in re.findall(r"Batch \d+, loss = (\S+)", err)]
    assert len(batches) == 4
    assert len(re.findall(r"Batch \d+, accuracy = (\S+)", err)) == 4
    mean = re.search(r"\] loss = (\S+) \(\* 1 = (\S+) loss\)", err)
    assert float(mean.group(1)) == pytest.approx(np.mean(batches), rel=1e-4)
    assert float(re.search(r"\] Loss: (\S+)", err).group(1)) == pytest.approx(np.mean(batches),
                                                                             rel=1e-4)
    code, err = run(tmp_path, "test", "-model=net.prototxt")
    assert code == 1 and "Need model weights" in err


def test_time_and_device_query(tmp_path):
    setup_files(tmp_path)
    code, err = run(tmp_path, "time", "-model=net.prototxt", "-iterations=3")
    assert code == 0, err
    assert len(re.findall(r"Iteration: \d forward-backward time: \S+ ms\.", err)) == 3
    for layer in ("data", "ip", "loss"):
        assert re.search(r"\]\s+%s\tforward: \S+ ms\." % layer, err)
        assert re.search(r"\]\s+%s\tbackward: \S+ ms\." % layer, err)
    assert re.search(r"Average Forward-Backward: \S+ ms\.", err)
    code, err = run(tmp_path, "time", "--model", "net.prototxt", "--phase", "TEST",
                    "--iterations", "1")
    assert code == 0 and "accuracy" in err
    code, err = run(tmp_path, "device_query")
    assert code == 0 and "CPU" in err


def test_time_gives_each_layers_share_of_the_total(tmp_path):
    setup_files(tmp_path)
    code, err = run(tmp_path, "time", "-model=net.prototxt", "-iterations=2")
    assert code == 0, err
    caffe = {}
    for name, kind, ms in re.findall(r"\]\s+(\S+)\t(forward|backward): (\S+) ms\.", err):
        caffe[name] = caffe.get(name, 0.0) + float(ms)
    shares = dict((name, (float(pct), float(ms))) for name, pct, ms in re.findall(
        r"\]\s+(\S+)\tshare:\s+(\S+) % \((\S+) ms\)", err))
    assert set(shares) == set(caffe) == {"data", "ip", "loss"}
    assert err.index("Total Time:") < err.index("Share of forward-backward time per layer")
    whole = sum(caffe.values())
    for name, (pct, ms) in shares.items():
        # each share is the layer's forward + backward of Caffe's lines over their sum
        assert ms == pytest.approx(caffe[name], rel=1e-3, abs=1e-5)
        assert pct == pytest.approx(100.0 * caffe[name] / whole, abs=0.06)
    assert sum(pct for pct, _ in shares.values()) == pytest.approx(100.0, abs=0.2)
    # the share lines add no line that Caffe's per-layer parsers would take for their own
    assert len(re.findall(r"\tforward: ", err)) == len(re.findall(r"\tbackward: ", err)) == 3


def test_bad_flags_and_commands_are_named(tmp_path):
    code, err = run(tmp_path, "train", "-solvr=x")
    assert code == 1 and "-solvr" in err
    code, err = run(tmp_path, "train", "-iterations=many")
    assert code == 1 and "iterations" in err
    code, err = run(tmp_path, "fly")
    assert code == 1 and "fly" in err
    code, err = run(tmp_path, "train")
    assert code == 1 and "Need a solver" in err
    code, err = run(tmp_path, "train", "-solver=solver.prototxt", "-sigint_effect=explode")
    assert code == 1 and "sigint_effect" in err


def test_single_process_train_never_imports_mpi(tmp_path):
    setup_files(tmp_path, max_iter=2, snapshot=0)
    env = {k: v for k, v in os.environ.items()
           if k not in ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "MPI_LOCALNRANKS")}
    code = ("import sys; from poseidon_caffe.cli import main; rc = main(['train', "
            "'-solver=solver.prototxt']); assert rc == 0; assert 'mpi4py' not in sys.modules, "
            "'mpi4py imported'; print('ok')")
    proc = subprocess.run([sys.executable, "-c", code], cwd=str(tmp_path), env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "ok"


def test_sync_flag_hands_the_solver_to_the_engine(tmp_path, monkeypatch):
    setup_files(tmp_path, max_iter=2, snapshot=0)
    seen = {}

    def attach(solver, options):
        seen["solver"], seen["options"] = solver, options

    def prepare(options):
        seen["prepared"] = options.sync

    import poseidon_caffe.sync as sync
    monkeypatch.setattr(sync, "attach", attach)
    monkeypatch.setattr(sync, "prepare", prepare)
    monkeypatch.chdir(tmp_path)
    assert cli.main(["train", "-solver=solver.prototxt", "--sync=sfb", "-staleness", "2",
                     "-nodwbp"]) == 0
    assert seen["solver"].iter == 2 and seen["prepared"] == "sfb"
    assert (seen["options"].sync, seen["options"].staleness, seen["options"].dwbp) == ("sfb", 2, False)


def test_tools_are_dispatched_lazily(monkeypatch):
    calls = []
    module = types.SimpleNamespace(make_partitions_main=lambda argv: calls.append(argv) or 3)
    monkeypatch.setitem(sys.modules, "fake_tools", module)
    monkeypatch.setitem(cli.TOOLS, "make_partitions", ("fake_tools", "make_partitions_main"))
    assert cli.main(["make-partitions", "--parts=4", "db"]) == 3
    assert calls == [["--parts=4", "db"]]


def all_commands():
    return sorted(cli.COMMANDS) + sorted(cli.TOOLS)


@pytest.mark.parametrize("command", all_commands())
def test_every_command_prints_its_usage_and_flags_for_help(command, capsys, tmp_path,
                                                          monkeypatch):
    monkeypatch.chdir(tmp_path)
    texts = []
    for spelling in ("-help", "--help", "-h"):
        # the help flag wins wherever it stands, and the command does not run
        assert cli.main([command, "in_lmdb", spelling, "out_lmdb"]) == 0
        out, err = capsys.readouterr()
        texts.append(out)
    assert cli.main(["help", command]) == 0
    texts.append(capsys.readouterr().out)
    assert len(set(texts)) == 1
    text = texts[0]
    name = command.replace("_", "[-_]")
    assert re.search(r"\b%s\b" % name, text), text
    if command in cli.COMMANDS:
        assert text.startswith("usage: poseidon-caffe %s" % command)
        for flag in ("-gpu", "-model", "-iterations"):
            assert "\n  %s (" % flag in text
    else:
        function = cli._load_tool(command)
        for flag in getattr(function, "flags", ()):
            assert "\n  -%s (" % flag.name in text
    assert os.listdir(tmp_path) == []


def test_help_in_a_real_process_for_train_and_a_tool(tmp_path):
    code, err = run(tmp_path, "train", "-help")
    assert code == 0 and "unknown flag" not in err
    proc = subprocess.run([sys.executable, "-m", "poseidon_caffe.cli", "convert_imageset",
                           "--help"], cwd=str(tmp_path), capture_output=True, text=True)
    assert proc.returncode == 0
    assert "ROOTFOLDER/ LISTFILE DB_NAME" in proc.stdout and "-resize_width" in proc.stdout
    proc = subprocess.run([sys.executable, "-m", "poseidon_caffe.cli", "train", "-help"],
                          cwd=str(tmp_path), capture_output=True, text=True)
    assert "-solver (" in proc.stdout and "-sighup_effect (" in proc.stdout


def test_a_tool_added_later_answers_help_from_its_docstring(monkeypatch, capsys):
    def draw_things_main(argv):
        """usage: poseidon-caffe draw_things NET OUT"""
        raise AssertionError("help must not run the tool")
    monkeypatch.setitem(sys.modules, "fake_draw", types.SimpleNamespace(
        draw_things_main=draw_things_main))
    monkeypatch.setitem(cli.TOOLS, "draw_things", ("fake_draw", "draw_things_main"))
    assert cli.main(["draw-things", "--help"]) == 0
    assert "draw_things NET OUT" in capsys.readouterr().out
    # after ``--`` a help flag is an argument, as with gflags
    calls = []
    monkeypatch.setitem(sys.modules, "fake_draw", types.SimpleNamespace(
        draw_things_main=lambda argv: calls.append(argv) or 0))
    assert cli.main(["draw_things", "--", "-help"]) == 0
    assert calls == [["--", "-help"]]


# -- signals ------------------------------------------------------------------------------------
class Reader:
    """Collects a child's stderr lines on a thread so waits can time out."""

    def __init__(self, proc):
        self.proc = proc
        self.lines = []
        self.queue = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self):
        for line in self.proc.stderr:
            self.queue.put(line)
        self.queue.put(None)

    def wait_for(self, pattern, timeout=60):
        regex = re.compile(pattern)
        while True:
            line = self.queue.get(timeout=timeout)
            if line is None:
                raise AssertionError("process ended before %r:\n%s" % (pattern, "".join(self.lines)))
            self.lines.append(line)
            match = regex.search(line)
            if match:
                return match

    def rest(self):
        self.proc.wait(timeout=60)
        while True:
            line = self.queue.get(timeout=60)
            if line is None:
                return "".join(self.lines)
            self.lines.append(line)


def start(tmp_path, *flags):
    setup_files(tmp_path, max_iter=10 ** 7, display=50, snapshot=0)
    proc = subprocess.Popen([sys.executable, "-m", "poseidon_caffe.cli", "train",
                             "-solver=solver.prototxt"] + list(flags), cwd=str(tmp_path),
                            stderr=subprocess.PIPE, text=True)
    return proc, Reader(proc)


def test_sigint_stops_after_the_iteration_and_snapshots(tmp_path):
    proc, out = start(tmp_path)
    try:
        out.wait_for(r"Iteration 100 \(")
        proc.send_signal(signal.SIGINT)
        snap = out.wait_for(r"Snapshotting to binary proto file snap_iter_(\d+)\.caffemodel")
        log = out.rest()
    finally:
        proc.kill()
    assert proc.returncode == 0, log
    assert "Optimization stopped early." in log
    it = int(snap.group(1))
    assert it >= 100
    state = caffe_pb2.SolverState()
    state.ParseFromString((tmp_path / ("snap_iter_%d.solverstate" % it)).read_bytes())
    assert state.iter == it


def test_sighup_snapshots_and_continues_then_effects_can_be_swapped(tmp_path):
    proc, out = start(tmp_path, "--sigint_effect", "none", "--sighup_effect=stop")
    try:
        out.wait_for(r"Iteration 50 \(")
        proc.send_signal(signal.SIGINT)                 # ignored
        out.wait_for(r"Iteration 150 \(")
        assert proc.poll() is None
        proc.send_signal(signal.SIGHUP)                 # now a stop
        log = out.rest()
    finally:
        proc.kill()
    assert proc.returncode == 0, log
    assert "Optimization stopped early." in log

    proc, out = start(tmp_path)
    try:
        out.wait_for(r"Iteration 50 \(")
        proc.send_signal(signal.SIGHUP)                 # default: snapshot and go on
        first = int(out.wait_for(r"Snapshotting to binary proto file snap_iter_(\d+)").group(1))
        out.wait_for(r"Iteration \d+ \(")
        assert proc.poll() is None
        proc.send_signal(signal.SIGINT)
        second = int(out.wait_for(r"Snapshotting to binary proto file snap_iter_(\d+)").group(1))
        log = out.rest()
    finally:
        proc.kill()
    assert proc.returncode == 0, log
    assert second > first


@pytest.mark.parametrize("command, words", [
    ("draw_net", ["NET.prototxt", "-rankdir", "-phase"]),
    ("plot", ["LOGFILE", "-size", "-dpi"]),
    ("parse_log", ["LOGFILE [OUTPUT_DIR]", "-delimiter"]),
    ("extract_features", ["num_mini_batches", "db_type"]),
])
def test_caffes_tools_answer_help_with_their_arguments_and_flags(command, words, capsys):
    assert cli.main([command, "-h"]) == 0
    text = capsys.readouterr().out
    for word in words:
        assert word in text, text
