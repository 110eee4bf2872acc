"""Files <-> protos <-> arrays: round trips, wire bytes, atomic writes and error messages."""
import io as bytes_io
import os
import struct

import numpy as np
import pytest
from google.protobuf import text_format

from poseidon_caffe import io
from poseidon_caffe.proto import caffe_pb2

NET_TEXT = """name: "tiny"
layer {
  name: "data" type: "Input" top: "data"
  input_param { shape { dim: 2 dim: 3 dim: 4 dim: 4 } }
}
layer {
  name: "conv1" type: "Convolution" bottom: "data" top: "conv1"
  param { lr_mult: 1 } param { lr_mult: 2 decay_mult: 0 }
  convolution_param { num_output: 5 kernel_size: 3 weight_filler { type: "xavier" } }
  include { phase: TRAIN }
}
"""

SOLVER_TEXT = """net: "tiny.prototxt"
base_lr: 0.01
momentum: 0.9
lr_policy: "step"
stepsize: 100
max_iter: 1000
type: "Nesterov"
"""


def write(path, data):
    with open(path, "wb" if isinstance(data, bytes) else "w") as f:
        f.write(data)
    return str(path)


def test_prototxt_text_round_trip(tmp_path):
    net = io.read_net_param(write(tmp_path / "net.prototxt", NET_TEXT))
    assert net.layer[1].convolution_param.kernel_size == [3]
    assert net.layer[1].param[1].decay_mult == 0
    io.write_text_proto(net, tmp_path / "again.prototxt")
    again = io.read_net_param(str(tmp_path / "again.prototxt"))
    assert again == net
    assert text_format.MessageToString(again) == text_format.MessageToString(net)


def test_solver_round_trip(tmp_path):
    solver = io.read_solver_param(write(tmp_path / "solver.prototxt", SOLVER_TEXT))
    assert solver.base_lr == pytest.approx(0.01) and solver.type == "Nesterov"
    io.write_text_proto(solver, tmp_path / "s2.prototxt")
    assert io.read_solver_param(str(tmp_path / "s2.prototxt")) == solver


@pytest.mark.parametrize("shape", [(7,), (3, 5), (2, 3, 4), (2, 1, 3, 5), (2, 3, 1, 2, 3)])
def test_arrays_caffemodel_arrays_bit_equal(tmp_path, shape):
    rng = np.random.default_rng(len(shape))
    weight = rng.standard_normal(shape).astype(np.float32)
    weight.flat[0] = np.float32(1e-38)  # a denormal survives too
    bias = rng.standard_normal(shape[:1]).astype(np.float32)
    net = caffe_pb2.NetParameter(name="n")
    layer = net.layer.add(name="ip", type="InnerProduct")
    layer.blobs.add().CopyFrom(io.array_to_blobproto(weight))
    io.fill_blobproto(layer.blobs.add(), bias)
    path = str(tmp_path / "w.caffemodel")
    io.write_net_binary(net, path)
    back = io.read_net_binary(path)
    got = [io.blobproto_to_array(b) for b in back.layer[0].blobs]
    assert got[0].shape == shape and got[0].dtype == np.float32
    assert got[0].tobytes() == weight.tobytes() and got[1].tobytes() == bias.tobytes()
    # The fast weights path reads and writes the same bytes.
    net2, weights = io.read_net_weights(path)
    assert weights["ip"][0].tobytes() == weight.tobytes()
    assert list(net2.layer[0].blobs[0].shape.dim) == list(shape)
    path2 = str(tmp_path / "w2.caffemodel")
    shell = caffe_pb2.NetParameter(name="n")
    shell.layer.add(name="ip", type="InnerProduct")
    io.write_net_weights(shell, {"ip": [weight, bias]}, path2)
    assert open(path2, "rb").read() == open(path, "rb").read() == net.SerializeToString()


def test_sixty_million_float_blob(tmp_path):
    arr = np.arange(60_000_000, dtype=np.float32)
    arr[::7] *= -0.5
    net = caffe_pb2.NetParameter()
    net.layer.add(name="fc", type="InnerProduct")
    path = str(tmp_path / "big.caffemodel")
    io.write_net_weights(net, {"fc": [arr.reshape(6000, 10000)]}, path)
    assert os.path.getsize(path) > 240_000_000
    _, weights = io.read_net_weights(path)
    assert weights["fc"][0].shape == (6000, 10000)
    assert np.array_equal(weights["fc"][0].reshape(-1), arr)


def hand_blobproto(values, dims):
    """BlobProto bytes by the wire format's rules: tag = number << 3 | wire type."""
    def varint(v):
        out = b""
        while v >= 0x80:
            out += bytes([v & 0x7F | 0x80])
            v >>= 7
        return out + bytes([v])
    data = struct.pack("<%df" % len(values), *values)
    dims_packed = b"".join(varint(d) for d in dims)
    shape = bytes([1 << 3 | 2]) + varint(len(dims_packed)) + dims_packed
    return (bytes([5 << 3 | 2]) + varint(len(data)) + data
            + bytes([7 << 3 | 2]) + varint(len(shape)) + shape)


def test_blobproto_wire_bytes_by_hand():
    raw = hand_blobproto([1.5, -2.0, 0.25, 8.0, 3.0, 9.5], [2, 3])
    blob = caffe_pb2.BlobProto.FromString(raw)
    arr = io.blobproto_to_array(blob)
    assert arr.tolist() == [[1.5, -2.0, 0.25], [8.0, 3.0, 9.5]]
    assert io.array_to_blobproto(arr).SerializeToString() == raw


def test_blobproto_legacy_shape_double_data_and_diff(tmp_path):
    blob = caffe_pb2.BlobProto(num=1, channels=2, height=1, width=3)
    blob.double_data.extend([0.1, 0.2, 0.3, 0.4, 0.5, 0.6])
    blob.diff.extend([1, 2, 3, 4, 5, 6])
    arr = io.blobproto_to_array(blob)
    assert arr.shape == (1, 2, 1, 3) and arr.dtype == np.float64
    assert arr.reshape(-1).tolist() == [0.1, 0.2, 0.3, 0.4, 0.5, 0.6]
    diff = io.blobproto_to_array(blob, return_diff=True)
    assert diff.reshape(-1).tolist() == [1, 2, 3, 4, 5, 6]
    with_diff = io.array_to_blobproto(np.ones((2, 2)), diff=np.full((2, 2), 3.0))
    assert list(with_diff.shape.dim) == [2, 2] and list(with_diff.diff) == [3.0] * 4
    # A mean .binaryproto as Caffe writes it (legacy 4-axis shape).
    path = str(tmp_path / "mean.binaryproto")
    io.write_blobproto(blob, path)
    assert io.read_blobproto(path) == blob


def test_blobprotovector_helpers():
    arrays = [np.arange(6, dtype=np.float32).reshape(2, 3), np.array([7.0], np.float32)]
    raw = io.arraylist_to_blobprotovector_str(arrays)
    vec = caffe_pb2.BlobProtoVector.FromString(raw)
    assert len(vec.blobs) == 2 and list(vec.blobs[0].data) == [0, 1, 2, 3, 4, 5]
    back = io.blobprotovector_str_to_arraylist(raw)
    assert [a.tolist() for a in back] == [a.tolist() for a in arrays]


def test_solverstate_with_history(tmp_path):
    state = caffe_pb2.SolverState(iter=1200, learned_net="snap_iter_1200.caffemodel",
                                  current_step=2)
    history = [np.full((3, 2), 0.5, np.float32), np.array([-1.0, 2.0], np.float32)]
    for h in history:
        io.fill_blobproto(state.history.add(), h)
    path = str(tmp_path / "snap.solverstate")
    io.write_solverstate(state, path)
    back = io.read_solverstate(path)
    assert back.iter == 1200 and back.current_step == 2
    assert back.learned_net == "snap_iter_1200.caffemodel"
    assert [io.blobproto_to_array(b).tolist() for b in back.history] == \
        [h.tolist() for h in history]


def test_datum_raw_float_and_label():
    img = np.arange(24, dtype=np.uint8).reshape(2, 3, 4)
    datum = io.array_to_datum(img, label=7)
    assert (datum.channels, datum.height, datum.width, datum.label) == (2, 3, 4, 7)
    assert datum.data == img.tobytes() and len(datum.float_data) == 0
    back = io.datum_to_array(io.parse_datum(datum.SerializeToString()))
    assert back.dtype == np.uint8 and np.array_equal(back, img)
    flt = np.linspace(-1, 1, 12).astype(np.float32).reshape(1, 3, 4)
    fdatum = io.array_to_datum(flt)
    assert not fdatum.HasField("label") and len(fdatum.data) == 0
    assert list(fdatum.float_data) == flt.reshape(-1).tolist()
    assert np.array_equal(io.datum_to_array(fdatum), flt)
    with pytest.raises(ValueError, match="3-axis"):
        io.array_to_datum(np.zeros((2, 2)))


def test_datum_encoded_png_decodes_to_bgr():
    from PIL import Image
    rgb = np.zeros((2, 3, 3), np.uint8)
    rgb[..., 0] = 200  # red
    rgb[0, 0] = (10, 20, 30)
    buf = bytes_io.BytesIO()
    Image.fromarray(rgb).save(buf, format="PNG")
    datum = caffe_pb2.Datum(channels=3, height=2, width=3, data=buf.getvalue(), encoded=True,
                            label=1)
    arr = io.datum_to_array(datum)
    assert arr.shape == (3, 2, 3)
    assert arr[:, 0, 0].tolist() == [30, 20, 10]  # B, G, R
    assert arr[2, 1, 1] == 200 and arr[0, 1, 1] == 0


def test_image_helpers_reexported(tmp_path):
    assert io.Transformer is not None and callable(io.load_image)
    t = io.Transformer({"data": (1, 3, 4, 5)})
    t.set_transpose("data", (2, 0, 1))
    t.set_channel_swap("data", (2, 1, 0))
    t.set_raw_scale("data", 255)
    t.set_mean("data", np.array([10.0, 20.0, 30.0]))
    img = np.random.default_rng(0).random((4, 5, 3)).astype(np.float32)
    out = t.preprocess("data", img)
    expect = img.transpose(2, 0, 1)[::-1] * 255 - np.array([10, 20, 30.0])[:, None, None]
    assert np.allclose(out, expect, atol=1e-4)
    assert np.allclose(t.deprocess("data", out), img, atol=1e-5)


def test_atomic_write_survives_a_crash_mid_write(tmp_path, monkeypatch):
    path = str(tmp_path / "model.caffemodel")
    good = caffe_pb2.NetParameter(name="good")
    io.fill_blobproto(good.layer.add(name="a").blobs.add(), np.ones(1000, np.float32))
    io.write_net_binary(good, path)
    before = open(path, "rb").read()

    real_chunks = io._message_chunks

    def crashing_chunks(message):
        for i, chunk in enumerate(real_chunks(message)):
            if i == 2:
                raise OSError("disk went away")
            yield chunk
    monkeypatch.setattr(io.proto_files, "_message_chunks", crashing_chunks)
    bad = caffe_pb2.NetParameter(name="bad")
    io.fill_blobproto(bad.layer.add(name="a").blobs.add(), np.zeros(5000, np.float32))
    with pytest.raises(OSError, match="disk went away"):
        io.write_net_binary(bad, path)
    assert open(path, "rb").read() == before
    assert os.listdir(tmp_path) == ["model.caffemodel"]
    assert io.read_net_binary(path).name == "good"


def test_chunked_serialization_equals_protobuf():
    net = io.parse_net_text(NET_TEXT)
    io.fill_blobproto(net.layer[1].blobs.add(), np.ones((5, 3, 3, 3), np.float32))
    net.state.phase = caffe_pb2.TEST
    assert b"".join(io._message_chunks(net)) == net.SerializeToString()


# ----------------------------------------------------------------------------- errors

def test_error_malformed_prototxt_names_file_line_column(tmp_path):
    path = write(tmp_path / "bad.prototxt", 'name: "x"\nlayer {\n  name: "a"\n  kernel: 3\n}\n')
    with pytest.raises(io.ProtoFileError) as e:
        io.read_net_param(path)
    msg = str(e.value)
    assert msg.startswith(path + ":4:3:") and "kernel" in msg and "\n" not in msg
    path = write(tmp_path / "open.prototxt", 'layer {\n  name: "a"\n')
    with pytest.raises(io.ProtoFileError, match=r"open\.prototxt:\d+:\d+: .*Expected"):
        io.read_net_param(path)


def test_error_missing_file(tmp_path):
    for reader in (io.read_net_param, io.read_solver_param, io.read_net_binary,
                   io.read_blobproto, io.read_solverstate):
        with pytest.raises(io.ProtoFileError, match="nope.x: no such file"):
            reader(str(tmp_path / "nope.x"))


def test_error_solver_given_as_net_and_net_as_solver(tmp_path):
    solver_path = write(tmp_path / "solver.prototxt", SOLVER_TEXT)
    with pytest.raises(io.ProtoFileError) as e:
        io.read_net_param(solver_path)
    assert "solver.prototxt:1:1" in str(e.value) and "looks like a solver" in str(e.value)
    net_path = write(tmp_path / "net.prototxt", NET_TEXT)
    with pytest.raises(io.ProtoFileError) as e:
        io.read_solver_param(net_path)
    assert "net.prototxt:1:1" in str(e.value) and "looks like a net" in str(e.value)
    assert "'name' belongs to NetParameter" in str(e.value)


def test_error_text_file_given_as_binary(tmp_path):
    path = write(tmp_path / "net.prototxt", NET_TEXT)
    with pytest.raises(io.ProtoFileError, match=r"net\.prototxt: is a text file, expected a "
                                                r"binary \.caffemodel"):
        io.read_net_binary(path)
    # the weights reader says what the file is and what takes it
    with pytest.raises(io.ProtoFileError, match=r"net\.prototxt: is a net definition \(text "
                                                r"prototxt\), not a \.caffemodel of weights; "
                                                r"-model takes it$"):
        io.read_net_weights(path)


def test_error_truncated_binary(tmp_path):
    net = caffe_pb2.NetParameter(name="n")
    io.fill_blobproto(net.layer.add(name="a").blobs.add(), np.ones(100, np.float32))
    raw = net.SerializeToString()
    path = write(tmp_path / "cut.caffemodel", raw[:len(raw) // 2])
    for reader in (io.read_net_binary, io.read_net_weights):
        with pytest.raises(io.ProtoFileError) as e:
            reader(path)
        assert "cut.caffemodel" in str(e.value) and "truncated" in str(e.value)
    state = caffe_pb2.SolverState(iter=3)
    io.fill_blobproto(state.history.add(), np.ones(50, np.float32))
    raw = state.SerializeToString()
    path = write(tmp_path / "cut.solverstate", raw[:-10])
    with pytest.raises(io.ProtoFileError, match=r"cut\.solverstate: .*truncated"):
        io.read_solverstate(path)


def test_error_wrong_kind_of_binary(tmp_path):
    state = caffe_pb2.SolverState(iter=3, current_step=1)
    path = write(tmp_path / "x.solverstate", state.SerializeToString())
    with pytest.raises(io.ProtoFileError, match=r"x\.solverstate: not a binary \.caffemodel"):
        io.read_net_binary(path)


def test_error_binary_given_as_prototxt(tmp_path):
    path = write(tmp_path / "w.caffemodel", b"\n\x01n\xa2\x06\x00\xff\xfe")
    with pytest.raises(io.ProtoFileError, match=r"w\.caffemodel: not a text net prototxt"):
        io.read_net_param(path)
