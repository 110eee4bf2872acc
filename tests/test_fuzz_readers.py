"""Every reader of outside input (prototxt nets and solvers, .caffemodel, .solverstate,
.binaryproto, Datum records, host files, command-line flags) either loads what it is given or
raises the project's error naming the file, quickly and without believing a length field.

The properties run a small, fixed set of examples here (the ``ci`` profile); scripts/fuzz.py
runs them with random seeds for as long as asked.  Each crash the fuzzer found is kept below
as a regression test with its input written out by hand.
"""
import os
import re
import tempfile

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import fuzzing
from poseidon_caffe.tools import flags as flagmod
from poseidon_caffe import io as pio
from poseidon_caffe.cli import ALL_FLAGS
from poseidon_caffe.data.db import DataError, DatumDB, DatumWriter
from poseidon_caffe.proto import caffe_pb2
from poseidon_caffe.solver import snapshot
from poseidon_caffe.launch.hosts import HostFileError, read_localserver

settings.register_profile(
    "fuzz-ci", max_examples=int(os.environ.get("POSEIDON_FUZZ_EXAMPLES", "40")), deadline=None,
    derandomize=True, database=None, suppress_health_check=list(HealthCheck))
settings.register_profile(
    "fuzz-long", max_examples=int(os.environ.get("POSEIDON_FUZZ_EXAMPLES", "2000")), deadline=None,
    derandomize=False, database=None, suppress_health_check=list(HealthCheck))
PROFILE = settings.get_profile("fuzz-" + os.environ.get("POSEIDON_FUZZ_PROFILE", "ci"))

TARGETS = fuzzing.targets()


@pytest.fixture(autouse=True)
def _no_name_lookups(monkeypatch):
    """Host files name machines; resolve them as numeric addresses (and localhost) only, so the
    properties never wait on DNS. The reader's handling of a failed lookup is unchanged."""
    import socket
    real = socket.getaddrinfo

    def numeric_only(host, port, *args, **kwargs):
        if host == "localhost":
            return real("127.0.0.1", port)
        return real(host, port, flags=socket.AI_NUMERICHOST)

    monkeypatch.setattr(socket, "getaddrinfo", numeric_only)


@pytest.mark.parametrize("name", sorted(TARGETS))
@settings(PROFILE)
@given(data=st.data())
def test_reader_loads_or_names_the_file(name, data):
    target = TARGETS[name]
    value = data.draw(target.strategy, label=name)
    with tempfile.TemporaryDirectory() as directory:
        fuzzing.check(target, value, directory)


def test_seeds_load():
    """The seeds are valid: the property is not passing on inputs that all fail."""
    with tempfile.TemporaryDirectory() as d:
        def path(name, data):
            p = os.path.join(d, name)
            with open(p, "wb") as f:
                f.write(data if isinstance(data, bytes) else data.encode())
            return p
        net = pio.read_net_param(path("n.prototxt", fuzzing.NET_TEXT))
        assert [l.name for l in net.layer][:3] == ["data", "conv", "pool"]
        assert len(pio.read_net_param(path("v1.prototxt", fuzzing.LEGACY_NET_TEXT)).layer) == 3
        assert pio.read_solver_param(path("s.prototxt", fuzzing.SOLVER_TEXT)).max_iter == 1000
        assert pio.read_solver_param(path("l.prototxt", fuzzing.LEGACY_SOLVER_TEXT)).type \
            == "Nesterov"
        _, weights = pio.read_net_weights(path("m.caffemodel", fuzzing.caffemodel_seed()))
        assert weights["conv"][0].shape == (3, 1, 3, 3) and weights["ip"][1].shape == (4,)
        _, weights = pio.read_net_weights(path("v1.caffemodel",
                                                fuzzing.legacy_caffemodel_seed()))
        np.testing.assert_array_equal(weights["ip"][0].ravel(), [0.5, -1, 2, 3, 4, 5])
        it, learned, step, history = snapshot.read_state(path("s.solverstate",
                                                              fuzzing.solverstate_seed()))
        assert (it, learned, step, [h.shape for h in history]) == \
            (500, "lenet_iter_500.caffemodel", 1, [(3, 1, 3, 3), (3,), (4, 12)])
        assert pio.read_blobproto(path("m.binaryproto", fuzzing.binaryproto_seed())).shape.dim \
            == [1, 3, 4, 5]
        shapes = [pio.datum_to_array(pio.parse_datum(s)).shape for s in fuzzing.datum_seeds()]
        assert shapes == [(1, 5, 4), (2, 3, 2), (3, 4, 3)]
        side = snapshot.read_rngstate(path("s.rngstate", fuzzing.rngstate_seed())[:-9]
                                      + ".solverstate")
        assert side["layers"]["train/mnist"]["offset"] == 64
        hosts = read_localserver(path("localserver", fuzzing.HOST_TEXT))
        assert [h[0] for h in hosts] == [0, 1, 2]
        from poseidon_caffe.simulator.compute import read_compute_file
        from poseidon_caffe.simulator.model import NetModel, Param
        model = NetModel("fuzz", ["data", "ip1", "loss"], ["Input", "InnerProduct", "Softmax"],
                         [Param(0, "ip1[0]", (3, 4), 1, 1)], batch=4)
        for name, text in (("t.csv", fuzzing.COMPUTE_CSV), ("t.json", fuzzing.COMPUTE_JSON),
                           ("bench.json", fuzzing.COMPUTE_BENCH), ("t.log", fuzzing.COMPUTE_LOG)):
            assert read_compute_file(path(name, text), model).forward_ms == [0, 1.5, 0.5]
    values, rest = flagmod.parse(fuzzing.FLAG_ARGS[0], ALL_FLAGS)
    assert (values["iterations"], values["svb"], values["staleness"], rest) == \
        (50, False, 2, ["rest"])


def test_the_property_catches_a_raw_exception_and_an_unnamed_file():
    def crash(path):
        raise KeyError("x")

    def anonymous(path):
        raise pio.ProtoFileError("bad file")

    with tempfile.TemporaryDirectory() as d:
        for read in (crash, anonymous):
            target = fuzzing.Target("t", read, (pio.ProtoFileError,), None, ".bin")
            with pytest.raises(fuzzing.ReaderFailure):
                fuzzing.check(target, b"\x08\x01", d)


def test_the_property_catches_a_believed_length_field():
    def trusting(path):
        with open(path, "rb") as f:
            claimed, _ = pio._read_varint(f.read(), 0)
        np.zeros(claimed, dtype=np.uint8)          # allocates what the file claims

    with tempfile.TemporaryDirectory() as d:
        target = fuzzing.Target("t", trusting, (pio.ProtoFileError,), None, ".bin")
        with pytest.raises(fuzzing.ReaderFailure, match="allocated"):
            fuzzing.check(target, pio._varint(200 << 20), d)


# ---------------------------------------------------------------------------
# Regressions: crashes the fuzzer found, inputs written by hand
# ---------------------------------------------------------------------------

def _write(tmp_path, name, data):
    path = tmp_path / name
    path.write_bytes(data)
    return str(path)


def test_empty_mean_file_is_an_error_naming_it(tmp_path):
    # found by the fuzzer: an empty .binaryproto gave "BlobProto holds 0 data values ..." as a
    # bare ValueError without the file's name
    from poseidon_caffe.data.transform import load_mean_file
    path = _write(tmp_path, "mean.binaryproto", b"")
    with pytest.raises(pio.ProtoFileError, match=r"mean.binaryproto: empty file \(0 bytes\)"):
        load_mean_file(path)


def test_mean_file_with_too_few_values_names_it(tmp_path):
    blob = caffe_pb2.BlobProto()
    blob.shape.dim.extend([1, 3, 2, 2])
    blob.data.extend([1.0] * 11)
    from poseidon_caffe.data.transform import load_mean_file
    path = _write(tmp_path, "short.binaryproto", blob.SerializeToString())
    with pytest.raises(pio.ProtoFileError, match=r"short.binaryproto: BlobProto holds 11 data "
                                                 r"values but its shape \[1, 3, 2, 2\] needs 12"):
        load_mean_file(path)


def test_host_file_that_is_not_utf8_text(tmp_path):
    # found by the fuzzer: a host file with byte 0x80 raised UnicodeDecodeError
    path = _write(tmp_path, "localserver", b"0 127.0.0.1 9999\n1 \x80 9999\n")
    with pytest.raises(HostFileError,
                       match="host file .*localserver is not text: byte 19 is not UTF-8"):
        read_localserver(path)


def test_datum_helper_with_a_shape_its_bytes_do_not_fill():
    # found by the fuzzer: channels 0 with 20 bytes of data was numpy's "cannot reshape"
    datum = caffe_pb2.Datum(channels=0, height=5, width=4, data=bytes(20), label=7)
    with pytest.raises(pio.ProtoFileError, match="record 9: Datum channels x height x width = "
                                                 "0 x 5 x 4 but it holds 20 values"):
        pio.datum_to_array(pio.parse_datum(datum.SerializeToString()), source="record 9")


def test_datum_helper_with_a_corrupt_encoded_image_names_the_record():
    datum = caffe_pb2.Datum(encoded=True, data=b"\x89PNG\r\n\x1a\n" + bytes(10))
    with pytest.raises(pio.ProtoFileError, match="^record 3: encoded Datum holds no decodable"):
        pio.datum_to_array(datum, source="record 3")


def test_lmdb_datum_with_negative_dimensions_is_not_a_datum(tmp_path):
    # -1 x -1 x 6 "holds" 6 values by the product alone; the Data layer then failed to reshape
    value = caffe_pb2.Datum(channels=-1, height=-1, width=6, data=bytes(6)).SerializeToString()
    path = str(tmp_path / "neg_lmdb")
    with DatumWriter(path) as writer:
        writer.put("00000000", value)
    database = DatumDB(path)
    try:
        with pytest.raises(DataError, match="record '00000000' of LMDB database '.*neg_lmdb' "
                                            "is not a Caffe Datum: .* -1 x -1 x 6"):
            database.first_datum()
    finally:
        database.close()


def _one_layer_model(blob):
    net = caffe_pb2.NetParameter(name="m")
    layer = net.layer.add(name="ip", type="InnerProduct")
    layer.blobs.add().CopyFrom(blob)
    return net.SerializeToString()


def test_caffemodel_blob_with_negative_dimensions(tmp_path):
    blob = caffe_pb2.BlobProto()
    blob.shape.dim.extend([-1, -1])
    blob.data.append(1.0)                          # (-1) x (-1) = 1 value "fits"
    path = _write(tmp_path, "neg.caffemodel", _one_layer_model(blob))
    with pytest.raises(pio.ProtoFileError, match=r"neg.caffemodel: layer ip: BlobProto shape "
                                                 r"\[-1, -1\] has a negative dimension"):
        pio.read_net_weights(path)


def test_caffemodel_blob_whose_dimensions_overflow_64_bits(tmp_path):
    # 2^32 x 2^32 wraps to 0 in 64-bit arithmetic, which an empty payload "matched"
    blob = caffe_pb2.BlobProto()
    blob.shape.dim.extend([2 ** 32, 2 ** 32])
    path = _write(tmp_path, "huge.caffemodel", _one_layer_model(blob))
    with pytest.raises(pio.ProtoFileError, match=r"huge.caffemodel: layer ip: BlobProto shape "
                                                 r"\[4294967296, 4294967296\] is too large"):
        pio.read_net_weights(path)
    blob.shape.dim[:] = [2 ** 20, 2 ** 20]        # a possible shape: its count is checked
    path = _write(tmp_path, "big.caffemodel", _one_layer_model(blob))
    with pytest.raises(pio.ProtoFileError, match="big.caffemodel: layer ip: .*holds 0 .*values "
                                                 "but its shape .* needs 1099511627776"):
        pio.read_net_weights(path)


def test_caffemodel_payload_of_a_ragged_byte_length(tmp_path):
    blob = caffe_pb2.BlobProto()
    blob.shape.dim.append(2)
    head = blob.SerializeToString()
    payload = np.array([1.0, 2.0], "<f4").tobytes() + b"\x00\x00"   # 10 bytes: 2.5 floats
    blob_bytes = pio._len_header(5, len(payload)) + payload + head
    layer = caffe_pb2.LayerParameter(name="ip").SerializeToString() \
        + pio._len_header(7, len(blob_bytes)) + blob_bytes
    path = _write(tmp_path, "ragged.caffemodel", pio._len_header(100, len(layer)) + layer)
    with pytest.raises(pio.ProtoFileError, match="ragged.caffemodel: .*payload is 10 bytes, "
                                                 "not a whole number of 4-byte values"):
        pio.read_net_weights(path)


def test_caffemodel_payload_in_two_pieces_is_appended_as_protobuf_does(tmp_path):
    blob = caffe_pb2.BlobProto()
    blob.shape.dim.append(3)
    first, second = (np.array(v, "<f4").tobytes() for v in ([1.0, 2.0], [3.0]))
    blob_bytes = (pio._len_header(5, len(first)) + first + pio._len_header(5, len(second))
                  + second + blob.SerializeToString())
    layer = caffe_pb2.LayerParameter(name="ip").SerializeToString() \
        + pio._len_header(7, len(blob_bytes)) + blob_bytes
    path = _write(tmp_path, "two.caffemodel", pio._len_header(100, len(layer)) + layer)
    _, weights = pio.read_net_weights(path)
    np.testing.assert_array_equal(weights["ip"][0], [1.0, 2.0, 3.0])
    slow = pio.read_net_binary(path)               # the protobuf runtime agrees
    assert list(slow.layer[0].blobs[0].data) == [1.0, 2.0, 3.0]


def test_solverstate_history_blob_that_does_not_fill_its_shape(tmp_path):
    state = caffe_pb2.SolverState(iter=3)
    history = state.history.add()
    history.shape.dim.extend([2, 2])
    history.data.extend([0.5] * 3)
    path = _write(tmp_path, "x.solverstate", state.SerializeToString())
    with pytest.raises(pio.ProtoFileError, match=r"x.solverstate: history blob 0: BlobProto "
                                                 r"holds 3 data values but its shape \[2, 2\]"):
        snapshot.read_state(path)


@pytest.mark.parametrize("text, expected", [
    ("[]", "holds no 'rng' generator state"),
    ('{"rng": {"bit_generator": "PCG64", "state": {"state": "x", "inc": 1}}}',
     "'rng' is not a generator state this numpy accepts"),
    ('{"rng": {"bit_generator": "Nope"}, "layers": {}}',
     "'rng' is not a generator state this numpy accepts"),
    ('{"rng": {}, "layers": {"train/data": 5}}', "'layers' is not a mapping of layer states"),
])
def test_random_state_side_file_of_the_wrong_shape(tmp_path, text, expected):
    # valid JSON that is not a random state used to fail at resume with a raw TypeError or
    # KeyError inside numpy
    (tmp_path / "s_iter_4.rngstate").write_text(text)
    with pytest.raises(snapshot.SnapshotError, match="s_iter_4.rngstate.*" + re.escape(expected)):
        snapshot.read_rngstate(str(tmp_path / "s_iter_4.solverstate"))


def _huge_length(message_bytes):
    """The message with its first length-delimited field's length replaced by 10^12."""
    for number, wire, start, end, key in pio._scan_fields(message_bytes):
        if wire == pio._WIRE_LEN:
            return fuzzing._replace_varint(message_bytes, pio._read_varint(message_bytes,
                                                                            key)[1], 10 ** 12)
    raise AssertionError("no length-delimited field")


@pytest.mark.parametrize("name", ["caffemodel", "solverstate", "binaryproto", "io_datum",
                                  "lmdb_datum"])
def test_a_length_field_claiming_a_trillion_bytes_is_not_believed(tmp_path, name):
    seeds = {"caffemodel": fuzzing.caffemodel_seed(), "solverstate": fuzzing.solverstate_seed(),
             "binaryproto": fuzzing.binaryproto_seed(), "io_datum": fuzzing.datum_seeds()[2],
             "lmdb_datum": fuzzing.datum_seeds()[0]}
    data = _huge_length(seeds[name])
    target = TARGETS[name]
    subject = data
    if target.is_file:
        subject = tmp_path / ("x" + target.suffix)
        subject.write_bytes(data)
        subject = str(subject)
    with pytest.raises(target.errors, match="truncated|not a Caffe Datum|cannot decode"):
        target.read(subject)
    fuzzing.check(target, data, str(tmp_path))        # and within the memory bound


def test_mean_file_with_empty_axes_too_large_for_any_array(tmp_path):
    # found by the fuzzer: num = channels = 2^31 - 1 with height 0 holds "0 values" as it
    # should, and numpy then refused the shape with "array is too big"
    from poseidon_caffe.data.transform import load_mean_file
    blob = caffe_pb2.BlobProto(num=2 ** 31 - 1, channels=2 ** 31 - 1)
    blob.shape.SetInParent()
    path = _write(tmp_path, "wide.binaryproto", blob.SerializeToString())
    with pytest.raises(pio.ProtoFileError, match=r"wide.binaryproto: BlobProto shape "
                                                 r"\[2147483647, 2147483647, 0, 0\] is too large"):
        load_mean_file(path)


def test_caffemodel_missing_required_fields_loads(tmp_path):
    # ClipParameter's min and max are required; the fuzzer's schema-built messages lack them
    # at times. Both readers load such a file (protobuf's partial parse, like Caffe's
    # ReadProtoFromBinaryFile); checking the values is net building's task
    net = caffe_pb2.NetParameter(name="partial")
    net.layer.add(name="clip", type="Clip").clip_param.SetInParent()
    path = _write(tmp_path, "partial.caffemodel", net.SerializePartialToString())
    read, weights = pio.read_net_weights(path)
    assert read.layer[0].HasField("clip_param") and weights == {"clip": []}
    assert pio.read_net_binary(path).layer[0].name == "clip"


def test_caffemodel_with_a_layer_name_that_is_not_utf8(tmp_path):
    # found by the fuzzer: binary parsing hands back invalid UTF-8 strings as bytes; the V1
    # upgrade then failed with a raw UnicodeDecodeError
    net = caffe_pb2.NetParameter(name="v1")
    layer = net.layers.add(name="ip", type=caffe_pb2.V1LayerParameter.INNER_PRODUCT)
    layer.bottom.append("data")
    path = _write(tmp_path, "v1.caffemodel",
                  net.SerializeToString().replace(b"data", b"\xe4ata"))
    for read in (pio.read_net_binary, pio.read_net_weights):
        with pytest.raises(pio.ProtoFileError, match=r"v1.caffemodel: cannot read binary "
                                                     r".*string field layers\[0\].bottom\[0\] "
                                                     r"is not UTF-8 text"):
            read(path)


def test_solverstate_naming_its_model_in_bytes_that_are_not_utf8(tmp_path):
    state = caffe_pb2.SolverState(iter=1, learned_net="m.caffemodel")
    path = _write(tmp_path, "s.solverstate",
                  state.SerializeToString().replace(b"m.caffe", b"\xff.caffe"))
    with pytest.raises(pio.ProtoFileError, match="s.solverstate: .*string field learned_net"):
        snapshot.read_state(path)


def test_datum_helper_with_empty_axes_too_large_for_any_array():
    # found by the fuzzer: 2^31-1 x 2^31-1 x 0 "holds" its 0 values; numpy then refused the
    # shape with "array is too big"
    datum = caffe_pb2.Datum(channels=2 ** 31 - 1, height=2 ** 31 - 1, width=0)
    with pytest.raises(pio.ProtoFileError, match="record 5: Datum channels x height x width = "
                                                 "2147483647 x 2147483647 x 0 but it holds 0"):
        pio.datum_to_array(pio.parse_datum(datum.SerializeToString()), source="record 5")
