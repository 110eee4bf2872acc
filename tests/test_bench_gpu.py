"""scripts/bench_gpu.py end to end on the emulated device, with tiny settings: its JSON has
the net's row, positive times for the net and every layer, each convolution's flop count from
its shapes, and the host's waits per training iteration (none for LeNet and CIFAR-10 quick
with display off; the loss read of a display is one); that JSON is a compute file for
``simulate``."""
import json
import os
import subprocess
import sys

import pytest

from emulated_device import needs_compiler

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def bench_run(tmp_path_factory):
    """(stdout, report path, folder of the saved nets) of one bench_gpu run on LeNet b4."""
    folder = tmp_path_factory.mktemp("bench_gpu")
    out = folder / "bench.json"
    env = dict(os.environ, POSEIDON_CAFFE_GPU="emulated",
               PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run(
        [sys.executable, os.path.join(ROOT, "scripts", "bench_gpu.py"), "--nets",
         "lenet,cifar10_quick", "--iters", "2", "--batch", "lenet=4", "--batch",
         "cifar10_quick=2", "--gemm-size", "64", "--json", str(out),
         "--save-nets", str(folder / "nets")],
        env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout, out, folder / "nets"


@needs_compiler
def test_bench_gpu_runs_on_the_emulated_device(bench_run):
    stdout, out, _ = bench_run
    assert "EMULATED DEVICE" in stdout and "not GPU times" in stdout
    report = json.loads(out.read_text())
    assert report["emulated"] is True
    assert report["sgemm"]["n"] == 64 and report["sgemm"]["gflops"] > 0
    row = report["nets"]["lenet"]
    assert row["batch"] == 4 and row["ours_ms"] > 0 and row["conv_share"] > 0
    # a training iteration outside display makes the host wait for the device nowhere
    for name in ("lenet", "cifar10_quick"):
        net = report["nets"][name]
        assert net["train_ms"] > 0
        assert net["host_waits_per_iter"] == 0, (name, net["host_waits_per_iter"])
    assert "waits/iter" in stdout
    if report["torch"] is None:
        assert row["torch_ms"] is None and row["ratio"] is None
    names = [layer["name"] for layer in row["layers"]]
    assert names == ["data", "conv1", "pool1", "conv2", "pool2", "ip1", "relu1", "ip2", "loss"]
    layers = {layer["name"]: layer for layer in row["layers"]}
    assert all(layer["forward_ms"] > 0 for layer in row["layers"])
    # conv1: 4 images, 20 filters of 1x5x5 over 24x24 outputs; its input needs no gradient,
    # so backward is the weight gradient alone. conv2: 50 filters of 20x5x5 over 8x8, both.
    assert abs(layers["conv1"]["forward_gflop"] - 2 * 4 * 20 * 1 * 25 * 24 * 24 / 1e9) < 1e-12
    assert layers["conv1"]["backward_gflop"] == layers["conv1"]["forward_gflop"]
    assert abs(layers["conv2"]["forward_gflop"] - 2 * 4 * 50 * 20 * 25 * 8 * 8 / 1e9) < 1e-12
    assert layers["conv2"]["backward_gflop"] == 2 * layers["conv2"]["forward_gflop"]
    assert layers["conv2"]["backward_ms"] > 0 and layers["conv2"]["forward_share"] > 0


@needs_compiler
def test_the_wait_count_sees_the_loss_read_of_a_display(monkeypatch):
    """The same count with display on: a displayed iteration reads the losses kept on the
    device and, to print it, the net's output (LeNet's one loss top), two waits (so the zero
    above is a count that runs, not one that cannot move)."""
    import importlib.util
    from poseidon_caffe import backend
    spec = importlib.util.spec_from_file_location(
        "bench_gpu", os.path.join(ROOT, "scripts", "bench_gpu.py"))
    bench_gpu = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench_gpu)
    monkeypatch.setenv("POSEIDON_CAFFE_GPU", "emulated")
    backend.set_mode_gpu()
    try:
        assert bench_gpu.train_waits("lenet", 2, 2, display=1)["host_waits_per_iter"] == 2
        # iterations 2 and 3 (after the two of warm-up): only the first is displayed
        assert bench_gpu.train_waits("lenet", 2, 2, display=2)["host_waits_per_iter"] == 1
    finally:
        backend.set_mode_cpu()


@needs_compiler
def test_simulate_takes_bench_gpus_layer_times_as_its_compute(bench_run, tmp_path):
    from poseidon_caffe.tools.simulate import simulate_main
    _, out, nets = bench_run
    layers = json.loads(out.read_text())["nets"]["lenet"]["layers"]
    rows_file = tmp_path / "rows.json"
    assert simulate_main(["-model", str(nets / "lenet.prototxt"), "-nodes", "1,2",
                          "-compute", str(out), "-json", str(rows_file)]) == 0
    written = json.loads(rows_file.read_text())
    total = sum(layer["forward_ms"] + layer["backward_ms"] for layer in layers)
    assert [row["nodes"] for row in written["rows"]] == [1, 2]
    for row in written["rows"]:
        assert row["compute_ms"] == pytest.approx(total, rel=1e-9)
    assert "bench_gpu" in written["inputs"]["compute_note"]
    assert "emulated device" in written["inputs"]["compute_note"]
    # layer by layer: what the simulator schedules is each layer's benched time
    from poseidon_caffe import simulator
    model, _ = simulator.load(str(nets / "lenet.prototxt"))
    times = simulator.read_compute_file(str(out), model)
    assert times.forward_ms == [layer["forward_ms"] for layer in layers]
    assert times.backward_ms == [layer["backward_ms"] for layer in layers]
