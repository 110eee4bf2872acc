"""scripts/bench.py's README table and its load guard, and scripts/roofline.py, end to end on
LeNet with tiny settings (real worker processes, no PyTorch needed)."""
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCH = os.path.join(ROOT, "scripts", "bench.py")
ROOFLINE = os.path.join(ROOT, "scripts", "roofline.py")
NO_TORCH = ["--torch", os.path.join(ROOT, "no-such-python")]


def _run(script, *args):
    return subprocess.run([sys.executable, script] + list(args), capture_output=True,
                          text=True, cwd=ROOT, timeout=600)


def _table_rows(stdout):
    return [line for line in stdout.splitlines() if line.startswith("| LeNet")]


def test_readme_table_of_a_quiet_run_has_every_row_in_readmes_form():
    proc = _run(BENCH, "--nets", "lenet", "--threads", "1,2", "--iters", "1", "--readme",
                "--max-load", "1000", "--max-others", "1000", *NO_TORCH)
    assert proc.returncode == 0, proc.stderr
    assert "NOT FOR README" not in proc.stdout
    assert "| net, batch | threads | ours ms | PyTorch ms | ratio |" in proc.stdout
    assert "| load, others |" in proc.stdout
    rows = _table_rows(proc.stdout)
    assert [r.split("|")[2].strip() for r in rows] == ["1", "2"]
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert float(cells[2]) > 0                      # ours ms
        assert cells[3] == "-" and cells[4] == "-"      # no PyTorch here
        load, others = (float(v) for v in cells[6].split(", "))
        assert load >= 0 and 0 <= others < 1000 and "busy" not in cells[6]


def test_readme_table_is_refused_when_a_row_ran_above_the_load_limit():
    # a load limit below zero: every row is over it, as on a busy machine
    proc = _run(BENCH, "--nets", "lenet", "--threads", "1", "--iters", "1", "--readme",
                "--max-load", "-1", *NO_TORCH)
    assert proc.returncode == 3
    assert "NOT FOR README" in proc.stdout
    rows = _table_rows(proc.stdout)
    assert len(rows) == 1 and "(busy)" in rows[0]


def test_roofline_reports_each_layer_against_the_measured_limits(tmp_path):
    out = tmp_path / "roofline.json"
    proc = _run(ROOFLINE, "--nets", "lenet", "--threads", "1", "--iters", "1",
                "--gemm-size", "256", "--copy-mb", "8", "--json", str(out))
    assert proc.returncode == 0, proc.stderr
    (result,) = json.loads(out.read_text())
    limits = result["limits"]
    assert limits["sgemm_gflops"] > 0 and limits["copy_gbs"] > 0 and limits["pass_gbs"] > 0
    assert "a pass writing through the cache: %.1f GB/s" % limits["pass_gbs"] in proc.stdout
    layers = {layer["name"]: layer for layer in result["layers"]}
    assert set(layers) == {"conv1", "pool1", "conv2", "pool2", "ip1", "relu1", "ip2", "loss"}
    # conv1: 64 images, 20 maps of 24x24, 1x5x5 taps; the net needs no data gradient there
    conv1 = layers["conv1"]
    assert conv1["kind"] == "flops"
    assert conv1["forward"] == 2.0 * 64 * 20 * 24 * 24 * 25
    assert conv1["backward"] == conv1["forward"]
    assert layers["conv2"]["backward"] == 2 * layers["conv2"]["forward"]
    # pool1 (MAX): reads 64x20x24x24 floats, writes a quarter; backward reads the top
    # gradient and the winners, writes the bottom gradient
    pool1, cells = layers["pool1"], 64 * 20 * 24 * 24
    assert pool1["kind"] == "bytes"
    assert pool1["forward"] == 4.0 * (cells + cells // 4)
    assert pool1["backward"] == 4.0 * (cells // 4 + cells + cells // 4)
    assert all(layer["forward_s"] > 0 for layer in result["layers"])
    assert "conv1" in proc.stdout and "GF/s" in proc.stdout and "GB/s" in proc.stdout
    assert "convolutions overall" in proc.stdout


def _bench_module():
    import importlib.util
    spec = importlib.util.spec_from_file_location("bench_script", BENCH)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    return bench


def _row(threads, load, others):
    result = {"ms": 10.0, "cpu_ms": 10.0, "peak_mib": 90.0, "base_mib": 60.0}
    return {"net": "lenet", "threads": threads, "ours": result, "theirs": None, "load": load,
            "others": others}


def test_a_row_is_busy_when_other_processes_used_the_cores():
    """The guard is what other processes used while the row ran; the load average, which
    counts the bench's own processes and lags a minute, only where --max-load asks."""
    bench = _bench_module()
    lines, quiet = bench.readme_table([_row(1, 1.9, 0.1), _row(2, 2.7, 0.2)], 0.25)
    assert quiet and not any("busy" in line for line in lines)
    assert lines[2].endswith("| 1.90, 0.10 |")
    lines, quiet = bench.readme_table([_row(2, 2.0, 0.4)], 0.25)
    assert not quiet and "(busy)" in lines[-1]
    # --max-load: a two-thread row's own second thread is not other work
    assert bench.readme_table([_row(2, 2.4, 0.0)], 0.25, max_load=1.5)[1]
    assert not bench.readme_table([_row(2, 2.6, 0.0)], 0.25, max_load=1.5)[1]
    assert not bench.readme_table([_row(1, 1.6, 0.0)], 0.25, max_load=1.5)[1]


def test_other_processes_cpu_time_leaves_out_the_bench_and_its_children(tmp_path):
    import signal
    import time
    bench = _bench_module()
    child = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.3)
        after = bench.other_cpu_seconds()
        assert child.pid not in after and os.getpid() not in after
    finally:
        child.kill()
        child.wait()
    # an orphan (its shell exits at once) is no longer this process's: it is counted, and the
    # CPU it spins on shows between two readings
    pid_file = tmp_path / "pid"
    subprocess.run(["sh", "-c", "%s -c 'while True: pass' >/dev/null 2>&1 & echo $! > %s"
                    % (sys.executable, pid_file)], check=True)
    orphan = int(pid_file.read_text())
    try:
        time.sleep(0.3)
        before = bench.other_cpu_seconds()
        time.sleep(1.0)
        after = bench.other_cpu_seconds()
    finally:
        os.kill(orphan, signal.SIGKILL)
    assert after[orphan] > before[orphan]


def test_others_load_averages_the_cpu_the_others_used_over_the_wall_time():
    bench = _bench_module()
    # pid 1 ran 0.5 s more, pid 5 ended (not counted), pid 6 started and ran 0.5 s
    assert bench.others_load({1: 2.0, 5: 1.0}, {1: 2.5, 6: 0.5}, 2.0) == 0.5
    assert bench.others_load({1: 2.0}, {1: 2.0}, 2.0) == 0.0


def test_roofline_counts_what_relu_and_dropout_backward_must_read():
    """ReLU's backward reads its input again; Dropout's reads nothing of its forward (its
    draws are made again from a key): the top gradient read and the bottom's written."""
    import importlib.util
    from google.protobuf import text_format
    from poseidon_caffe.net import Net
    from poseidon_caffe.proto import caffe_pb2
    spec = importlib.util.spec_from_file_location("roofline_script", ROOFLINE)
    roofline = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(roofline)
    net = Net(text_format.Parse('''
        layer { name: "d" type: "DummyData" top: "x" top: "label" dummy_data_param {
          shape { dim: 4 dim: 6 } shape { dim: 4 } } }
        layer { name: "ip" type: "InnerProduct" bottom: "x" top: "h"
          inner_product_param { num_output: 10 weight_filler { type: "xavier" } } }
        layer { name: "relu" type: "ReLU" bottom: "h" top: "r" }
        layer { name: "drop" type: "Dropout" bottom: "r" top: "o" }
        layer { name: "loss" type: "SoftmaxWithLoss" bottom: "o" bottom: "label" top: "l" }
        ''', caffe_pb2.NetParameter()), caffe_pb2.TRAIN)
    work = {name: roofline.layer_work(net, i) for i, name in enumerate(net.layer_names)}
    blob = 4.0 * 4 * 10
    assert work["relu"] == ("bytes", 2 * blob, 3 * blob)
    assert work["drop"] == ("bytes", 2 * blob, 2 * blob)


def _roofline_module():
    import importlib.util
    spec = importlib.util.spec_from_file_location("roofline_script", ROOFLINE)
    roofline = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(roofline)
    return roofline


def test_roofline_describes_each_memory_bound_layer_for_the_peer():
    """What peer_layers.py builds PyTorch's counterpart from: the inputs' shapes and the
    parameters as the layer reads them (kernel_h/w, a leaky slope, global pooling's window
    of the whole map, Eltwise's coefficients), and whether the net runs its backward."""
    from google.protobuf import text_format
    from poseidon_caffe.net import Net
    from poseidon_caffe.proto import caffe_pb2
    roofline = _roofline_module()
    net = Net(text_format.Parse('''
        layer { name: "d" type: "DummyData" top: "x" top: "label" dummy_data_param {
          shape { dim: 2 dim: 3 dim: 9 dim: 7 } shape { dim: 2 } } }
        layer { name: "conv" type: "Convolution" bottom: "x" top: "c"
          convolution_param { num_output: 4 kernel_size: 1 weight_filler { type: "xavier" } } }
        layer { name: "relu" type: "ReLU" bottom: "c" top: "c" relu_param { negative_slope: 0.25 } }
        layer { name: "pool" type: "Pooling" bottom: "c" top: "p"
          pooling_param { pool: MAX kernel_h: 3 kernel_w: 2 stride_h: 2 stride_w: 1 pad_h: 1
          pad_w: 0 } }
        layer { name: "norm" type: "LRN" bottom: "p" top: "n"
          lrn_param { local_size: 3 alpha: 0.5 beta: 0.75 k: 2 } }
        layer { name: "sum" type: "Eltwise" bottom: "n" bottom: "p" top: "s"
          eltwise_param { operation: SUM coeff: 2 coeff: -1 } }
        layer { name: "g" type: "Pooling" bottom: "s" top: "g"
          pooling_param { pool: AVE global_pooling: true } }
        layer { name: "cat" type: "Concat" bottom: "g" bottom: "g" top: "cat" }
        layer { name: "loss" type: "SoftmaxWithLoss" bottom: "cat" bottom: "label" top: "l" }
        ''', caffe_pb2.NetParameter()), caffe_pb2.TRAIN)
    ops = {name: roofline.peer_operation(net, i) for i, name in enumerate(net.layer_names)
           if roofline.layer_work(net, i)[0] == "bytes"}
    assert set(ops) == {"relu", "pool", "norm", "sum", "g", "cat", "loss"}
    assert ops["relu"] == {"type": "ReLU", "bottoms": [[2, 4, 9, 7]], "backward": True,
                           "slope": 0.25}
    assert ops["pool"] == {"type": "Pooling", "bottoms": [[2, 4, 9, 7]], "backward": True,
                           "method": caffe_pb2.PoolingParameter.MAX, "kernel": [3, 2],
                           "stride": [2, 1], "pad": [1, 0]}
    pooled = [2, 4, 5, 6]                                 # (9 + 2 - 3) / 2 + 1, 7 - 2 + 1
    assert ops["norm"] == {"type": "LRN", "bottoms": [pooled], "backward": True, "size": 3,
                           "alpha": 0.5, "beta": 0.75, "k": 2.0, "across_channels": True}
    assert ops["sum"]["bottoms"] == [pooled, pooled]
    assert ops["sum"]["operation"] == caffe_pb2.EltwiseParameter.SUM
    assert ops["sum"]["coeffs"] == [2.0, -1.0]
    assert ops["g"]["kernel"] == [5, 6] and ops["g"]["stride"] == [1, 1]
    assert ops["g"]["method"] == caffe_pb2.PoolingParameter.AVE
    assert ops["cat"] == {"type": "Concat", "bottoms": [[2, 4, 1, 1]] * 2, "backward": True,
                          "axis": 1}
    # the labels are left out: the peer draws its own
    assert ops["loss"] == {"type": "SoftmaxWithLoss", "bottoms": [[2, 8, 1, 1]],
                           "backward": True, "axis": 1}


def test_roofline_reports_the_peer_beside_ours_alone():
    """The last two columns: each direction's bytes over its seconds as a share of the
    copy bandwidth, for ours alone and PyTorch's; a layer is named where PyTorch's took
    less time than ours alone, and one without a counterpart shows dashes."""
    import io
    roofline = _roofline_module()
    layer = {"name": "pool1", "type": "Pooling", "kind": "bytes", "plan": "",
             "forward": 4e6, "backward": 6e6, "forward_s": 4e-4, "backward_s": 5e-4}
    result = {"net": "lenet", "threads": 1, "load": 0.5,
              "limits": {"sgemm_gflops": 100.0, "copy_gbs": 20.0},
              "layers": [dict(layer, alone_s=[2e-4, 1e-3], peer_s=[4e-4, 6e-4]),
                         dict(layer, name="norm1", type="LRN", alone_s=[2e-4, 1e-3],
                              peer_s=None)]}
    out = io.StringIO()
    roofline.report(result, out)
    text = out.getvalue()
    assert "alone f/b" in text and "PyTorch f/b" in text
    rows = {line.split()[0]: line for line in text.splitlines() if line.startswith("  ")}
    # 4 MB in 0.2 ms: 20 GB/s, 100%; 6 MB in 1 ms: 30%; PyTorch's 50% and 50%
    assert rows["pool1"].endswith("     100/ 30%       50/ 50%")
    assert rows["norm1"].split()[-2:] == ["-", "-"]
    # PyTorch's backward (0.6 ms) beat ours alone (1 ms); its forward did not
    assert text.splitlines()[-1] == ("  memory-bound where PyTorch's same operation alone "
                                     "is faster than ours alone: pool1")


def test_roofline_says_in_one_line_when_the_peer_python_has_no_torch(tmp_path):
    out = tmp_path / "roofline.json"
    proc = _run(ROOFLINE, "--nets", "lenet", "--threads", "1", "--iters", "1",
                "--gemm-size", "256", "--copy-mb", "8", "--json", str(out),
                "--torch", sys.executable)
    assert proc.returncode == 0, proc.stderr
    (line,) = [l for l in proc.stderr.splitlines() if l.startswith("roofline:")]
    assert "PyTorch's layers not timed with %s (lenet, 1 threads)" % sys.executable in line
    assert "torch" in line.split(": ", 2)[-1]             # the worker's own last line
    (result,) = json.loads(out.read_text())
    memory = [layer for layer in result["layers"] if layer["kind"] == "bytes"]
    assert memory and all(len(layer["alone_s"]) == 2 and layer["alone_s"][0] > 0 and
                          "peer_s" not in layer for layer in memory)
    assert "PyTorch f/b" not in proc.stdout
