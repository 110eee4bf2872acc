"""A net adds up the bytes its blobs will need before allocating them, and refuses to start
when that is more than the machine has; out-of-memory failures name the layer. Figures below
are worked out by hand from the shapes (float32: 4 bytes a value)."""
import os
import subprocess
import sys
import tracemalloc

import numpy as np
import pytest

from poseidon_caffe import TEST, TRAIN, io as pio, rng
from poseidon_caffe.memory import MemoryLimitError, format_bytes, parse_bytes
from poseidon_caffe.net import Net, NetError, NetMemoryError

# data (8, 1000); ip: weights 2000 x 1000, bias 2000, top (8, 2000)
BIG_TEST = """name: "big"
layer { name: "data" type: "Input" top: "data" input_param { shape { dim: 8 dim: 1000 } } }
layer { name: "ip" type: "InnerProduct" bottom: "data" top: "ip"
  inner_product_param { num_output: 2000 weight_filler { type: "gaussian" std: 0.01 } } }
"""

BIG_TRAIN = """name: "big"
layer { name: "data" type: "Input" top: "data" top: "target"
  input_param { shape { dim: 8 dim: 1000 } shape { dim: 8 dim: 2000 } } }
layer { name: "ip" type: "InnerProduct" bottom: "data" top: "ip"
  inner_product_param { num_output: 2000 weight_filler { type: "gaussian" std: 0.01 } } }
layer { name: "loss" type: "EuclideanLoss" bottom: "ip" bottom: "target" top: "loss" }
"""


def build(text, phase=TEST):
    return Net(pio.parse_net_text(text, "net.prototxt"), phase)


def test_a_test_net_needs_its_data_and_weights(monkeypatch):
    monkeypatch.delenv("POSEIDON_MEMORY_LIMIT", raising=False)
    est = build(BIG_TEST).memory_estimate()
    weights, bias, top, data = 2000 * 1000 * 4, 2000 * 4, 8 * 2000 * 4, 8 * 1000 * 4
    assert est["data"] == data + weights + bias + top == 8_104_000
    assert est["diff"] == 0 and est["workspace"] == 0
    assert dict(est["layers"]) == {"data": 32_000, "ip": 8_072_000}


def test_a_training_net_adds_the_diffs_backward_writes(monkeypatch):
    monkeypatch.delenv("POSEIDON_MEMORY_LIMIT", raising=False)
    net = build(BIG_TRAIN, TRAIN)
    est = net.memory_estimate()
    params = 2000 * 1000 * 4 + 2000 * 4
    # data: data, target, params, ip top, the loss (a 0-axis blob: one value)
    assert est["data"] == 32_000 + 64_000 + params + 64_000 + 4 == 8_168_004
    # diff: params, ip's top (the loss writes it), the loss top; none for data or target
    assert est["diff"] == params + 64_000 + 4 == 8_072_004
    assert dict(est["layers"]) == {"data": 96_000, "ip": 2 * params + 2 * 64_000, "loss": 8}
    # what one iteration really allocates: every storage once
    net.clear_param_diffs()
    net.forward_backward()
    arrays = {}
    for blob in list(net.blobs.values()) + net.learnable_params:
        for array in ([blob.data] + ([blob.diff] if blob.has_diff else [])):
            while array.base is not None:
                array = array.base
            arrays[id(array)] = array.nbytes
    assert sum(arrays.values()) == est["total"] == 16_240_008


def test_shared_storage_counts_once_and_workspaces_count(monkeypatch):
    monkeypatch.delenv("POSEIDON_MEMORY_LIMIT", raising=False)
    flat = build('name: "f" layer { name: "data" type: "Input" top: "data" '
                 'input_param { shape { dim: 8 dim: 10 dim: 10 dim: 10 } } }\n'
                 'layer { name: "flat" type: "Flatten" bottom: "data" top: "flat" }')
    assert flat.memory_estimate()["total"] == 8 * 1000 * 4
    # a strided 3x3 convolution by im2col: columns (3*9, 4*4 outputs) and the padded input
    # (3, 10, 10), batch 1
    conv = build(CONV)
    est = conv.memory_estimate()
    assert est["workspace"] == (27 * 16 + 3 * 10 * 10) * 4 == 2928
    assert est["data"] == 3 * 64 * 4 + (4 * 27 + 4) * 4 + 4 * 16 * 4 == 1472
    # max pooling 3x3, pad 1, stride 2 of 5x5: 3x3 out, windows read a 7x7 padded input
    pool = build('name: "p" layer { name: "data" type: "Input" top: "data" '
                 'input_param { shape { dim: 1 dim: 1 dim: 5 dim: 5 } } }\n'
                 'layer { name: "pool" type: "Pooling" bottom: "data" top: "pool" '
                 'pooling_param { pool: MAX kernel_size: 3 pad: 1 stride: 2 } }')
    assert pool.memory_estimate()["total"] == (25 + 9 + 49) * 4


CONV = """name: "c"
layer { name: "data" type: "Input" top: "data"
  input_param { shape { dim: 1 dim: 3 dim: 8 dim: 8 } } }
layer { name: "conv" type: "Convolution" bottom: "data" top: "conv"
  convolution_param { num_output: 4 kernel_size: 3 pad: 1 stride: 2
    weight_filler { type: "gaussian" std: 0.1 } } }
"""


def test_work_arrays_in_the_shared_scratch_count_once(monkeypatch):
    """Two 3x3 layers by Winograd and a 1x1 layer keep their work arrays in the threads'
    scratch, which they share: the net counts the largest layer's once, not their sum."""
    monkeypatch.delenv("POSEIDON_MEMORY_LIMIT", raising=False)
    # where this CPU has the direct kernels they would take the 3x3 layers, and they keep no
    # scratch: this is about Winograd's
    from poseidon_caffe.backend.cpu import direct
    monkeypatch.setattr(direct, "serves", lambda geom: False)
    layers = "".join(
        'layer { name: "%s" type: "Convolution" bottom: "%s" top: "%s" convolution_param { '
        'num_output: 16 kernel_size: %d pad: %d weight_filler { type: "gaussian" std: 0.1 } '
        'bias_term: false } }\n' % (name, bottom, name, k, k // 2)
        for name, bottom, k in (("a", "data", 3), ("b", "a", 3), ("c", "b", 1)))
    net = build('name: "w" layer { name: "data" type: "Input" top: "data" input_param { '
                'shape { dim: 2 dim: 16 dim: 32 dim: 32 } } }\n' + layers)
    plans = [type(layer._plans[0]).__name__ for layer in net.layers[1:]]
    part = lambda layer: getattr(layer._plans[0], "_make_plan", lambda n: layer._plans[0])(1)
    assert [type(part(layer)).__name__ for layer in net.layers[1:]] == \
        ["WinogradConvPlan", "WinogradConvPlan", "PointwiseConvPlan"], plans
    # both images' 8x8 tiles of 4x4 outputs: 36 positions x 64 tiles x (16 + 16 channels in,
    # 16 + 16 out), and the 16 input planes padded to 34x34 (on one thread or two, 2 images)
    scratch = (36 * 2 * 64 * 64 + 2 * 16 * 34 * 34) * 4
    assert scratch == 1_327_616
    # with the batch cut over two threads (a batch of 2 is cut only where 2 threads are
    # configured), the second thread's scratch also holds a partial weight and bias gradient:
    # the 3x3 layer's, the largest
    from poseidon_caffe.backend import get_backend
    parts = 2 if get_backend().split_threads == 2 else 1
    partials = (parts - 1) * (16 * 16 * 9 + 16) * 4
    assert net.memory_estimate()["workspace"] == scratch + partials


def test_a_net_over_the_limit_stops_before_allocating(monkeypatch):
    monkeypatch.setenv("POSEIDON_MEMORY_LIMIT", "4M")
    before = rng.get_state()
    tracemalloc.start()
    try:
        with pytest.raises(NetMemoryError) as info:
            build(BIG_TEST)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert str(info.value) == ("net big needs 7.7 MiB for blobs (largest: layer "
                               "ip, 7.7 MiB); the limit POSEIDON_MEMORY_LIMIT is 4.0 MiB")
    assert peak < 1 << 20                   # the 8 MB of weights and blobs were never made
    assert rng.get_state() == before        # nor were the weights drawn
    monkeypatch.setenv("POSEIDON_MEMORY_LIMIT", "8M")
    assert build(BIG_TEST).memory_needed == 8_104_000


def test_an_absurd_pooling_is_refused_naming_its_layer(monkeypatch):
    monkeypatch.delenv("POSEIDON_MEMORY_LIMIT", raising=False)
    # stride 2e9 makes a 2x2 output whose last window starts 2e9 cells out
    with pytest.raises(NetMemoryError, match=r"^net p needs \d+\.\d GiB for blobs \(largest: "
                                             r"layer pool, \d+\.\d GiB\); "):
        Net(pio.parse_net_text(
            'name: "p" layer { name: "data" type: "Input" top: "data" '
            'input_param { shape { dim: 1 dim: 1 dim: 5 dim: 5 } } }\n'
            'layer { name: "pool" type: "Pooling" bottom: "data" top: "pool" '
            'pooling_param { pool: MAX kernel_size: 3 stride: 2000000000 } }'), TEST)


def test_deferred_weights_are_drawn_in_the_order_caffe_draws_them():
    rng.set_random_seed(7)
    net = build('name: "m" layer { name: "data" type: "Input" top: "data" '
                'input_param { shape { dim: 2 dim: 3 } } }\n'
                'layer { name: "ip1" type: "InnerProduct" bottom: "data" top: "h" '
                'inner_product_param { num_output: 4 weight_filler { type: "gaussian" std: 2 } '
                'bias_filler { type: "uniform" min: -1 max: 1 } } }\n'
                'layer { name: "ip2" type: "InnerProduct" bottom: "h" top: "o" '
                'inner_product_param { num_output: 2 weight_filler { type: "uniform" '
                'min: 0 max: 3 } } }')
    draws = np.random.default_rng(7)
    w1 = draws.standard_normal((4, 3), dtype=np.float32) * np.float32(2)
    b1 = draws.random((4,), dtype=np.float32) * np.float32(2) + np.float32(-1)
    w2 = draws.random((2, 4), dtype=np.float32) * np.float32(3)
    np.testing.assert_array_equal(net.params["ip1"][0].data, w1)
    np.testing.assert_array_equal(net.params["ip1"][1].data, b1)
    np.testing.assert_array_equal(net.params["ip2"][0].data, w2)


def test_out_of_memory_while_running_names_the_layer(monkeypatch):
    monkeypatch.delenv("POSEIDON_MEMORY_LIMIT", raising=False)
    net = build(CONV)

    def exhausted(bottom, top):
        raise MemoryError()
    monkeypatch.setattr(net.layers[1], "forward", exhausted)
    with pytest.raises(NetMemoryError, match=r"^layer 'conv' of type Convolution: out of memory "
                                             r"in forward \(MemoryError\)$"):
        net.forward()


def test_out_of_memory_drawing_the_initial_weights_names_the_layer(monkeypatch):
    # the estimate passes (a generous limit), then the weight filler's draw cannot allocate
    monkeypatch.setenv("POSEIDON_MEMORY_LIMIT", "100T")
    from poseidon_caffe import fillers

    def exhausted(blob, filler_param):
        raise MemoryError("Unable to allocate 7.5 MiB")
    monkeypatch.setitem(fillers._FILLERS, "gaussian", exhausted)
    with pytest.raises(NetMemoryError, match=r"^layer 'ip': out of memory drawing the "
                                             r"initial values of a blob of shape "
                                             r"\(2000, 1000\) \(Unable to allocate 7.5 MiB\)$"):
        build(BIG_TEST)


def test_memory_amounts_read_and_written():
    assert parse_bytes("100") == 100
    assert parse_bytes("512M") == 512 * 1024 ** 2
    assert parse_bytes("1.5G") == 3 * 1024 ** 3 // 2
    assert parse_bytes("2GiB") == 2 * 1024 ** 3
    with pytest.raises(MemoryLimitError, match="POSEIDON_MEMORY_LIMIT='lots' is not an amount"):
        parse_bytes("lots")
    assert [format_bytes(n) for n in (17, 3 * 1024, 12 * 1024 ** 2, 3 * 1024 ** 3 // 2)] == \
        ["17 B", "3.0 KiB", "12.0 MiB", "1.5 GiB"]


def cli(tmp_path, *args, env=None):
    full_env = {k: v for k, v in os.environ.items() if k != "POSEIDON_MEMORY_LIMIT"}
    full_env.update(env or {})
    proc = subprocess.run([sys.executable, "-m", "poseidon_caffe.cli"] + list(args),
                          cwd=str(tmp_path), capture_output=True, text=True, timeout=120,
                          env=full_env)
    return proc.returncode, proc.stderr


def test_time_prints_the_memory_figure(tmp_path):
    (tmp_path / "conv.prototxt").write_text(CONV)
    code, err = cli(tmp_path, "time", "-model", "conv.prototxt", "-phase", "TEST",
                    "-iterations", "1")
    assert code == 0, err
    # data 1472 B, workspace 2928 B; the conv layer holds all but the 768 B input
    assert ("Memory needed for blobs: 4.3 KiB (data 1.4 KiB, diff 0 B, workspaces 2.9 KiB); "
            "largest: layer conv, 3.5 KiB") in err


def test_train_over_the_limit_is_one_line_and_no_traceback(tmp_path):
    (tmp_path / "net.prototxt").write_text(BIG_TRAIN)
    (tmp_path / "solver.prototxt").write_text(
        'net: "net.prototxt" base_lr: 0.1 lr_policy: "fixed" max_iter: 1')
    code, err = cli(tmp_path, "train", "-solver", "solver.prototxt",
                    env={"POSEIDON_MEMORY_LIMIT": "8M"})
    assert code == 1 and "Traceback" not in err
    errors = [line for line in err.splitlines() if line.startswith("E")]
    assert len(errors) == 1
    assert errors[0].endswith("net big needs 15.5 MiB for blobs (largest: layer ip, 15.4 MiB); "
                              "the limit POSEIDON_MEMORY_LIMIT is 8.0 MiB")


def test_ranks_on_one_host_share_its_available_memory():
    from poseidon_caffe import memory
    total = memory._mem_available()
    if total is None:
        pytest.skip("no /proc/meminfo here")
    limit, has = memory.available_memory({"MPI_LOCALNRANKS": "4"})
    assert abs(limit - total // 4) < total // 20      # MemAvailable moves a little between reads
    assert has.startswith("this machine has ") and has.endswith(" for each of its 4 ranks")
    # an explicit limit is this process's own
    assert memory.available_memory({"MPI_LOCALNRANKS": "4", "POSEIDON_MEMORY_LIMIT": "1G"}) == \
        (1 << 30, "the limit POSEIDON_MEMORY_LIMIT is 1.0 GiB")


def test_a_shape_whose_count_overflows_is_refused_naming_the_layer():
    # 2**62 * 4 values wraps to 0 in 64-bit arithmetic; it must not pass as an empty blob
    with pytest.raises(NetError, match=r"layer 'data' of type Input could not be set up .*"
                                       r"has 18446744073709551616 values, more than an array "
                                       r"can index"):
        build('name: "o" layer { name: "data" type: "Input" top: "data" '
              'input_param { shape { dim: 4611686018427387904 dim: 4 } } }')


def test_out_of_memory_in_an_update_names_the_parameter_and_layer(monkeypatch, tmp_path):
    from poseidon_caffe.solver import SolverError, get_solver, updates
    monkeypatch.delenv("POSEIDON_MEMORY_LIMIT", raising=False)
    (tmp_path / "net.prototxt").write_text(BIG_TRAIN.replace("2000", "20"))
    solver = get_solver(pio.parse_solver_text(
        'net: "%s" base_lr: 0.1 lr_policy: "fixed" max_iter: 1' % (tmp_path / "net.prototxt")))

    def exhausted(*args):
        raise MemoryError()
    monkeypatch.setattr(updates, "sgd", exhausted)
    with pytest.raises(SolverError, match=r"^Iteration 0: out of memory updating learnable "
                                          r"parameter #0 \(layer ip\)$"):
        solver.step(1)
