"""Snapshots in Caffe's formats, resume bit-identity, fine-tuning by name, atomic writes and the
NaN stop."""
import os
import sys

import numpy as np
import pytest

from poseidon_caffe import io as pio
from poseidon_caffe.net import Net, NetError
from poseidon_caffe.proto import caffe_pb2
from poseidon_caffe.solver import get_solver, TrainingDiverged, SnapshotError

# Random data every forward and a Dropout layer: both draw from the process-wide generator,
# so only a resume that restores the random state reproduces the uninterrupted run.
NET = """
name: "noisy"
layer { name: "data" type: "DummyData" top: "data" top: "label"
  dummy_data_param { shape { dim: 8 dim: 5 } shape { dim: 8 }
    data_filler { type: "gaussian" std: 1 } data_filler { type: "constant" value: 1 } } }
layer { name: "ip1" type: "InnerProduct" bottom: "data" top: "ip1"
  inner_product_param { num_output: 6 weight_filler { type: "gaussian" std: 0.3 }
                        bias_filler { type: "constant" value: 0.1 } } }
layer { name: "drop" type: "Dropout" bottom: "ip1" top: "ip1" dropout_param { dropout_ratio: 0.3 } }
layer { name: "ip2" type: "InnerProduct" bottom: "ip1" top: "ip2"
  inner_product_param { num_output: 3 weight_filler { type: "gaussian" std: 0.3 } } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip2" bottom: "label" top: "loss" }
"""


def write(path, text):
    with open(path, "w") as f:
        f.write(text)
    return str(path)


def make_solver(tmp_path, extra="", net=NET):
    net_file = write(tmp_path / "net.prototxt", net)
    text = ('net: "%s" base_lr: 0.05 momentum: 0.9 lr_policy: "step" gamma: 0.5 stepsize: 4 '
            'max_iter: 10 snapshot: 5 snapshot_prefix: "%s" random_seed: 1701 %s'
            % (net_file, tmp_path / "snap", extra))
    return get_solver(write(tmp_path / "solver.prototxt", text))


def state_of(solver):
    return ([b.data.copy() for b in solver.net.learnable_params],
            [np.array(h) for h in solver.history])


def assert_identical(a, b):
    for x, y in zip(a[0] + a[1], b[0] + b[1]):
        np.testing.assert_array_equal(x, y)


@pytest.mark.parametrize("kind,fmt", [("SGD", "BINARYPROTO"), ("Adam", "BINARYPROTO"),
                                      ("SGD", "HDF5")])
def test_resume_is_bit_identical(tmp_path, kind, fmt):
    extra = 'type: "%s" snapshot_format: %s' % (kind, fmt)
    full = make_solver(tmp_path, extra)
    full.solve()
    expected = state_of(full)
    ext = ".solverstate.h5" if fmt == "HDF5" else ".solverstate"
    state_file = str(tmp_path / ("snap_iter_5" + ext))
    assert os.path.exists(state_file)

    resumed = make_solver(tmp_path, extra)          # a fresh process would start like this
    resumed.solve(state_file)
    assert resumed.iter == 10
    assert_identical(state_of(resumed), expected)


def test_without_the_random_state_the_resume_differs(tmp_path):
    """The side file is what makes resume exact: remove it and the random draws diverge."""
    full = make_solver(tmp_path)
    full.solve()
    os.remove(tmp_path / "snap_iter_5.rngstate")
    resumed = make_solver(tmp_path)
    resumed.solve(str(tmp_path / "snap_iter_5.solverstate"))
    assert not np.array_equal(resumed.net.learnable_params[0].data, full.net.learnable_params[0].data)


def test_snapshot_files_are_caffe_messages_that_load_into_a_net(tmp_path):
    solver = make_solver(tmp_path, "snapshot_diff: true")
    solver.step(5)
    model_file = tmp_path / "snap_iter_5.caffemodel"
    state = caffe_pb2.SolverState()
    state.ParseFromString((tmp_path / "snap_iter_5.solverstate").read_bytes())
    assert state.iter == 5
    assert state.learned_net == str(model_file)
    assert state.current_step == 1                       # step policy: 5 // 4
    assert len(state.history) == len(solver.net.learnable_params) == 4
    np.testing.assert_array_equal(pio.blobproto_to_array(state.history[0]), solver.history[0])
    model = caffe_pb2.NetParameter()
    model.ParseFromString(model_file.read_bytes())
    ip1 = [layer for layer in model.layer if layer.name == "ip1"][0]
    assert list(ip1.blobs[0].shape.dim) == [6, 5]
    assert len(ip1.blobs[0].diff) == 30                 # snapshot_diff keeps the gradients
    net = Net(str(tmp_path / "net.prototxt"), caffe_pb2.TEST, weights=str(model_file))
    for name in ("ip1", "ip2"):
        for mine, theirs in zip(net.params[name], solver.net.params[name]):
            np.testing.assert_array_equal(mine.data, theirs.data)


def test_hdf5_layout(tmp_path):
    h5py = pytest.importorskip("h5py")
    solver = make_solver(tmp_path, 'snapshot_format: HDF5 type: "Adam"')
    solver.step(5)
    with h5py.File(tmp_path / "snap_iter_5.caffemodel.h5", "r") as f:
        np.testing.assert_array_equal(f["data/ip1/0"][()], solver.net.params["ip1"][0].data)
        assert "diff" not in f
    with h5py.File(tmp_path / "snap_iter_5.solverstate.h5", "r") as f:
        assert int(f["iter"][()]) == 5
        assert len(f["history"]) == 8                    # Adam: m and v per parameter


def test_hdf5_without_h5py_names_the_package(tmp_path, monkeypatch):
    solver = make_solver(tmp_path, "snapshot_format: HDF5")
    monkeypatch.setitem(sys.modules, "h5py", None)
    with pytest.raises(SnapshotError, match="h5py"):
        solver.snapshot()


def test_restore_rejects_another_solvers_history(tmp_path):
    make_solver(tmp_path).step(5)
    adam = make_solver(tmp_path, 'type: "Adam"')
    with pytest.raises(SnapshotError, match="Incorrect length of history blobs"):
        adam.restore(str(tmp_path / "snap_iter_5.solverstate"))


def test_atomic_write_survives_a_crash_mid_snapshot(tmp_path, monkeypatch):
    solver = make_solver(tmp_path)
    solver.step(5)
    model_file = tmp_path / "snap_iter_5.caffemodel"
    good = model_file.read_bytes()
    solver.net.learnable_params[0].data[...] += 1.0      # would change the file if written
    real_fsync = os.fsync

    def crash(fd):
        raise OSError("simulated power loss")
    monkeypatch.setattr(os, "fsync", crash)
    with pytest.raises(SnapshotError, match="Iteration 5: the snapshot was not written "
                       r"\(cannot write .*snap_iter_5.caffemodel: simulated power loss\)"):
        solver.snapshot()
    monkeypatch.setattr(os, "fsync", real_fsync)
    assert model_file.read_bytes() == good
    leftovers = [n for n in os.listdir(tmp_path) if n.startswith(".")]
    assert leftovers == []


def test_finetune_copies_layers_by_name(tmp_path):
    donor = make_solver(tmp_path)
    donor.step(5)
    weights = str(tmp_path / "snap_iter_5.caffemodel")
    renamed = NET.replace('"ip2"', '"ip2_new"').replace('bottom: "ip2"', 'bottom: "ip2_new"')
    target_dir = tmp_path / "ft"
    target_dir.mkdir()
    ft = make_solver(target_dir, 'weights: "%s"' % weights, net=renamed)
    np.testing.assert_array_equal(ft.net.params["ip1"][0].data, donor.net.params["ip1"][0].data)
    assert not np.array_equal(ft.net.params["ip2_new"][0].data, donor.net.params["ip2"][0].data)

    wrong = NET.replace("num_output: 6", "num_output: 7")
    bad_dir = tmp_path / "bad"
    bad_dir.mkdir()
    with pytest.raises(NetError, match="Cannot copy param 0 weights from layer 'ip1'; shape mismatch"):
        make_solver(bad_dir, 'weights: "%s"' % weights, net=wrong)


EXPLODING = """
name: "boom"
layer { name: "data" type: "DummyData" top: "x" top: "y"
  dummy_data_param { shape { dim: 2 dim: 3 } shape { dim: 2 dim: 1 }
    data_filler { type: "constant" value: 100 } data_filler { type: "constant" value: 1 } } }
layer { name: "ip" type: "InnerProduct" bottom: "x" top: "out"
  inner_product_param { num_output: 1 weight_filler { type: "constant" value: 0.01 } } }
layer { name: "loss" type: "EuclideanLoss" bottom: "out" bottom: "y" top: "loss" }
"""


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_nan_loss_stops_and_keeps_the_last_good_snapshot(tmp_path):
    """Gradient descent with a step far beyond 2 / curvature diverges: the loss curvature along
    the weights is |x|^2 = 3e4, so each step of 0.5 multiplies the error by about -1.5e4 and
    float32 overflows within a dozen iterations. The last snapshot before that must stay the
    last one written, and stay finite."""
    net_file = write(tmp_path / "boom.prototxt", EXPLODING)
    text = ('net: "%s" base_lr: 0.5 lr_policy: "fixed" max_iter: 100 snapshot: 1 '
            'snapshot_prefix: "%s"' % (net_file, tmp_path / "boom"))
    solver = get_solver(pio.parse_solver_text(text, "boom solver"))
    with pytest.raises(TrainingDiverged) as err:
        solver.solve()
    stopped = err.value.iteration
    assert 1 < stopped < 100
    message = str(err.value)
    assert "Iteration %d" % stopped in message
    assert err.value.last_snapshot and err.value.last_snapshot in message
    last = err.value.last_snapshot
    it = int(last.split("_iter_")[1].split(".")[0])
    for n in range(it + 1, stopped + 2):
        assert not os.path.exists(str(tmp_path / ("boom_iter_%d.caffemodel" % n)))
    model = caffe_pb2.NetParameter()
    model.ParseFromString(open(str(tmp_path / ("boom_iter_%d.caffemodel" % it)), "rb").read())
    for layer in model.layer:
        for blob in layer.blobs:
            assert np.all(np.isfinite(pio.blobproto_to_array(blob)))


SIAMESE = """
name: "siamese"
layer { name: "x" type: "Input" top: "a" top: "b"
  input_param { shape { dim: 2 dim: 3 } shape { dim: 2 dim: 3 } } }
layer { name: "left" type: "InnerProduct" bottom: "a" top: "fa"
  param { name: "w" } param { name: "bias" } inner_product_param { num_output: 4 } }
layer { name: "right" type: "InnerProduct" bottom: "b" top: "fb"
  param { name: "w" } param { name: "bias" } inner_product_param { num_output: 4 } }
"""


def test_hdf5_weights_written_by_caffes_rules_load_into_shared_params(tmp_path):
    # Caffe's HDF5 model: a group per layer under "data", datasets only for the parameters a
    # layer owns -- so "right", which shares both of "left"'s, has an empty group, as "x" has.
    h5py = pytest.importorskip("h5py")
    from poseidon_caffe.solver.snapshot import load_weights
    w = np.arange(12, dtype=np.float32).reshape(4, 3)
    bias = np.array([1, 2, 3, 4], dtype=np.float32)
    path = str(tmp_path / "caffe.caffemodel.h5")
    with h5py.File(path, "w") as f:
        data = f.create_group("data")
        data.create_group("x")
        left = data.create_group("left")
        left.create_dataset("0", data=w)
        left.create_dataset("1", data=bias)
        data.create_group("right")
    net = Net(pio.parse_net_text(SIAMESE), caffe_pb2.TEST)
    load_weights(net, path)
    np.testing.assert_array_equal(net.params["right"][0].data, w)
    np.testing.assert_array_equal(net.params["right"][1].data, bias)
    # a parameter a layer owns may not be missing
    with h5py.File(path, "a") as f:
        del f["data/left/1"]
    with pytest.raises(SnapshotError, match="Incompatible number of blobs for layer left"):
        load_weights(net, path)


def test_restore_logs_caffes_line(tmp_path):
    # Caffe's restore is SGDSolver's for all six rules: the line reads the same for Adam
    import logging
    from poseidon_caffe import log
    solver = make_solver(tmp_path, 'type: "Adam"')
    solver.step(5)
    records = []
    handler = logging.Handler()
    handler.emit = records.append
    log.logger.addHandler(handler)
    try:
        make_solver(tmp_path, 'type: "Adam"').restore(
            str(tmp_path / "snap_iter_5.solverstate"))
    finally:
        log.logger.removeHandler(handler)
    assert "SGDSolver: restoring history" in [r.getMessage() for r in records]
