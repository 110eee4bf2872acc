"""Fuzzing of every file and argument reader: valid seed inputs written by each format's own
rules, mutators (random bytes, truncation, flipped bytes, splices, huge varints, wrong wire
types, text edits), the readers as targets, and the property they share.

The property: a reader given any input either returns, or raises one of the project's error
classes with a one-line message naming the file (or the flag), within a time bound and without
allocating memory out of proportion to the input.  tests/test_fuzz_readers.py runs it with a
small budget; scripts/fuzz.py runs the same targets for as long as asked.
"""
import os
import time
import tracemalloc

import numpy as np
from hypothesis import strategies as st

from poseidon_caffe.tools import flags as flagmod
from poseidon_caffe import io as pio
from poseidon_caffe.cli import ALL_FLAGS
from poseidon_caffe.data import db as dbmod
from poseidon_caffe.data.images import datum_image
from poseidon_caffe.data.transform import load_mean_file
from poseidon_caffe.proto import caffe_pb2, is_repeated
from poseidon_caffe.solver import snapshot
from poseidon_caffe.launch.hosts import HostFileError, read_localserver

# Generated inputs stay under this size (bytes): the point is structure, not volume.
MAX_INPUT = 1 << 16
# Peak Python/numpy allocation allowed while reading one input: a fixed allowance plus a
# multiple of the input's size.  A length field believed (10^12 elements) goes far past it.
MEMORY_BASE = 32 << 20
MEMORY_PER_INPUT_BYTE = 64
# Wall-clock bound for one read: a hang detector, generous for a loaded CI machine (reads of
# these inputs take milliseconds), not a speed figure.
SECONDS_PER_INPUT = 10.0


# ---------------------------------------------------------------------------
# Seeds: valid inputs, written by the formats' own rules
# ---------------------------------------------------------------------------

NET_TEXT = """name: "seed"
layer { name: "data" type: "Input" top: "data"
  input_param { shape { dim: 2 dim: 1 dim: 6 dim: 6 } } }
layer { name: "conv" type: "Convolution" bottom: "data" top: "conv"
  param { lr_mult: 1 } param { lr_mult: 2 }
  convolution_param { num_output: 3 kernel_size: 3 stride: 1 weight_filler { type: "xavier" } } }
layer { name: "pool" type: "Pooling" bottom: "conv" top: "pool"
  pooling_param { pool: MAX kernel_size: 2 stride: 2 } }
layer { name: "ip" type: "InnerProduct" bottom: "pool" top: "ip"
  inner_product_param { num_output: 4 } }
layer { name: "relu" type: "ReLU" bottom: "ip" top: "ip" }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip" bottom: "label" top: "loss"
  include { phase: TRAIN } }
"""

LEGACY_NET_TEXT = """name: "legacy"
input: "data" input_dim: 1 input_dim: 1 input_dim: 4 input_dim: 4
layers { name: "ip" type: INNER_PRODUCT bottom: "data" top: "ip" blobs_lr: 1 blobs_lr: 2
  weight_decay: 1 weight_decay: 0 inner_product_param { num_output: 2 } }
layers { name: "relu" type: RELU bottom: "ip" top: "ip" }
"""

SOLVER_TEXT = """net: "train_val.prototxt"
test_iter: 10
test_interval: 500
base_lr: 0.01
momentum: 0.9
weight_decay: 0.0005
lr_policy: "inv"
gamma: 0.0001
power: 0.75
display: 100
max_iter: 1000
snapshot: 500
snapshot_prefix: "lenet"
solver_mode: CPU
type: "SGD"
"""

LEGACY_SOLVER_TEXT = """train_net: "a.prototxt"
base_lr: 0.1 lr_policy: "step" stepsize: 10 gamma: 0.5 solver_type: NESTEROV momentum: 0.9
"""

HOST_TEXT = "0 127.0.0.1 9999\n1 localhost 10000\n\n2 ::1 10001\n"

FLAG_ARGS = [
    ["-solver=examples/mnist/lenet_solver.prototxt", "-gpu", "0", "-iterations=50",
     "-nosvb", "--staleness", "2", "-sync=ps", "-dwbp=false", "-level", "1", "--", "rest"],
    ["-model", "net.prototxt", "-weights=a.caffemodel,b.caffemodel", "-stage=x,y",
     "-ranks_per_host=1", "-server_ranks=0"],
]


def _rng(seed):
    return np.random.default_rng(seed)


def caffemodel_seed():
    """A .caffemodel of a small net, written by write_net_weights (shapes + float32 data)."""
    net = pio.parse_net_text(NET_TEXT)
    r = _rng(1)
    weights = {"conv": [r.standard_normal((3, 1, 3, 3)), r.standard_normal(3)],
               "ip": [r.standard_normal((4, 12)), r.standard_normal(4)]}
    return _serialize_weights(net, weights)


def _serialize_weights(net, weights):
    layer_number = caffe_pb2.NetParameter.DESCRIPTOR.fields_by_name["layer"].number
    head = caffe_pb2.NetParameter(name=net.name).SerializeToString()
    body = [head]
    for layer in net.layer:
        if layer.name in weights:
            chunks = pio._weights_layer_chunks(layer, weights[layer.name])
        else:
            chunks = [layer.SerializeToString()]
        chunks = [bytes(c) for c in chunks]
        body += [pio._len_header(layer_number, sum(len(c) for c in chunks))] + chunks
    return b"".join(body)


def legacy_caffemodel_seed():
    """A V1-layer caffemodel with legacy 4-d blob shapes and unpacked-in-proto values."""
    net = caffe_pb2.NetParameter(name="v1")
    layer = net.layers.add(name="ip", type=caffe_pb2.V1LayerParameter.INNER_PRODUCT)
    layer.bottom.append("data")
    layer.top.append("ip")
    blob = layer.blobs.add(num=1, channels=1, height=2, width=3)
    blob.data.extend([0.5, -1, 2, 3, 4, 5])
    bias = layer.blobs.add(num=1, channels=1, height=1, width=2)
    bias.double_data.extend([1.0, 2.0])
    return net.SerializeToString()


def solverstate_seed():
    state = caffe_pb2.SolverState(iter=500, learned_net="lenet_iter_500.caffemodel",
                                  current_step=1)
    r = _rng(2)
    for shape in ((3, 1, 3, 3), (3,), (4, 12)):
        pio.fill_blobproto(state.history.add(), r.standard_normal(shape))
    return state.SerializeToString()


def binaryproto_seed():
    return pio.array_to_blobproto(_rng(3).uniform(0, 255, (1, 3, 4, 5))).SerializeToString()


def rngstate_seed():
    """A snapshot's random-state side file, as the solver writes it."""
    import json
    state = {"rng": np.random.default_rng(6).bit_generator.state,
             "layers": {"train/mnist": {"offset": 64, "key": "00000064", "skip": 0}}}
    return json.dumps(state, sort_keys=True, indent=1)


def datum_seeds():
    r = _rng(4)
    raw = pio.array_to_datum(r.integers(0, 256, (1, 5, 4), dtype=np.uint8), 7)
    floats = pio.array_to_datum(r.standard_normal((2, 3, 2)).astype(np.float32), 3)
    return [raw.SerializeToString(), floats.SerializeToString(), _encoded_datum()]


def _encoded_datum():
    import io as bytes_io
    from PIL import Image
    buf = bytes_io.BytesIO()
    Image.fromarray(_rng(5).integers(0, 256, (4, 3, 3), dtype=np.uint8)).save(buf, "PNG")
    datum = caffe_pb2.Datum(channels=3, height=4, width=3, encoded=True, label=1,
                            data=buf.getvalue())
    return datum.SerializeToString()


# ---------------------------------------------------------------------------
# Mutators
# ---------------------------------------------------------------------------

def _varint(value):
    return pio._varint(value)


HUGE_VALUES = [10 ** 12, 2 ** 31 - 1, 2 ** 31, 2 ** 32 - 1, 2 ** 32, 2 ** 62, 2 ** 63 - 1,
               2 ** 64 - 1, 2 ** 70]


def _field_starts(buf, depth=0):
    """[(key offset, length-varint offset or None)] of fields in buf, nested messages included
    as far as they scan cleanly."""
    found = []
    try:
        fields = list(pio._scan_fields(buf))
    except (EOFError, ValueError):
        return found
    for number, wire, start, end, key in fields:
        length_at = None
        if wire == pio._WIRE_LEN:
            _, length_at = pio._read_varint(buf, key)
            found.append((key, length_at))
            if depth < 3 and end > start:
                found += [(k + start, (l + start) if l is not None else None)
                          for k, l in _field_starts(buf[start:end], depth + 1)]
        else:
            found.append((key, None))
    return found


def _replace_varint(buf, at, value):
    _, after = pio._read_varint(buf, at)
    return buf[:at] + _varint(value) + buf[after:]


@st.composite
def binary_mutation(draw, seed):
    """One structured change to a valid binary message."""
    buf = bytes(seed)
    kind = draw(st.sampled_from(["truncate", "flip", "insert", "delete", "splice", "huge_length",
                                 "wire_type", "huge_varint", "duplicate"]))
    n = len(buf)
    if kind == "truncate":
        return buf[:draw(st.integers(0, max(n - 1, 0)))]
    if kind == "flip":
        i = draw(st.integers(0, max(n - 1, 0)))
        return buf[:i] + bytes([buf[i] ^ draw(st.integers(1, 255))]) + buf[i + 1:] if n else buf
    if kind == "insert":
        i = draw(st.integers(0, n))
        return buf[:i] + draw(st.binary(min_size=1, max_size=16)) + buf[i:]
    if kind == "delete":
        i = draw(st.integers(0, n))
        return buf[:i] + buf[i + draw(st.integers(1, 32)):]
    if kind == "splice":
        i, j, k = (draw(st.integers(0, n)) for _ in range(3))
        lo, hi = min(i, j), max(i, j)
        return buf[:k] + buf[lo:hi] + buf[k:]
    if kind == "duplicate":
        return buf + buf[:draw(st.integers(0, n))]
    fields = _field_starts(buf)
    if not fields:
        return buf + _varint(draw(st.sampled_from(HUGE_VALUES)))
    key, length_at = draw(st.sampled_from(fields))
    if kind == "huge_length" and length_at is not None:
        return _replace_varint(buf, length_at, draw(st.sampled_from(HUGE_VALUES + [0, 1, 127])))
    if kind == "wire_type" or length_at is None:
        value, _ = pio._read_varint(buf, key)
        return _replace_varint(buf, key, (value & ~7) | draw(st.integers(0, 7)))
    # huge_varint: a field key or length replaced by an over-long or over-large varint
    raw = draw(st.sampled_from([b"\xff" * 11, b"\x80" * 10 + b"\x01", _varint(2 ** 64 - 1)]))
    return buf[:key] + raw + buf[key + 1:]


@st.composite
def schema_binary(draw, message_class):
    """A message of random fields and edge values (see schema_text), serialized."""
    from google.protobuf import text_format
    message = message_class()
    try:
        text_format.Parse(draw(schema_text(message_class.DESCRIPTOR)), message)
    except text_format.ParseError:
        pass                                     # a value out of range: keep what parsed
    return message.SerializePartialToString()    # required fields may be missing: the
                                                 # readers must cope with such files too


@st.composite
def binary_input(draw, seeds, message_class=None):
    """Random bytes, a message of random fields, or a valid seed with one to four structured
    mutations."""
    choice = draw(st.integers(0, 5))
    if choice == 0:
        return draw(st.binary(max_size=256))
    if choice == 1 and message_class is not None:
        data = draw(schema_binary(message_class))
        if draw(st.booleans()):
            data = draw(binary_mutation(data))
        return data[:MAX_INPUT]
    data = draw(st.sampled_from(seeds))
    for _ in range(draw(st.integers(1, 4))):
        data = draw(binary_mutation(data))
    return data[:MAX_INPUT]


TEXT_EDITS = ["", "{", "}", ":", '"', "'", "\\", "#", "\n", " 1e400", " -1", " nan", " inf",
              " 99999999999999999999999", " -2147483649", ' "\\x"', " layer {", " TRAIN",
              " shape { dim: -5 }", " dim: 4294967296", "\x00", "\u00e9", "\ufeff",
              " type: \"Bogus\"", " net_param { }", " lr_policy: \"bogus\""]


@st.composite
def text_mutation(draw, text):
    lines = text.split("\n")
    kind = draw(st.sampled_from(["drop_line", "dup_line", "swap_lines", "edit", "replace_number",
                                 "truncate", "bytes"]))
    n = len(lines)
    i = draw(st.integers(0, n - 1))
    if kind == "drop_line":
        del lines[i]
    elif kind == "dup_line":
        lines.insert(i, lines[draw(st.integers(0, n - 1))])
    elif kind == "swap_lines":
        j = draw(st.integers(0, n - 1))
        lines[i], lines[j] = lines[j], lines[i]
    elif kind == "edit":
        line = lines[i]
        k = draw(st.integers(0, len(line)))
        cut = draw(st.integers(0, 8))
        lines[i] = line[:k] + draw(st.sampled_from(TEXT_EDITS) | st.text(max_size=8)) \
            + line[k + cut:]
    elif kind == "replace_number":
        import re
        numbers = [m.span() for m in re.finditer(r"-?\d+(\.\d+)?(e-?\d+)?", text)]
        if numbers:
            a, b = draw(st.sampled_from(numbers))
            value = draw(st.sampled_from(["0", "-1", "-2147483648", "2147483648", "1e30", "nan",
                                          "-inf", "18446744073709551616", "0x10", "1.5"]))
            return text[:a] + value + text[b:]
    elif kind == "truncate":
        return text[:draw(st.integers(0, len(text)))]
    else:
        data = bytearray(text.encode("utf-8"))
        if data:
            at = draw(st.integers(0, len(data) - 1))
            data[at] = draw(st.integers(0, 255))
        return bytes(data)
    return "\n".join(lines)


_STRINGS = ["", "data", "conv", "label", "Convolution", "ReLU", "Data", "Input", "SGD", "step",
            "poly", "inv", "multistep", "a.prototxt", "bogus", "\\x00"]
_INTS = [0, 1, 2, 3, -1, 7, 2 ** 31 - 1, -2 ** 31]
_FLOATS = ["0", "1", "-1", "0.5", "1e30", "-1e-30", "nan", "inf", "-inf"]


@st.composite
def schema_text(draw, descriptor, depth=0):
    """Prototxt that parses: fields of ``descriptor`` chosen at random, with edge values."""
    from google.protobuf.descriptor import FieldDescriptor as F
    parts, used = [], set()
    fields = list(descriptor.fields)
    for _ in range(draw(st.integers(0, 5 if depth == 0 else 3))):
        field = draw(st.sampled_from(fields))
        if field.name in used:
            continue
        if not is_repeated(field):
            used.add(field.name)    # a singular field given twice is only a parse error
        if field.type == F.TYPE_MESSAGE:
            if depth >= 3:
                continue
            parts.append("%s { %s }" % (field.name, draw(schema_text(field.message_type,
                                                                     depth + 1))))
            continue
        if field.type == F.TYPE_ENUM:
            value = draw(st.sampled_from([v.name for v in field.enum_type.values]))
        elif field.type == F.TYPE_BOOL:
            value = draw(st.sampled_from(["true", "false"]))
        elif field.type == F.TYPE_STRING or field.type == F.TYPE_BYTES:
            value = '"%s"' % draw(st.sampled_from(_STRINGS))
        elif field.type in (F.TYPE_FLOAT, F.TYPE_DOUBLE):
            value = draw(st.sampled_from(_FLOATS))
        else:
            ints = [i for i in _INTS if i >= 0] if field.type in (F.TYPE_UINT32, F.TYPE_UINT64) \
                else _INTS
            value = str(draw(st.sampled_from(ints)))
        parts.append("%s: %s" % (field.name, value))
    return " ".join(parts)


@st.composite
def text_input(draw, seeds, schema=None):
    """File bytes: random text or bytes, or a valid seed with a few text mutations."""
    choice = draw(st.integers(0, 6))
    if choice == 0:
        return draw(st.binary(max_size=256))
    if choice == 1:
        return draw(st.text(max_size=256)).encode("utf-8", "surrogatepass")
    if choice == 2 and schema is not None:
        return draw(schema_text(schema)).encode("utf-8")[:MAX_INPUT]
    data = draw(st.sampled_from(seeds))
    for _ in range(draw(st.integers(1, 4))):
        data = draw(text_mutation(data if isinstance(data, str)
                                  else data.decode("utf-8", "replace")))
    if isinstance(data, str):
        data = data.encode("utf-8", "surrogatepass")
    return data[:MAX_INPUT]


ARG_PIECES = ["-", "--", "-no", "=", "true", "false", "-1", "1e3", "nan", "-solver", "-gpu",
              "-iterations", "-svb", "-nosvb", "-staleness", "-sync", "-weights", "-help",
              "--help", "-level", "-stage", "-ranks_per_host", "99999999999999999999999",
              "\x00", "\udcff", " ", ""]


@st.composite
def argv_input(draw):
    """An argument list: valid ones with edits, or arguments glued from flag-like pieces."""
    if draw(st.booleans()):
        argv = list(draw(st.sampled_from(FLAG_ARGS)))
        for _ in range(draw(st.integers(1, 4))):
            i = draw(st.integers(0, len(argv)))
            piece = draw(st.sampled_from(ARG_PIECES) | st.text(max_size=12))
            if draw(st.booleans()) and argv and i < len(argv):
                argv[i] = argv[i] + piece
            elif draw(st.booleans()) and argv and i < len(argv):
                del argv[i]
            else:
                argv.insert(i, piece)
        return argv
    return draw(st.lists(st.lists(st.sampled_from(ARG_PIECES) | st.text(max_size=6),
                                  min_size=1, max_size=3).map("".join), max_size=8))


# ---------------------------------------------------------------------------
# Targets: each reads one input the way the project does
# ---------------------------------------------------------------------------

class Target:
    """A reader under test: ``read(path_or_data)``, the error classes it may raise, and
    whether its input is a file (then its message must name the file)."""

    def __init__(self, name, read, errors, strategy, suffix="", is_file=True):
        self.name, self.read, self.errors = name, read, errors
        self.strategy, self.suffix, self.is_file = strategy, suffix, is_file


def _read_caffemodel(path):
    pio.read_net_binary(path)
    pio.read_net_weights(path)


def _read_blobproto(path):
    pio.blobproto_to_array(pio.read_blobproto(path), source=path)
    load_mean_file(path)


def _read_lmdb_record(value):
    datum = dbmod.parse_datum(value, "/data/fuzz_lmdb", b"00000001")
    datum_image(datum, name="record '00000001' of /data/fuzz_lmdb")


def _read_lmdb_database(values):
    """Records written into a real LMDB, read back the way the Data layer reads them."""
    import tempfile
    with tempfile.TemporaryDirectory() as directory:
        path = os.path.join(directory, "fuzz_lmdb")
        with dbmod.DatumWriter(path) as writer:
            for i, value in enumerate(values):
                writer.put("%08d" % i, value)
        database = dbmod.DatumDB(path)
        try:
            database.first_datum()
            reader = dbmod.ShardedRecordReader(database, rank=0, size=1)
            for i in range(len(values)):
                datum_image(reader.next_datum(), name="record %d of %s" % (i, path))
            reader.close()
        except dbmod.DataError as exc:
            # the database's temporary path is not known to the caller: name it generically
            raise dbmod.DataError(str(exc).replace(path, "/data/fuzz_lmdb")) from None
        finally:
            database.close()


def _read_datum_helpers(value):
    pio.datum_to_array(pio.parse_datum(value, "fuzz-record"), source="fuzz-record")


def _read_flags(argv):
    flagmod.parse(argv, ALL_FLAGS)


def _read_rngstate(path):
    snapshot.read_rngstate(path[:-len(".rngstate")] + ".solverstate")


def _read_hosts(path):
    read_localserver(path)


COMPUTE_CSV = "# batch: 4\nlayer,forward_ms,backward_ms\ndata,0,0\nip1,1.5,3\nloss,0.5,1\n"
COMPUTE_JSON = ('{"batch": 4, "layers": [{"name": "data", "forward_ms": 0, "backward_ms": 0}, '
                '{"name": "ip1", "forward_ms": 1.5, "backward_ms": 3}, '
                '{"name": "loss", "forward_ms": 0.5, "backward_ms": 1}]}')
COMPUTE_BENCH = ('{"device": "d", "emulated": true, "nets": {"other": {"batch": 4, "layers": '
                 '[{"name": "conv", "forward_ms": 1, "backward_ms": 2}]}, "fuzz": '
                 + COMPUTE_JSON + '}}')
COMPUTE_LOG = "".join("I1123 10:00:00.000000  1234 caffe_tool.py:375] %10s\t%s: %g ms.\n" % (n, k, v)
                      for n, f, b in (("data", 0, 0), ("ip1", 1.5, 3), ("loss", 0.5, 1))
                      for k, v in (("forward", f), ("backward", b)))


def _simulation_error():
    from poseidon_caffe.simulator.model import SimulationError
    return SimulationError


def _read_compute_file(path):
    from poseidon_caffe.simulator.compute import read_compute_file
    from poseidon_caffe.simulator.model import NetModel, Param
    model = NetModel("fuzz", ["data", "ip1", "loss"], ["Input", "InnerProduct", "SoftmaxWithLoss"],
                     [Param(0, "ip1[0]", (3, 4), 1, 1)], batch=4)
    read_compute_file(path, model)


def targets():
    models = binary_input([caffemodel_seed(), legacy_caffemodel_seed()], caffe_pb2.NetParameter)
    states = binary_input([solverstate_seed()], caffe_pb2.SolverState)
    means = binary_input([binaryproto_seed()], caffe_pb2.BlobProto)
    datums = binary_input(datum_seeds(), caffe_pb2.Datum)
    nets = text_input([NET_TEXT, LEGACY_NET_TEXT], caffe_pb2.NetParameter.DESCRIPTOR)
    solvers = text_input([SOLVER_TEXT, LEGACY_SOLVER_TEXT], caffe_pb2.SolverParameter.DESCRIPTOR)
    all_targets = [
        Target("net_prototxt", pio.read_net_param, (pio.ProtoFileError,), nets, ".prototxt"),
        Target("solver_prototxt", pio.read_solver_param, (pio.ProtoFileError,), solvers,
               ".prototxt"),
        Target("caffemodel", _read_caffemodel, (pio.ProtoFileError,), models, ".caffemodel"),
        Target("solverstate", snapshot.read_state, (pio.ProtoFileError, snapshot.SnapshotError),
               states, ".solverstate"),
        Target("rngstate", _read_rngstate, (snapshot.SnapshotError,),
               text_input([rngstate_seed()]), ".rngstate"),
        Target("binaryproto", _read_blobproto, (pio.ProtoFileError, dbmod.DataError), means,
               ".binaryproto"),
        Target("lmdb_datum", _read_lmdb_record, (dbmod.DataError,), datums, is_file=False),
        Target("lmdb_database", _read_lmdb_database, (dbmod.DataError,),
               st.lists(datums, min_size=1, max_size=3), is_file=False),
        Target("io_datum", _read_datum_helpers, (pio.ProtoFileError,), datums, is_file=False),
        Target("host_file", _read_hosts, (HostFileError,), text_input([HOST_TEXT])),
        Target("flags", _read_flags, (flagmod.FlagError,), argv_input(), is_file=False),
        Target("compute_file", _read_compute_file, (_simulation_error(),),
               text_input([COMPUTE_CSV, COMPUTE_JSON, COMPUTE_BENCH, COMPUTE_LOG]), ".csv"),
    ]
    return {t.name: t for t in all_targets}


# The names that must appear in a non-file target's error: where the value came from.
_SOURCE_NAMES = {"lmdb_datum": "/data/fuzz_lmdb", "lmdb_database": "/data/fuzz_lmdb",
                 "io_datum": "fuzz-record", "flags": "flag"}


class ReaderFailure(AssertionError):
    pass


def check(target, data, directory):
    """The property, for one input: returns normally or raises ReaderFailure."""
    if target.is_file:
        path = os.path.join(directory, "input" + target.suffix)
        with open(path, "wb") as f:
            f.write(data)
        subject, source = path, path
    else:
        subject, source = data, _SOURCE_NAMES[target.name]
    tracing = tracemalloc.is_tracing()
    if not tracing:
        tracemalloc.start()
    tracemalloc.reset_peak()
    start = time.perf_counter()
    try:
        target.read(subject)
    except target.errors as exc:
        message = str(exc)
        if source not in message:
            raise ReaderFailure("%s: error does not name %s: %s" % (target.name, source,
                                                                   message)) from exc
        if "\n" in message:
            raise ReaderFailure("%s: error message is not one line: %r"
                                % (target.name, message)) from exc
    except Exception as exc:
        raise ReaderFailure("%s: raw %s for input %r: %s"
                            % (target.name, type(exc).__name__, _short(data), exc)) from exc
    finally:
        seconds = time.perf_counter() - start
        _, peak = tracemalloc.get_traced_memory()
        if not tracing:
            tracemalloc.stop()
    size = len(data) if isinstance(data, (bytes, bytearray)) else sum(map(len, data)) + 64
    if peak > MEMORY_BASE + MEMORY_PER_INPUT_BYTE * size:
        raise ReaderFailure("%s: reading %d bytes allocated %d bytes at peak"
                            % (target.name, size, peak))
    if seconds > SECONDS_PER_INPUT:
        raise ReaderFailure("%s: reading %d bytes took %.1f s" % (target.name, size, seconds))


def _short(data):
    return data if len(data) <= 200 else data[:200] + (b"..." if isinstance(data, bytes)
                                                        else ["..."])
