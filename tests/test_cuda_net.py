"""Blobs, nets and solvers in GPU mode on the emulated device: Caffe's SyncedMemory rule seen
through Blob, LeNet and CIFAR-10 quick forward/backward against the CPU backend, and 50 SGD
steps of LeNet ending where the CPU run ends."""
import numpy as np
import pytest

import cpu_reference
import nets
from poseidon_caffe import backend, rng
from poseidon_caffe import io as pio
from poseidon_caffe.backend.cuda.synced import HEAD_AT_CPU, HEAD_AT_GPU, SYNCED
from poseidon_caffe.blob import Blob, SyncedBlob
from poseidon_caffe.net import Net
from poseidon_caffe.proto import caffe_pb2
from poseidon_caffe.solver import get_solver

from emulated_device import gpu_mode, needs_compiler, use_test_driver  # noqa: F401

pytestmark = needs_compiler


def test_cpu_blobs_stay_plain_numpy():
    backend.set_mode_cpu()
    b = Blob((2, 3))
    assert type(b) is Blob
    assert b.dev_data is b.data and b.mutable_dev_diff is b.diff


def test_a_blob_copies_only_when_the_other_side_reads(gpu_mode):
    be = gpu_mode
    b = Blob((2, 3))
    assert isinstance(b, SyncedBlob)
    b.data[...] = np.arange(6).reshape(2, 3)
    mem = b.synced_data
    assert mem.head == HEAD_AT_CPU
    d = b.dev_data
    assert (mem.head, mem.htod_copies) == (SYNCED, 1)
    np.testing.assert_array_equal(be.to_host(d), np.arange(6).reshape(2, 3))
    b.dev_data
    assert mem.htod_copies == 1                     # current on both sides: no copy
    be.scale(2.0, b.mutable_dev_data)
    assert mem.head == HEAD_AT_GPU
    np.testing.assert_array_equal(b.data, 2 * np.arange(6).reshape(2, 3))
    assert mem.dtoh_copies == 1
    # a host read counts as a possible write (numpy writes cannot be seen): the next device
    # read copies up again
    assert mem.head == HEAD_AT_CPU
    b.dev_data
    assert mem.htod_copies == 2
    # reshape keeps the memory; sharing shares it; update is data -= diff on the device
    b.reshape(3, 2)
    assert b.synced_data is mem
    other = Blob((6,))
    other.share_data(b)
    assert other.synced_data is mem and other.shares_data
    b.diff[...] = 1.0
    b.update()
    np.testing.assert_array_equal(other.data, 2 * np.arange(6) - 1)
    b.zero_diff()
    assert b.synced_diff.head == HEAD_AT_GPU and not b.diff.any()


def _inputs(net, seed=1):
    r = np.random.RandomState(seed)
    net.blobs["data"].data[...] = r.uniform(-1, 1, net.blobs["data"].shape)
    net.blobs["label"].data[...] = r.randint(0, 10, net.blobs["label"].shape)


def _rel(got, want):
    return float(np.abs(got - want).max()) / max(float(np.abs(want).max()), 1e-30)


@pytest.mark.parametrize("which,batch", [("lenet", 8), ("cifar10_quick", 8),
                                         ("resnet_small", 2)])
def test_example_net_forward_backward_matches_the_cpu(gpu_mode, which, batch, tmp_path):
    # resnet_small: BatchNorm, Scale and ReLU in place, Eltwise shortcuts
    path = tmp_path / "net.prototxt"
    path.write_text(nets.ALL[which](batch=batch)[0])
    backend.set_mode_cpu()
    rng.set_random_seed(1)
    cpu = Net(str(path), caffe_pb2.TRAIN)
    _inputs(cpu)
    backend.set_mode_gpu()
    gpu = Net(str(path), caffe_pb2.TRAIN)
    for name, blobs in cpu.params.items():
        for mine, theirs in zip(gpu.params[name], blobs):
            mine.data[...] = theirs.data
    _inputs(gpu)
    transfers = gpu_mode.driver.transfers.snapshot()
    gpu_loss = gpu.forward_backward()
    moved = gpu_mode.driver.transfers.since(transfers)
    backend.set_mode_cpu()
    cpu_loss = cpu_reference.deciding_as(cpu, gpu)
    assert gpu_loss == pytest.approx(cpu_loss, rel=1e-5)
    for name, blob in cpu.blobs.items():
        assert _rel(gpu.blobs[name].data, blob.data) <= 1e-5, name
    for name, blobs in cpu.params.items():
        for mine, theirs in zip(gpu.params[name], blobs):
            assert _rel(mine.diff, theirs.diff) <= 1e-4, name
    # what crossed the bus in the pass: the weights set above, the batch, the labels, and the
    # loss (a scalar) read back and its seed written; nothing of the size of a feature map
    weights = sum(b.count for b in gpu.learnable_params) * 4
    batch = gpu.blobs["data"].count * 4
    assert moved.htod_bytes <= weights + batch + 4 * gpu.blobs["label"].count + 64
    assert moved.dtoh_bytes <= 64


def _lenet_pair(tmp_path, text=None):
    path = tmp_path / "net.prototxt"
    path.write_text(text or nets.lenet(batch=2)[0])
    pair = []
    for _ in range(2):
        rng.set_random_seed(1)
        pair.append(Net(str(path), caffe_pb2.TRAIN))
        _inputs(pair[-1])
    return pair


def test_the_cpu_reference_takes_the_other_sides_decisions_at_kinks(tmp_path):
    mine, other = _lenet_pair(tmp_path)
    other.forward_from_to()
    # the other side's ReLU put unit k of the first image on 0 (its input just below 0) ...
    k = int(np.argmax(other.blobs["ip1"].data[0]))
    other.blobs["ip1"].data[0, k] = 0.0
    # ... and its pool2 found the largest value of the first window at (1, 1)
    window = other.blobs["conv2"].data[0, 0, :2, :2]
    assert np.argmax(window) != 3
    window[1, 1] = window.max() + 1.0
    cpu_reference.deciding_as(mine, other)
    assert mine.blobs["ip1"].data[0, k] == 0 and mine.blobs["ip1"].diff[0, k] == 0
    assert mine.blobs["pool2"].data[0, 0, 0, 0] == window[1, 1]
    routed = mine.blobs["conv2"].diff[0, 0, :2, :2]
    assert routed[1, 1] != 0 and not routed.ravel()[:3].any()
    # where the two sides' inputs agree, the same pass as the net's own
    plain = _lenet_pair(tmp_path)[0]
    mine, other = _lenet_pair(tmp_path)
    other.forward_from_to()
    loss = cpu_reference.deciding_as(mine, other)
    assert loss == plain.forward_backward()
    for name, blobs in plain.params.items():
        for a, b in zip(mine.params[name], blobs):
            np.testing.assert_array_equal(a.diff, b.diff)


def test_the_cpu_reference_refuses_an_in_place_relu_with_a_slope(tmp_path):
    text = nets.lenet(batch=2)[0].replace('top: "ip1"\n}', 'top: "ip1"\n  relu_param '
                                          '{ negative_slope: 0.1 }\n}')
    mine, other = _lenet_pair(tmp_path, text)
    other.forward_from_to()
    with pytest.raises(ValueError, match="relu1"):
        cpu_reference.deciding_as(mine, other)


SOLVER = """net_param { %s }
  base_lr: %g momentum: 0.9 weight_decay: 0.001 lr_policy: "inv" gamma: 0.0001 power: 0.75
  display: 0 max_iter: 50 snapshot_after_train: false random_seed: 3 type: "SGD" """


def _on_memory_data(which, batch, shape):
    text = nets.ALL[which](batch=batch)[0]
    start = text.index("layer {")
    end = text.index("layer {", start + 1)
    data = ('layer { name: "data" type: "MemoryData" top: "data" top: "label" '
            'memory_data_param { batch_size: %d channels: %d height: %d width: %d } }\n'
            % ((batch,) + shape))
    return text[:start] + data + text[end:]


@pytest.mark.parametrize("which,batch,shape,lr", [("lenet", 8, (1, 28, 28), 0.01),
                                                  ("cifar10_quick", 4, (3, 32, 32), 0.001)])
def test_fifty_solver_steps_end_where_the_cpu_ends(gpu_mode, which, batch, shape, lr):
    net = _on_memory_data(which, batch, shape)
    r = np.random.RandomState(4)
    x = r.uniform(0, 1, (4 * batch,) + shape).astype(np.float32)
    y = r.randint(0, 10, 4 * batch).astype(np.float32)
    solvers = {}
    for mode in ("cpu", "gpu"):
        getattr(backend, "set_mode_" + mode)()
        solvers[mode] = get_solver(pio.parse_solver_text(SOLVER % (net, lr), which + " solver"))
        solvers[mode].net.set_input_arrays(x, y)
    cpu_reference.steps_deciding_as(solvers["cpu"], solvers["gpu"], 50)
    weights = {mode: {name: [b.data.copy() for b in blobs]
                      for name, blobs in solver.net.params.items()}
               for mode, solver in solvers.items()}
    moved = 0.0
    for name, blobs in weights["cpu"].items():
        for mine, theirs in zip(weights["gpu"][name], blobs):
            assert float(np.abs(mine - theirs).max()) <= 1e-4, name
        moved += float(np.abs(blobs[0]).sum())
    assert moved > 0


@pytest.mark.emulation_only                   # the emulated device's size is set here
def test_out_of_device_memory_names_the_layer_and_the_bytes(monkeypatch, tmp_path):
    from poseidon_caffe.net.errors import NetMemoryError
    use_test_driver(monkeypatch)
    monkeypatch.setenv("POSEIDON_CAFFE_EMULATED_MEMORY", str(3 * 2 ** 20))
    monkeypatch.setitem(backend._state, "devices", {})      # a device of that size
    backend.set_mode_gpu()
    try:
        path = tmp_path / "net.prototxt"
        path.write_text(nets.lenet(batch=64)[0])
        net = Net(str(path), caffe_pb2.TRAIN)
        _inputs(net)
        with pytest.raises(NetMemoryError, match=r"layer '\w+' of type \w+: out of memory .*"
                                                 r"\d+ bytes asked"):
            net.forward_backward()
    finally:
        backend.set_mode_cpu()
