"""What crosses between host and device while a net trains on the (emulated) device, counted by
the driver (copies, bytes, the host's waits) and by SyncedMemory: one batch in per iteration
and nothing out until the loss is read (display, the end of a step), a snapshot's parameters
and history, nothing for a test net sharing the weights, and one blob for a pycaffe read."""
import os
import time

import numpy as np
import pytest

from poseidon_caffe import backend
from poseidon_caffe.data import mnist_embedded
from poseidon_caffe.io import parse_solver_text, read_net_param, read_solver_param
from poseidon_caffe.solver import get_solver
from poseidon_caffe.solver import solver as solver_module

from emulated_device import gpu_mode, needs_compiler  # noqa: F401 (a fixture)

pytestmark = needs_compiler
EXAMPLE = os.path.join(os.path.dirname(__file__), os.pardir, "examples", "mnist")
BATCH = 8


@pytest.fixture(scope="module")
def mnist_dbs(tmp_path_factory):
    return mnist_embedded.ensure_mnist_lmdbs(str(tmp_path_factory.mktemp("mnist")))


def _lenet_solver(dbs, tmp_path, display=0, test=False, **fields):
    train_db, test_db = dbs
    net = read_net_param(os.path.join(EXAMPLE, "lenet_train_test.prototxt"))
    for layer in net.layer:
        if layer.type == "Data":
            train = layer.include[0].phase == 0
            layer.data_param.source = train_db if train else test_db
            layer.data_param.batch_size = BATCH
    param = read_solver_param(os.path.join(EXAMPLE, "lenet_solver.prototxt"))
    param.ClearField("net")
    param.net_param.CopyFrom(net)
    param.display = display
    param.snapshot = 0
    param.snapshot_after_train = False
    param.snapshot_prefix = str(tmp_path / "lenet")
    param.random_seed = 1
    param.ClearField("test_iter")
    param.test_interval = 0
    if test:                            # a test net, tested only when asked
        param.test_iter.append(2)
        param.test_interval = 1000
        param.test_initialization = False
    for name, value in fields.items():
        setattr(param, name, value)
    return get_solver(param)


def _rings(net):
    return [layer._resources.ring for layer in net.layers
            if getattr(getattr(layer, "_resources", None), "ring", None) is not None]


def _settle(net):
    """Wait until every prefetch thread has filled its queue and the slot after it (then it
    waits for the computation, and the counts between two settles are exact)."""
    for ring in _rings(net):
        depth = len(ring._slots) - 1

        def filled():
            return ring.pushed >= ring.taken + depth + 1
        for _ in range(12000):          # a hang guard, not a speed bound: up to 2 minutes
            if filled():
                break
            time.sleep(0.01)
        assert filled(), "the prefetch thread did not fill its queue"


def _memories(net):
    seen = {}
    for blob in list(net.blobs.values()) + list(net.learnable_params):
        for mem in (blob.synced_data, blob.synced_diff):
            seen[id(mem)] = mem
    return list(seen.values())


def _memory_counts(net):
    return [(m.htod_bytes, m.dtoh_bytes) for m in _memories(net)]


def _trained(solver, iterations):
    """(driver transfers, SyncedMemory counts before and after) over ``iterations`` steps."""
    driver = backend.get_backend().driver
    net = solver.net
    _settle(net)
    before, memory_before = driver.transfers.snapshot(), _memory_counts(net)
    solver.step(iterations)
    _settle(net)
    return driver.transfers.since(before), memory_before, _memory_counts(net)


def test_a_data_layer_puts_one_batch_in_per_iteration_and_nothing_comes_back(gpu_mode,
                                                                             mnist_dbs,
                                                                             tmp_path):
    solver = _lenet_solver(mnist_dbs, tmp_path)
    solver.step(2)                     # every blob made and its first values in place
    steps = 6
    moved, memory_before, memory_after = _trained(solver, steps)
    batch = solver.net.blobs["data"].nbytes + solver.net.blobs["label"].nbytes
    assert batch == BATCH * (28 * 28 + 1) * 4
    # in: the batch (data and labels, on the prefetch thread's stream), nothing else
    assert (moved.htod_calls, moved.htod_bytes) == (2 * steps, steps * batch)
    # out: the six losses, in one copy at the end of the step; the host waited for it only
    assert (moved.dtoh_calls, moved.dtoh_bytes) == (1, 4 * steps)
    assert moved.host_syncs == 1
    # the prefetch thread waited for its own copies, not the computation
    assert moved.background_syncs == 2 * steps
    # no blob's SyncedMemory copied anything: the batch went device to device into the tops
    assert memory_after == memory_before
    assert solver.losses == [solver.smoothed_loss] and np.isfinite(solver.smoothed_loss)


def test_dummy_data_refills_cross_once_per_iteration(gpu_mode, tmp_path):
    net = """name: "dummy"
      layer { name: "data" type: "DummyData" top: "data" top: "label"
        dummy_data_param { shape { dim: 8 dim: 3 dim: 4 dim: 4 } shape { dim: 8 }
          data_filler { type: "gaussian" std: 1 } data_filler { type: "uniform" min: 0 max: 9.5 } } }
      layer { name: "ip" type: "InnerProduct" bottom: "data" top: "ip"
        inner_product_param { num_output: 10 weight_filler { type: "xavier" } } }
      layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip" bottom: "label" top: "loss" }"""
    solver = get_solver(parse_solver_text(
        'net_param { %s } base_lr: 0.01 momentum: 0.9 lr_policy: "fixed" display: 0 '
        'max_iter: 100 snapshot_after_train: false random_seed: 2 type: "SGD"' % net, "dummy"))
    solver.step(2)
    steps = 5
    moved, memory_before, memory_after = _trained(solver, steps)
    batch = (8 * 3 * 4 * 4 + 8) * 4
    assert (moved.htod_calls, moved.htod_bytes) == (2 * steps, steps * batch)
    assert (moved.dtoh_calls, moved.dtoh_bytes, moved.host_syncs) == (1, 4 * steps, 1)
    # here the refilled tops' own SyncedMemory made the copies: one each per iteration
    data, label = solver.net.blobs["data"], solver.net.blobs["label"]
    grew = [a[0] - b[0] for a, b in zip(memory_after, memory_before)]
    assert sorted(g for g in grew if g) == sorted([steps * label.nbytes, steps * data.nbytes])


def test_a_loss_summed_on_the_host_is_kept_there(gpu_mode, monkeypatch):
    # HingeLoss reads its sum to the host (a BLAS scalar): its top is never copied up or back
    net = """name: "hinge"
      layer { name: "data" type: "DummyData" top: "data" top: "label"
        dummy_data_param { shape { dim: 8 dim: 6 } shape { dim: 8 }
          data_filler { type: "gaussian" std: 1 } data_filler { type: "uniform" min: 0 max: 3.5 } } }
      layer { name: "ip" type: "InnerProduct" bottom: "data" top: "ip"
        inner_product_param { num_output: 4 weight_filler { type: "xavier" } } }
      layer { name: "loss" type: "HingeLoss" bottom: "ip" bottom: "label" top: "loss" }"""
    text = ('net_param { %s } base_lr: 0.01 lr_policy: "fixed" display: 0 average_loss: 2 '
            'max_iter: 100 snapshot_after_train: false random_seed: 2 type: "SGD"' % net)
    runs = []
    for path in ("device", "host"):
        if path == "host":
            monkeypatch.setattr(solver_module, "_on_device", lambda net: False)
        solver = get_solver(parse_solver_text(text, "hinge"))
        solver.step(1)
        moved, _, _ = _trained(solver, 4)
        runs.append((solver.losses, solver.smoothed_loss))
        if path == "device":
            assert moved.htod_bytes == 4 * (8 * 6 + 8) * 4
            assert (moved.dtoh_calls, moved.dtod_calls) == (0, 0)
    assert runs[0] == runs[1]


def test_displayed_losses_are_the_ones_the_host_path_prints(gpu_mode, mnist_dbs, tmp_path,
                                                            monkeypatch):
    runs = {}
    for path in ("device", "host"):
        if path == "host":
            # the host path: every iteration's loss read to the host as it is made
            monkeypatch.setattr(solver_module, "_on_device", lambda net: False)
        solver = _lenet_solver(mnist_dbs, tmp_path, display=2, average_loss=3, iter_size=2)
        shown = []
        original = solver._display
        monkeypatch.setattr(solver, "_display",
                            lambda: (shown.append((solver.iter, solver.smoothed_loss)),
                                     original()))
        solver.step(7)
        runs[path] = shown, list(solver.losses), solver.smoothed_loss
    assert runs["device"] == runs["host"]
    assert [i for i, _ in runs["device"][0]] == [0, 2, 4, 6]


def test_a_nan_loss_kept_on_the_device_still_stops_training_naming_its_iteration(
        gpu_mode, mnist_dbs, tmp_path):
    solver = _lenet_solver(mnist_dbs, tmp_path)
    solver.step(1)
    loss_layer = solver.net.layers[-1]
    forward = loss_layer.forward

    def diverging(bottom, top):        # from now on the loss on the device is NaN
        forward(bottom, top)
        loss_layer.backend.fill(top[0].mutable_dev_data, np.nan)

    loss_layer.forward = diverging
    with pytest.raises(solver_module.TrainingDiverged, match="Iteration 1: the loss is nan"):
        solver.step(3)


def test_a_snapshot_copies_back_the_parameters_and_the_history_only(gpu_mode, mnist_dbs,
                                                                    tmp_path):
    solver = _lenet_solver(mnist_dbs, tmp_path)
    solver.step(2)
    net = solver.net
    _settle(net)
    driver = backend.get_backend().driver
    before, memory_before = driver.transfers.snapshot(), _memory_counts(net)
    state = solver.snapshot()
    moved = driver.transfers.since(before)
    params = sum(b.nbytes for b in net.learnable_params)
    history = sum(h.nbytes for h in solver.history)      # SGD: one momentum per parameter
    assert history == params
    assert moved.dtoh_bytes == params + history
    assert moved.htod_bytes == 0
    assert os.path.exists(state)
    # the parameters were read, not taken over by the host: training goes on with no copy up
    moved, _, _ = _trained(solver, 2)
    assert moved.htod_bytes == 2 * (net.blobs["data"].nbytes + net.blobs["label"].nbytes)
    params_after = [m.htod_bytes for m in _memories(net)]
    assert params_after == [h for h, _ in memory_before]


def test_a_test_net_sharing_the_weights_copies_none(gpu_mode, mnist_dbs, tmp_path):
    solver = _lenet_solver(mnist_dbs, tmp_path, test=True)
    solver.step(2)
    test_net = solver.test_nets[0]
    solver.test_all()                  # every test blob made, the weights shared (as Caffe's)
    for name, blobs in test_net.params.items():
        for mine, theirs in zip(blobs, solver.net.params[name]):
            assert mine.synced_data is theirs.synced_data
    _settle(test_net)
    driver = backend.get_backend().driver
    before = driver.transfers.snapshot()
    params = [(m.htod_bytes, m.dtoh_bytes) for b in solver.net.learnable_params
              for m in (b.synced_data,)]
    solver.test_all()
    _settle(test_net)
    moved = driver.transfers.since(before)
    assert params == [(m.htod_bytes, m.dtoh_bytes) for b in solver.net.learnable_params
                      for m in (b.synced_data,)]
    batch = test_net.blobs["data"].nbytes + test_net.blobs["label"].nbytes
    assert moved.htod_bytes == 2 * batch             # test_iter 2: two batches in
    # out: what the test prints of each batch, nothing more: the loss (a copy) and the
    # accuracy (its hits and count, two BLAS sums returned to the host, as Caffe's)
    assert moved.dtoh_bytes == 2 * test_net.blobs["loss"].nbytes
    assert moved.host_syncs == 2 * 3


def test_a_pycaffe_read_copies_back_that_blob_only(gpu_mode, mnist_dbs, tmp_path):
    solver = _lenet_solver(mnist_dbs, tmp_path)
    solver.step(1)
    net = solver.net
    net.forward()
    driver = backend.get_backend().driver
    before = driver.transfers.snapshot()
    values = net.blobs["ip1"].data
    moved = driver.transfers.since(before)
    assert values.shape == (BATCH, 500)
    assert (moved.dtoh_calls, moved.dtoh_bytes) == (1, net.blobs["ip1"].nbytes)
    assert moved.htod_bytes == 0 and moved.host_syncs == 1
