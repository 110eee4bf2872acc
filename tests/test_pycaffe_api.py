"""The pycaffe surface BVLC's Python code uses: the Net's underscore internals, per-layer
callbacks, HDF5 weights, solver callbacks, lr and share_weights, Timer, log, the solver group
and NCCL in one process. Expected values are worked out by hand or read back with h5py."""
import logging
import os
import subprocess
import sys
import time

import h5py
import numpy as np
import pytest

import poseidon_caffe as caffe
from poseidon_caffe import data as data_pkg
from poseidon_caffe import staging
from poseidon_caffe import solver_group
from poseidon_caffe.net import NetError
from poseidon_caffe.net_hdf5 import HDF5WeightsError
from poseidon_caffe.sync.nccl_api import NCCLError

# data(2x3) -> ip(2 outputs) -> relu (in place) -> Euclidean loss against "target";
# "label" is unused (an output); the Input layers compute no backward
NET = """name: "tiny"
layer { name: "data" type: "Input" top: "data" top: "label"
  input_param { shape { dim: 2 dim: 3 } shape { dim: 2 } } }
layer { name: "ip" type: "InnerProduct" bottom: "data" top: "ip"
  inner_product_param { num_output: 2 weight_filler { type: "constant" value: 0.5 }
                        bias_filler { type: "constant" value: 0.25 } } }
layer { name: "relu" type: "ReLU" bottom: "ip" top: "ip" }
layer { name: "target_in" type: "Input" top: "target" input_param { shape { dim: 2 dim: 2 } } }
layer { name: "loss" type: "EuclideanLoss" bottom: "ip" bottom: "target" top: "loss" }
"""


@pytest.fixture
def net_file(tmp_path):
    path = tmp_path / "tiny.prototxt"
    path.write_text(NET)
    return str(path)


@pytest.fixture
def net(net_file):
    n = caffe.Net(net_file, caffe.TRAIN)
    n.blobs["data"].data[...] = [[1, 2, 3], [-1, 0, 1]]
    n.blobs["target"].data[...] = [[1, 0], [0, 1]]
    return n


@pytest.fixture(autouse=True)
def single_solver():
    yield
    solver_group.set_solver_count(1)
    solver_group.set_solver_rank(0)
    solver_group.set_multiprocess(False)
    data_pkg.set_worker(0, 1)


# -- the underscore internals --------------------------------------------------------------

def test_underscore_internals_describe_the_graph(net):
    assert net._layer_names == ["data", "ip", "relu", "target_in", "loss"]
    assert net._blob_names == ["data", "label", "ip", "target", "loss"]
    names = net._blob_names
    assert [names[i] for i in net._inputs] == ["data", "label", "target"]
    assert [names[i] for i in net._outputs] == ["label", "loss"]
    assert [names[i] for i in net._bottom_ids(4)] == ["ip", "target"]
    assert [names[i] for i in net._top_ids(0)] == ["data", "label"]
    assert [names[i] for i in net._top_ids(2)] == ["ip"]          # in place
    assert list(net._blob_loss_weights) == [0, 0, 0, 0, 1]


def test_underscore_forward_and_backward_run_a_layer_range(net):
    # ip = relu(0.5 * sum(x) + 0.25): sums 6 and 0 -> 3.25 and 0.25 on both outputs
    loss = net._forward(0, len(net.layers) - 1)
    expected_ip = np.array([[3.25, 3.25], [0.25, 0.25]])
    np.testing.assert_allclose(net.blobs["ip"].data, expected_ip)
    diff = expected_ip - [[1, 0], [0, 1]]
    assert loss == pytest.approx((diff ** 2).sum() / 2 / 2)
    # a range that stops before the loss leaves it alone
    net.blobs["loss"].data[...] = -7
    net._forward(1, 2)
    assert float(net.blobs["loss"].data) == -7
    net._forward(0, 4)
    net._backward(4, 0)
    # dL/dip = diff / batch; dL/dW = (dL/dip)^T x
    x = np.array([[1, 2, 3], [-1, 0, 1]], dtype=np.float64)
    np.testing.assert_allclose(net.params["ip"][0].diff, (diff / 2).T @ x, rtol=1e-6)


def test_set_input_arrays_takes_4d_labels_and_points_at_the_arrays(tmp_path):
    path = tmp_path / "memory.prototxt"
    path.write_text('layer { name: "m" type: "MemoryData" top: "data" top: "label" '
                    'memory_data_param { batch_size: 2 channels: 1 height: 1 width: 2 } }')
    net = caffe.Net(str(path), caffe.TEST)
    data = np.arange(8, dtype=np.float32).reshape(4, 1, 1, 2)
    labels = np.array([5, 6, 7, 8], dtype=np.float32).reshape(4, 1, 1, 1)
    net._set_input_arrays(data, labels)
    data[2:] += 100               # held by reference, as pycaffe's
    net.forward()
    np.testing.assert_array_equal(net.blobs["label"].data.ravel(), [5, 6])
    net.forward()
    np.testing.assert_array_equal(net.blobs["data"].data.ravel(), [104, 105, 106, 107])
    with pytest.raises(NetError, match="labels array must be 4-d"):
        net._set_input_arrays(data, labels.ravel())


# -- per-layer callbacks -------------------------------------------------------------------

def test_layer_callbacks_run_around_every_layer_in_order(net):
    calls = []
    for kind in ("before_forward", "after_forward", "before_backward", "after_backward"):
        getattr(net, kind)(lambda i, kind=kind: calls.append((kind, i)))
    seen_ip_in_after_forward = []
    net.after_forward(lambda i: seen_ip_in_after_forward.append(
        net.blobs["ip"].data.copy()) if i == 1 else None)
    net.forward()
    n = len(net.layers)
    assert calls == [(k, i) for i in range(n) for k in ("before_forward", "after_forward")]
    # after layer 1 ran, before the in-place ReLU: the affine output, unclipped
    np.testing.assert_allclose(seen_ip_in_after_forward[0], [[3.25, 3.25], [0.25, 0.25]])
    calls.clear()
    net.backward()
    # every layer of the range, including those that compute no backward (the inputs)
    assert calls == [(k, i) for i in reversed(range(n))
                     for k in ("before_backward", "after_backward")]


def test_layer_callback_must_be_callable(net):
    with pytest.raises(TypeError, match="before_forward takes a callable"):
        net.before_forward(3)


# -- HDF5 weights --------------------------------------------------------------------------

def test_save_hdf5_writes_caffes_layout(net, tmp_path):
    net.params["ip"][0].data[...] = [[1, 2, 3], [4, 5, 6]]
    path = str(tmp_path / "w.h5")
    net.save_hdf5(path)
    with h5py.File(path, "r") as f:
        assert list(f.keys()) == ["data"]
        # one group per layer, parameters or not
        assert sorted(f["data"].keys()) == sorted(net._layer_names)
        assert list(f["data/relu"].keys()) == []
        np.testing.assert_array_equal(f["data/ip/0"][()], [[1, 2, 3], [4, 5, 6]])
        np.testing.assert_array_equal(f["data/ip/1"][()], [0.25, 0.25])
        assert f["data/ip/0"].dtype == np.float32


def test_save_hdf5_removes_what_a_killed_save_left_and_leaves_no_temporary(net, tmp_path):
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    folder = tmp_path / "weights"
    folder.mkdir()
    left = folder / (".w.h5.p%d-00ff-%s.tmp" % (int(done.stdout), staging._host()))
    left.write_bytes(b"half an hdf5 file")
    net.save_hdf5(str(folder / "w.h5"))
    assert sorted(os.listdir(folder)) == ["w.h5"]


def test_load_hdf5_copies_by_layer_name(net, net_file, tmp_path):
    path = str(tmp_path / "w.h5")
    with h5py.File(path, "w") as f:
        f.create_dataset("data/ip/0", data=np.full((2, 3), 9, np.float32))
        f.create_dataset("data/ip/1", data=np.array([1, 2], np.float32))
        f.create_dataset("data/not_in_net/0", data=np.zeros(4, np.float32))
    net.load_hdf5(path)
    np.testing.assert_array_equal(net.params["ip"][0].data, np.full((2, 3), 9))
    np.testing.assert_array_equal(net.params["ip"][1].data, [1, 2])
    # round trip through save_hdf5 into a fresh net
    net.save_hdf5(str(tmp_path / "again.h5"))
    fresh = caffe.Net(net_file, caffe.TEST)
    fresh.load_hdf5(str(tmp_path / "again.h5"))
    np.testing.assert_array_equal(fresh.params["ip"][0].data, np.full((2, 3), 9))


def test_load_hdf5_names_the_mismatch(net, tmp_path):
    path = str(tmp_path / "bad.h5")
    with h5py.File(path, "w") as f:
        f.create_dataset("data/ip/0", data=np.zeros((5, 5), np.float32))
        f.create_dataset("data/ip/1", data=np.zeros(2, np.float32))
    with pytest.raises(HDF5WeightsError, match=r"param 0 of layer ip from .*bad.h5"):
        net.load_hdf5(path)
    with pytest.raises(HDF5WeightsError, match="no such file"):
        net.load_hdf5(str(tmp_path / "missing.h5"))


def test_hdf5_writes_a_shared_parameter_once_under_its_owner(tmp_path):
    path = tmp_path / "shared.prototxt"
    path.write_text("""
layer { name: "in" type: "Input" top: "x" input_param { shape { dim: 1 dim: 2 } } }
layer { name: "a" type: "InnerProduct" bottom: "x" top: "a" param { name: "w" }
  inner_product_param { num_output: 2 bias_term: false weight_filler { type: "gaussian" } } }
layer { name: "b" type: "InnerProduct" bottom: "a" top: "b" param { name: "w" }
  inner_product_param { num_output: 2 bias_term: false } }
""")
    net = caffe.Net(str(path), caffe.TEST)
    net.save_hdf5(str(tmp_path / "s.h5"))
    with h5py.File(str(tmp_path / "s.h5"), "r") as f:
        assert list(f["data/a"].keys()) == ["0"]
        assert list(f["data/b"].keys()) == []
        saved = f["data/a/0"][()]
    other = caffe.Net(str(path), caffe.TEST)
    other.load_hdf5(str(tmp_path / "s.h5"))
    np.testing.assert_array_equal(other.params["b"][0].data, saved)


# -- the solver ----------------------------------------------------------------------------

def write_solver(tmp_path, net_file, extra=""):
    path = tmp_path / "solver.prototxt"
    path.write_text('net: "%s"\nbase_lr: 0.1 lr_policy: "step" gamma: 0.5 stepsize: 2\n'
                    'momentum: 0 weight_decay: 0 display: 0 max_iter: 3\n'
                    'snapshot_prefix: "%s"\n%s' % (net_file, tmp_path / "snap", extra))
    return str(path)


def feed(net):
    net.blobs["data"].data[...] = [[1, 2, 3], [-1, 0, 1]]
    net.blobs["target"].data[...] = [[1, 0], [0, 1]]


def test_solver_callbacks_run_before_forward_and_before_the_update(net_file, tmp_path):
    solver = caffe.SGDSolver(write_solver(tmp_path, net_file))
    feed(solver.net)
    weight = solver.net.params["ip"][0]
    events = []
    solver.add_callback(
        lambda: events.append(("start", solver.iter, float(np.abs(weight.diff).sum()))),
        lambda: events.append(("ready", solver.iter, weight.data.copy(), weight.diff.copy())))
    before = weight.data.copy()
    solver.step(1)
    assert events[0] == ("start", 0, 0.0)      # diffs cleared, nothing computed yet
    kind, it, data_seen, diff_seen = events[1]
    assert (kind, it) == ("ready", 0)
    np.testing.assert_array_equal(data_seen, before)        # not yet updated
    np.testing.assert_allclose(weight.data, before - 0.1 * diff_seen, rtol=1e-6)


def test_solver_callback_object_and_bad_arguments(net_file, tmp_path):
    solver = caffe.SGDSolver(write_solver(tmp_path, net_file))
    feed(solver.net)

    class Counter:
        starts = ready = 0

        def on_start(self):
            self.starts += 1

        def on_gradients_ready(self):
            self.ready += 1

    counter = Counter()
    solver.add_callback(counter)
    solver.step(3)
    assert (counter.starts, counter.ready) == (3, 3)
    with pytest.raises(TypeError, match="add_callback takes two callables"):
        solver.add_callback(object())


def test_solver_lr_follows_the_policy(net_file, tmp_path):
    solver = caffe.SGDSolver(write_solver(tmp_path, net_file))
    feed(solver.net)
    rates = []
    for _ in range(5):
        rates.append(solver.lr)
        solver.step(1)
    # step policy: 0.1 * 0.5 ^ floor(iter / 2)
    assert rates == pytest.approx([0.1, 0.1, 0.05, 0.05, 0.025])


def test_share_weights_gives_a_net_the_training_weights(net_file, tmp_path):
    solver = caffe.SGDSolver(write_solver(tmp_path, net_file))
    feed(solver.net)
    other = caffe.Net(net_file, caffe.TEST)
    solver.share_weights(other)
    solver.step(1)
    np.testing.assert_array_equal(other.params["ip"][0].data, solver.net.params["ip"][0].data)
    solver.net.params["ip"][0].data[0, 0] = 42
    assert other.params["ip"][0].data[0, 0] == 42


# -- solver group ----------------------------------------------------------------------------

def test_solver_group_gives_the_data_layers_their_share_and_gates_the_root(net_file, tmp_path):
    assert (caffe.solver_count(), caffe.solver_rank()) == (1, 0)
    caffe.set_solver_count(2)
    caffe.set_solver_rank(1)
    caffe.set_multiprocess(True)
    assert (caffe.solver_count(), caffe.solver_rank(), caffe.multiprocess()) == (2, 1, True)
    assert data_pkg.get_worker()[:2] == (1, 2)
    # a non-root solver neither tests nor writes snapshots
    solver = caffe.SGDSolver(write_solver(tmp_path, net_file,
                                          "snapshot: 1\ntest_iter: 1 test_interval: 1\n"
                                          "test_initialization: true\n"))
    feed(solver.net)
    tested = []
    solver.test_all = lambda: tested.append(solver.iter)
    solver.solve()
    assert tested == [] and solver.iter == 3
    assert not list(tmp_path.glob("snap_iter_*"))


def test_solver_rank_must_fit_the_count(net_file, tmp_path):
    caffe.set_solver_rank(3)
    with pytest.raises(ValueError, match="solver_rank 3 does not fit solver_count 1"):
        caffe.SGDSolver(write_solver(tmp_path, net_file))


# -- NCCL in one process -------------------------------------------------------------------

def train(solver_file, with_nccl, layer_wise):
    solver = caffe.SGDSolver(solver_file)
    solver.param.layer_wise_reduce = layer_wise
    feed(solver.net)
    if with_nccl:
        nccl = caffe.NCCL(solver, caffe.NCCL.new_uid())
        nccl.bcast()
        solver.add_callback(nccl)
        if layer_wise:
            solver.net.after_backward(nccl)
    solver.step(3)
    return [b.data.copy() for b in solver.net.learnable_params]


@pytest.mark.parametrize("layer_wise", [True, False])
def test_nccl_with_one_solver_trains_as_without_it(net_file, tmp_path, layer_wise):
    solver_file = write_solver(tmp_path, net_file)
    plain = train(solver_file, False, layer_wise)
    joined = train(solver_file, True, layer_wise)
    for a, b in zip(plain, joined):
        np.testing.assert_array_equal(a, b)


def test_nccl_uid_and_misuse(net_file, tmp_path):
    uid = caffe.NCCL.new_uid()
    assert isinstance(uid, bytes) and len(uid) == 16 and uid != caffe.NCCL.new_uid()
    assert caffe.has_nccl()
    solver = caffe.SGDSolver(write_solver(tmp_path, net_file))
    with pytest.raises(TypeError, match="uid must be bytes"):
        caffe.NCCL(solver, 12)
    nccl = caffe.NCCL(solver, uid)
    solver.param.layer_wise_reduce = False
    with pytest.raises(NCCLError, match="layer_wise_reduce: false"):
        nccl.run(1)


def test_nccl_rank_must_match_the_mpi_job(net_file, tmp_path):
    solver = caffe.SGDSolver(write_solver(tmp_path, net_file))
    caffe.set_solver_count(2)
    with pytest.raises(NCCLError, match=r"solver 0 of 2 .* MPI rank 0 of 1"):
        caffe.NCCL(solver, b"x")


# -- Timer, log, layer types ---------------------------------------------------------------

def test_timer_measures_between_start_and_stop():
    timer = caffe.Timer()
    assert timer.ms == 0.0                     # never run
    timer.start()
    time.sleep(0.02)
    timer.stop()
    first = timer.ms
    assert first >= 20.0
    time.sleep(0.02)
    assert timer.ms == first                   # stopped: the reading holds
    timer.start()
    assert timer.running
    reading = timer.ms                         # reading a running timer stops it
    assert not timer.running and reading < first


def test_log_is_callable_and_still_the_log_module():
    from poseidon_caffe import log
    assert caffe.log is log
    records = []
    handler = logging.Handler()
    handler.emit = records.append
    log.logger.addHandler(handler)
    try:
        caffe.log("Using devices [0]")
        log.info("still %s", "here")
    finally:
        log.logger.removeHandler(handler)
    assert [r.getMessage() for r in records] == ["Using devices [0]", "still here"]
    assert records[0].levelno == logging.INFO


def test_layer_type_list_names_the_registered_types():
    types = caffe.layer_type_list()
    for name in ("Data", "Convolution", "InnerProduct", "Python", "MemoryData"):
        assert name in types
    assert types == sorted(types)


def test_every_layer_type_has_a_device_path():
    # GPU mode refuses a net with a layer that has none (no host fallback), so a new layer
    # type must come with its device path
    from poseidon_caffe.layers.registry import layer_class
    types = caffe.layer_type_list()
    assert len(types) == 61 and {"MVN", "HDF5Output", "Python"} <= set(types)
    assert [t for t in types if not layer_class(t).device_ready] == []
