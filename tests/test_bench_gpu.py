"""scripts/bench_gpu.py end to end on the emulated device, with tiny settings: its JSON has
the net's row, positive times for the net and every layer, and each convolution's flop count
from its shapes."""
import json
import os
import subprocess
import sys

from emulated_device import needs_compiler

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@needs_compiler
def test_bench_gpu_runs_on_the_emulated_device(tmp_path):
    out = tmp_path / "bench.json"
    env = dict(os.environ, POSEIDON_CAFFE_GPU="emulated",
               PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run(
        [sys.executable, os.path.join(ROOT, "scripts", "bench_gpu.py"), "--nets", "lenet",
         "--iters", "1", "--batch", "lenet=4", "--gemm-size", "64", "--json", str(out)],
        env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "EMULATED DEVICE" in proc.stdout and "not GPU times" in proc.stdout
    report = json.loads(out.read_text())
    assert report["emulated"] is True
    assert report["sgemm"]["n"] == 64 and report["sgemm"]["gflops"] > 0
    row = report["nets"]["lenet"]
    assert row["batch"] == 4 and row["ours_ms"] > 0 and row["conv_share"] > 0
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
