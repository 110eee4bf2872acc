"""The public methods the distributed engine reads the solver, the net and the layers through
(docs/DEVELOPING.md lists them), checked in one process against values worked out by hand."""
import logging

import numpy as np
import pytest

from poseidon_caffe import io as pio
from poseidon_caffe.data.db import DatumWriter
from poseidon_caffe.net import Net
from poseidon_caffe.proto import caffe_pb2
from poseidon_caffe.solver import LocalJob, get_solver, signals, updates

SHARED_NET = """
name: "shared"
layer { name: "in" type: "Input" top: "x" input_param { shape { dim: 2 dim: 3 } } }
layer { name: "target" type: "Input" top: "t" input_param { shape { dim: 2 dim: 4 } } }
layer { name: "a" type: "InnerProduct" bottom: "x" top: "ya"
        param { name: "w" } param { lr_mult: 2 }
        inner_product_param { num_output: 4 weight_filler { type: "gaussian" } } }
layer { name: "b" type: "InnerProduct" bottom: "x" top: "yb"
        param { name: "w" } param { lr_mult: 0 }
        inner_product_param { num_output: 4 weight_filler { type: "gaussian" } } }
layer { name: "c" type: "InnerProduct" bottom: "yb" top: "yc"
        inner_product_param { num_output: 4 bias_term: false transpose: true
                              weight_filler { type: "gaussian" } } }
layer { name: "sum" type: "Eltwise" bottom: "ya" bottom: "yc" top: "s" }
layer { name: "loss" type: "EuclideanLoss" bottom: "s" bottom: "t" top: "l" }
"""


def test_param_uses_name_every_layer_that_shares_a_parameter():
    net = Net(pio.parse_net_text(SHARED_NET, "shared"), caffe_pb2.TRAIN)
    a, b, c = (net.layer_names.index(n) for n in ("a", "b", "c"))
    # learnable parameters: w (shared by a and b), a's bias, b's bias, c's weight
    assert net.param_uses() == [[(a, 0), (b, 0)], [(a, 1)], [(b, 1)], [(c, 0)]]
    assert net.learnable_params[0] is net.layers[b].blobs[0]


def test_layer_blobs_are_the_blobs_the_layer_runs_with():
    net = Net(pio.parse_net_text(SHARED_NET, "shared"), caffe_pb2.TRAIN)
    bottoms, tops = net.layer_blobs(net.layer_names.index("sum"))
    names = {id(blob): name for name, blob in net.blobs.items()}
    assert [names[id(b)] for b in bottoms] == [n for n in net.bottom_names["sum"]]
    assert [names[id(t)] for t in tops] == ["s"]


@pytest.mark.parametrize("layer_name", ["a", "c"])
def test_inner_product_factor_source_rebuilds_the_weight_gradient(layer_name):
    net = Net(pio.parse_net_text(SHARED_NET, "shared"), caffe_pb2.TRAIN)
    i = net.layer_names.index(layer_name)
    layer = net.layers[i]
    source = layer.sufficient_factor_source(*net.layer_blobs(i))
    inputs, outputs = (3, 4) if layer_name == "a" else (4, 4)
    assert (source["inputs"], source["outputs"], source["rows_per_pass"]) == (inputs, outputs, 2)
    assert source["transpose"] is (layer_name == "c")
    net.blobs["x"].data[...] = np.arange(6, dtype=np.float32).reshape(2, 3) / 5
    net.blobs["t"].data[...] = 1.0
    net.clear_param_diffs()
    net.forward_backward()
    dy, x = source["read"]()
    assert dy.shape == (2, outputs) and x.shape == (2, inputs)
    grad = dy.T @ x                                  # the (N, K) weight gradient
    weight = layer.blobs[0]
    assert np.abs(weight.diff).max() > 1e-3            # the loss reaches this layer
    if layer_name == "c":
        np.testing.assert_allclose(grad.T, weight.diff, rtol=1e-5, atol=1e-6)
    else:
        # a's weight is shared with b: its diff holds both layers' gradients
        dyb = net.blobs["yb"].diff.reshape(2, 4)
        both = grad + dyb.T @ net.blobs["x"].data.reshape(2, 3)
        np.testing.assert_allclose(both, weight.diff, rtol=1e-5, atol=1e-6)


def test_update_value_of_each_rule_by_hand():
    param = caffe_pb2.SolverParameter(momentum=0.9, momentum2=0.999, delta=1e-8,
                                      rms_decay=0.5)
    diff, history = np.array([1.0, 2.0]), [np.array([0.5, 0.5])]
    updates.update_value("SGD", param, diff, history, 0.1, 0)
    np.testing.assert_allclose(history[0], [0.55, 0.65])          # 0.9 * 0.5 + 0.1 * g
    np.testing.assert_allclose(diff, [0.55, 0.65])
    diff, history = np.array([2.0]), [np.array([1.0])]
    updates.update_value("RMSProp", param, diff, history, 0.1, 0)
    np.testing.assert_allclose(history[0], [2.5])                  # 0.5 * 1 + 0.5 * 4
    np.testing.assert_allclose(diff, [0.1 * 2 / (np.sqrt(2.5) + 1e-8)])
    # Adam at iteration 0 takes step t = 1: m = 0.1 g, v = 0.001 g^2, the correction
    # sqrt(1 - 0.999) / (1 - 0.9) makes the first step lr * g / |g|
    diff, history = np.array([3.0]), [np.zeros(1), np.zeros(1)]
    updates.update_value("Adam", param, diff, history, 0.01, 0)
    np.testing.assert_allclose(diff, [0.01], rtol=1e-6)
    with pytest.raises(ValueError, match="no update rule for solver type 'Lion'"):
        updates.update_value("Lion", param, np.zeros(1), [np.zeros(1)], 0.1, 0)


@pytest.fixture
def logged(caplog):
    """The project's log lines in ``caplog.text``."""
    logger = logging.getLogger("poseidon_caffe")
    logger.propagate = True
    try:
        with caplog.at_level(logging.INFO, logger="poseidon_caffe"):
            yield caplog
    finally:
        logger.propagate = False


def test_clip_scale_is_clip_over_the_global_norm_and_logged(logged):
    assert updates.clip_scale(25.0, -1) is None
    assert updates.clip_scale(25.0, 5.0) is None
    assert updates.clip_scale(25.0, 1.0) == pytest.approx(0.2)
    assert "Gradient clipping: scaling down gradients (L2 norm 5 > 1) by scale factor 0.2" \
        in logged.text


def _label_db(path, count):
    """``count`` one-pixel images: record i has pixel 10 * i and label i."""
    with DatumWriter(path) as writer:
        for i in range(count):
            datum = pio.array_to_datum(np.full((1, 1, 1), 10 * i, dtype=np.uint8), label=i)
            writer.put("%08d" % i, datum.SerializeToString())


def _data_solver(folder, test_iter):
    folder.mkdir()
    db = str(folder / "labels_lmdb")
    _label_db(db, 6)
    text = ('net_param { name: "d" layer { name: "data" type: "Data" top: "data" top: "label" '
            'data_param { source: "%s" batch_size: 1 backend: LMDB } } }\n'
            'test_iter: %d test_interval: 100 base_lr: 0.1 lr_policy: "fixed" max_iter: 1\n'
            % (db, test_iter))
    return get_solver(pio.parse_solver_text(text, "data solver"))


def _outputs(logged):
    return [line.split(": ", 1)[1] for line in logged.text.splitlines()
            if "Test net output" in line]


def test_sharded_test_skips_the_other_shards_batches_and_reduces(tmp_path, logged):
    solver = _data_solver(tmp_path / "one", 6)
    solver.test(0)
    whole = _outputs(logged)
    assert whole == ["data = 25", "label = 2.5"]           # labels 0..5, pixels 0..50
    # worker 1 of 2 runs batches 1, 3, 5; the others' are skipped in its data layer
    seen = []

    def reduce(sums, names, weights):
        seen.append((list(sums), list(names), list(weights)))
        other = [0.0, 0 + 20 + 40, 0 + 2 + 4]             # what worker 0 sums: loss, data, label
        return [a + b for a, b in zip(sums, other)], names, weights
    logged.clear()
    shard_solver = _data_solver(tmp_path / "two", 6)
    shard_solver.test(0, shard=(1, 2), reduce=reduce)
    assert seen == [([0.0, 10 + 30 + 50, 1 + 3 + 5], ["data", "label"], [0.0, 0.0])]
    assert _outputs(logged) == whole


class RecordingJob(LocalJob):
    """A job that answers one snapshot request and then a stop, and records what it is asked."""

    def __init__(self, answers):
        self.answers = list(answers)
        self.calls = []

    def requested_action(self, solver):
        self.calls.append("requested_action")
        return self.answers.pop(0) if self.answers else signals.NONE

    def test(self, solver, test_net_id):
        self.calls.append("test %d" % test_net_id)
        super().test(solver, test_net_id)

    def snapshot(self, solver):
        self.calls.append("snapshot at %d" % solver.iter)
        return "no file"


def test_the_solver_asks_its_job_for_tests_requests_and_snapshots(tmp_path, logged):
    solver = _data_solver(tmp_path / "one", 3)
    # between test batches the job is asked until nothing is pending: a snapshot, then a stop
    job = RecordingJob([signals.SNAPSHOT, signals.STOP])
    solver.set_job(job)
    solver.test_all()
    assert job.calls == ["test 0", "requested_action", "snapshot at 0", "requested_action",
                         "requested_action"]
    assert solver.requested_early_exit
    assert "Test interrupted." in logged.text
