"""-weights given something that is not a caffemodel: a device, a huge sparse file, or another
of Caffe's files. Each is refused in one line that says what the file is and which flag takes
it, without reading more of it than the first senseless field; a caffemodel larger than the
net (finetuning from a bigger model) still loads, copying only the net's layers."""
import os
import subprocess
import sys
import tracemalloc

import numpy as np
import pytest

from poseidon_caffe import TEST, io as pio
from poseidon_caffe.net import Net
from poseidon_caffe.proto import caffe_pb2

from peak_memory import run_measuring_peak

NET = """name: "small"
layer { name: "data" type: "Input" top: "data" input_param { shape { dim: 2 dim: 3 } } }
layer { name: "ip" type: "InnerProduct" bottom: "data" top: "ip"
  inner_product_param { num_output: 4 } }
"""
SOLVER_TEXT = 'net: "net.prototxt"\nbase_lr: 0.01\nlr_policy: "fixed"\n'


def blob(values, shape):
    """A BlobProto written field by field: packed data (5), then shape (7)."""
    b = caffe_pb2.BlobProto()
    b.data.extend(values)
    b.shape.dim.extend(shape)
    return b


def score(tmp_path, weights, timeout=120):
    """(exit code, its error lines, stderr) of `test` scoring net.prototxt with ``weights``."""
    (tmp_path / "net.prototxt").write_text(NET)
    proc = subprocess.run([sys.executable, "-m", "poseidon_caffe.cli", "test", "-model",
                           "net.prototxt", "-weights", weights, "-iterations", "1"],
                          cwd=str(tmp_path), capture_output=True, text=True, timeout=timeout)
    return proc.returncode, [l for l in proc.stderr.splitlines() if l.startswith("E")], \
        proc.stderr


def test_a_device_is_refused_not_read(tmp_path):
    code, errors, text = score(tmp_path, "/dev/zero", timeout=60)
    assert code == 1 and "Traceback" not in text
    assert len(errors) == 1 and errors[0].endswith(
        "/dev/zero: is a character device, not a file (expected a binary .caffemodel)")


def sparse(path, size, head=b""):
    with open(path, "wb") as f:
        f.write(head)
        f.truncate(size)
    if os.stat(path).st_blocks * 512 > len(head) + (1 << 20):
        pytest.skip("this file system does not keep sparse files")


def peak_mib(argv, cwd):
    code, text, peak = run_measuring_peak(argv, cwd)
    return code, [line for line in text.splitlines() if line.startswith("E")], peak


def test_a_10_gib_sparse_file_stops_at_its_first_bad_byte(tmp_path):
    (tmp_path / "net.prototxt").write_text(NET)
    Net(str(tmp_path / "net.prototxt"), TEST).save(str(tmp_path / "good.caffemodel"))
    good = (tmp_path / "good.caffemodel").read_bytes()
    argv = [sys.executable, "-m", "poseidon_caffe.cli", "test", "-model", "net.prototxt",
            "-iterations", "1", "-weights"]
    # all holes: zeros are field number 0 at the first byte
    sparse(tmp_path / "zeros.caffemodel", 10 << 30)
    code, errors, peak = peak_mib(argv + ["zeros.caffemodel"], tmp_path)
    assert code == 1 and len(errors) == 1
    assert errors[0].endswith("zeros.caffemodel: cannot read binary .caffemodel (NetParameter, "
                              "10737418240 bytes): corrupt: field number 0 at byte 0")
    assert peak < 300, peak                # it used to read all 10 GiB first
    # a good model with 10 GiB of holes after it
    sparse(tmp_path / "grown.caffemodel", 10 << 30, good)
    code, errors, peak = peak_mib(argv + ["grown.caffemodel"], tmp_path)
    assert code == 1 and len(errors) == 1 and errors[0].endswith(
        "corrupt: field number 0 at byte %d" % len(good))
    assert peak < 300, peak


def write_other_files(tmp_path):
    state = caffe_pb2.SolverState(iter=100, learned_net="m_iter_100.caffemodel", current_step=0)
    state.history.add().CopyFrom(blob([0.5] * 12, [4, 3]))
    (tmp_path / "m_iter_100.solverstate").write_bytes(state.SerializeToString())
    (tmp_path / "mean.binaryproto").write_bytes(
        blob([1.0] * 12, [1, 3, 2, 2]).SerializeToString())
    legacy = caffe_pb2.BlobProto(num=1, channels=3, height=2, width=2)
    legacy.data.extend([1.0] * 12)
    (tmp_path / "legacy_mean.binaryproto").write_bytes(legacy.SerializeToString())
    (tmp_path / "net.prototxt").write_text(NET)
    (tmp_path / "solver.prototxt").write_text(SOLVER_TEXT)
    # an HDF5 file under a caffemodel's name: its 8-byte signature
    (tmp_path / "h5.caffemodel").write_bytes(b"\x89HDF\r\n\x1a\n" + bytes(200))


@pytest.mark.parametrize("name, said", [
    ("m_iter_100.solverstate", "is a solver state (.solverstate), not a .caffemodel of weights; "
                               "resume training from it with -snapshot"),
    ("mean.binaryproto", "is a blob (.binaryproto, e.g. a mean image), not a .caffemodel of "
                         "weights; a data layer's transform_param mean_file takes a mean image"),
    ("legacy_mean.binaryproto", "is a blob (.binaryproto, e.g. a mean image), not a .caffemodel "
                                "of weights; a data layer's transform_param mean_file takes a "
                                "mean image"),
    ("net.prototxt", "is a net definition (text prototxt), not a .caffemodel of weights; "
                     "-model takes it"),
    ("solver.prototxt", "is a solver definition (text prototxt), not a .caffemodel of weights; "
                        "-solver takes it"),
    ("h5.caffemodel", "is an HDF5 file, not a .caffemodel of weights; HDF5 weights are read "
                      "from a file whose name ends in .h5, an HDF5 solver state by -snapshot"),
])
def test_another_caffe_file_is_named_with_the_flag_that_takes_it(tmp_path, name, said):
    write_other_files(tmp_path)
    with pytest.raises(pio.ProtoFileError) as info:
        pio.read_net_weights(str(tmp_path / name))
    assert str(info.value) == "%s: %s" % (tmp_path / name, said)


def test_the_command_line_says_so_in_one_line(tmp_path):
    write_other_files(tmp_path)
    code, errors, text = score(tmp_path, "m_iter_100.solverstate")
    assert code == 1 and "Traceback" not in text and len(errors) == 1
    assert errors[0].endswith("m_iter_100.solverstate: is a solver state (.solverstate), not a "
                              ".caffemodel of weights; resume training from it with -snapshot")


def test_a_larger_model_loads_copying_only_the_nets_layers(tmp_path):
    """Finetuning from a bigger model: 32 MB of a layer the net does not have is mapped, not
    copied; the net's own 4 x 3 weights and 4 biases arrive."""
    model = caffe_pb2.NetParameter(name="big")
    other = model.layer.add(name="other", type="InnerProduct")
    other.blobs.add().CopyFrom(blob([], [2000, 4000]))
    mine = model.layer.add(name="ip", type="InnerProduct")
    weights = np.arange(12, dtype=np.float32).reshape(4, 3)
    mine.blobs.add().CopyFrom(blob(weights.ravel().tolist(), [4, 3]))
    mine.blobs.add().CopyFrom(blob([7, 8, 9, 10], [4]))
    big = np.full(2000 * 4000, 0.25, np.float32)
    pio.fill_blobproto(other.blobs[0], big.reshape(2000, 4000))
    pio.write_net_binary(model, str(tmp_path / "big.caffemodel"))
    del model, other, big
    net = Net(pio.parse_net_text(NET, "net.prototxt"), TEST)
    tracemalloc.start()
    try:
        copied = net.copy_from(str(tmp_path / "big.caffemodel"), report=False)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert copied == ["ip"]
    np.testing.assert_array_equal(net.params["ip"][0].data, weights)
    np.testing.assert_array_equal(net.params["ip"][1].data, [7, 8, 9, 10])
    assert peak < 4 << 20, peak           # the 32 MB layer was read in place, never copied
    # the reader's own callers still get arrays of their own, writable
    _, arrays = pio.read_net_weights(str(tmp_path / "big.caffemodel"))
    arrays["other"][0][0, 0] = 1.0
    assert arrays["other"][0].shape == (2000, 4000) and arrays["other"][0][0, 1] == 0.25
