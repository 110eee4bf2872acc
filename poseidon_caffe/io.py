"""Files <-> protos <-> arrays: prototxt, .caffemodel, .binaryproto, .solverstate and Datum.

Readers upgrade legacy nets and solvers (see upgrade.py) and turn every failure into a one-line
ProtoFileError naming the file.  Writers are atomic: a temporary file in the target's directory,
fsync, then rename, so a crash never leaves a truncated model where a good one was.

Large float payloads never go through the repeated field element by element: arrays enter a
BlobProto as ready-made packed wire bytes, and leave it by re-serializing the BlobProto and
viewing the packed payload with numpy.  For weights, read_net_weights / write_net_weights go
further and move the payload between numpy and the file without the protobuf runtime at all
(AlexNet-size save + load in about a second; see scripts/bench_io.py).
"""
import os
import re
from collections import OrderedDict

import numpy as np
from google.protobuf import text_format
from google.protobuf.message import DecodeError

from .imageio import Transformer, load_image, oversample, resize_image  # noqa: F401  (caffe.io names)
from .proto import caffe_pb2
from . import staging, upgrade

__all__ = [
    "ProtoFileError", "atomic_write",
    "parse_net_text", "read_net_param", "read_solver_param", "parse_solver_text",
    "read_net_binary", "write_net_binary", "read_blobproto", "write_blobproto",
    "read_net_weights", "write_net_weights",
    "read_solverstate", "write_solverstate", "write_text_proto", "parse_datum",
    "blobproto_to_array", "array_to_blobproto", "fill_blobproto", "array_to_datum", "datum_to_array",
    "arraylist_to_blobprotovector_str", "blobprotovector_str_to_arraylist",
    "Transformer", "load_image", "resize_image", "oversample",
]


class ProtoFileError(ValueError):
    """A file that is missing, malformed, truncated or of the wrong kind (one-line message)."""


# ---------------------------------------------------------------------------
# Protobuf wire format helpers
# ---------------------------------------------------------------------------

_WIRE_VARINT, _WIRE_64BIT, _WIRE_LEN, _WIRE_START, _WIRE_END, _WIRE_32BIT = 0, 1, 2, 3, 4, 5


def _varint(value):
    out = bytearray()
    while True:
        low = value & 0x7F
        value >>= 7
        if value:
            out.append(low | 0x80)
        else:
            out.append(low)
            return bytes(out)


def _read_varint(buf, pos):
    result = shift = 0
    end = len(buf)
    while True:
        if pos >= end:
            raise EOFError("varint runs past the end")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise ValueError("varint longer than 10 bytes")


def _len_header(field_number, length):
    return _varint(field_number << 3 | _WIRE_LEN) + _varint(length)


def _scan_fields(buf, start=0, end=None):
    """Yield (field_number, wire_type, payload_start, payload_end, field_start) of one
    message level; field_start is where the field's key begins."""
    pos = start
    end = len(buf) if end is None else end
    while pos < end:
        field_start = pos
        key, pos = _read_varint(buf, pos)
        number, wire = key >> 3, key & 7
        if number == 0:
            raise ValueError("field number 0 at byte %d" % field_start)
        if wire == _WIRE_VARINT:
            _, after = _read_varint(buf, pos)
        elif wire == _WIRE_64BIT:
            after = pos + 8
        elif wire == _WIRE_32BIT:
            after = pos + 4
        elif wire == _WIRE_LEN:
            length, pos = _read_varint(buf, pos)
            after = pos + length
        else:
            raise ValueError("field %d at byte %d has wire type %d (groups are not used by this "
                             "schema)" % (number, field_start, wire))
        if after > end:
            raise EOFError("field %d at byte %d needs %d bytes but only %d remain"
                           % (number, field_start, after - pos, end - pos))
        yield number, wire, pos, after, field_start
        pos = after


def _wire_problem(buf):
    """Describe where a binary message breaks at its top level, or None if the framing is sound."""
    try:
        for _ in _scan_fields(buf):
            pass
    except EOFError as e:
        return "truncated: %s" % e
    except ValueError as e:
        return "corrupt: %s" % e
    return None


def _message_chunks(message):
    """Serialize ``message`` as a sequence of byte chunks, one top-level field at a time.

    The concatenation equals message.SerializeToString(); peak memory is one layer's (or one
    history blob's) bytes instead of the whole model's.
    """
    if _has_unknown(message):
        # Unknown fields (from a newer schema) keep their bytes only in a whole serialization.
        yield message.SerializeToString()
        return
    cls = type(message)
    for fd, value in message.ListFields():
        if fd.is_repeated and fd.type == fd.TYPE_MESSAGE:
            for item in value:
                body = item.SerializeToString()
                yield _len_header(fd.number, len(body))
                yield body
        else:
            single = cls()
            target = getattr(single, fd.name)
            if fd.is_repeated:
                target.extend(value)
            elif fd.type == fd.TYPE_MESSAGE:
                target.CopyFrom(value)
            else:
                setattr(single, fd.name, value)
            yield single.SerializeToString()


def _has_unknown(message):
    from google.protobuf import unknown_fields
    return len(unknown_fields.UnknownFieldSet(message)) > 0


def _unknown_numbers(message):
    from google.protobuf import unknown_fields
    return sorted({f.field_number for f in unknown_fields.UnknownFieldSet(message)})


# ---------------------------------------------------------------------------
# Atomic writes
# ---------------------------------------------------------------------------

def atomic_write(path, data):
    """Write ``data`` (bytes, or an iterable of byte chunks) to ``path`` atomically.

    The bytes go to a temporary file in the same directory (see ``staging``), are fsynced, and
    the file is renamed over ``path``.  On any failure the temporary file is removed and
    ``path`` is untouched; temporaries that killed writers left beside ``path`` are removed
    first.
    """
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    chunks = (data,) if isinstance(data, (bytes, bytearray, memoryview)) else data
    staging.remove_stale(path)
    tmp = staging.temp_path(path)
    try:
        # mode 0o666 under the umask: the file gets the mode a plain open() would give it
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    except OSError as e:
        staging.release(tmp)
        raise ProtoFileError("cannot write %s: %s" % (path, e.strerror or e)) from None
    try:
        with os.fdopen(fd, "wb") as f:
            for chunk in chunks:
                f.write(chunk)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        staging.release(tmp)
    except BaseException:
        staging.discard(tmp)
        raise
    staging.sync_directory(directory)


def _read_bytes(path, what):
    path = os.fspath(path)
    try:
        with open(path, "rb") as f:
            return f.read()
    except FileNotFoundError:
        raise ProtoFileError("%s: no such file (expected %s)" % (path, what)) from None
    except IsADirectoryError:
        raise ProtoFileError("%s: is a directory (expected %s)" % (path, what)) from None
    except OSError as e:
        raise ProtoFileError("%s: cannot read %s: %s" % (path, what, e.strerror or e)) from None


# ---------------------------------------------------------------------------
# Text prototxt
# ---------------------------------------------------------------------------

_NO_FIELD = re.compile(r'Message type "caffe\.(\w+)" has no field named "(\w+)"')

_NET_FIELDS = set(caffe_pb2.NetParameter.DESCRIPTOR.fields_by_name)
_SOLVER_FIELDS = set(caffe_pb2.SolverParameter.DESCRIPTOR.fields_by_name)
_LAYER_FIELDS = set(caffe_pb2.LayerParameter.DESCRIPTOR.fields_by_name)


def _parse_text(text, message, source, kind, other_kind, other_fields):
    try:
        text_format.Parse(text, message)
    except text_format.ParseError as e:
        line, column = e.GetLine(), e.GetColumn()
        detail = str(e)
        detail = re.sub(r"^\d+:\d+ : ", "", detail)
        m = _NO_FIELD.search(detail)
        top = message.DESCRIPTOR.name
        if m and m.group(1) == top and m.group(2) in other_fields:
            raise ProtoFileError(
                "%s:%s:%s: this looks like a %s, not a %s: field '%s' belongs to %s"
                % (source, line, column, other_kind, kind, m.group(2),
                   "SolverParameter" if other_kind == "solver" else "NetParameter")) from None
        where = "%s:%s:%s" % (source, line, column) if line else source
        raise ProtoFileError("%s: cannot parse %s (%s): %s"
                             % (where, kind, top, detail)) from None
    return message


def _decode_text(data, path, kind):
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ProtoFileError("%s: not a text %s prototxt (byte %d is not UTF-8 text; "
                             "a binary file?)" % (path, kind, e.start)) from None


def parse_net_text(text, source="<string>"):
    """NetParameter from prototxt text, legacy formats upgraded; errors name ``source``."""
    net = _parse_text(text, caffe_pb2.NetParameter(), source, "net", "solver",
                      _SOLVER_FIELDS - _NET_FIELDS)
    _upgrade_net(net, source)
    return net


def parse_solver_text(text, source="<string>"):
    """SolverParameter from prototxt text, legacy solver_type upgraded."""
    solver = _parse_text(text, caffe_pb2.SolverParameter(), source, "solver", "net",
                         (_NET_FIELDS | _LAYER_FIELDS) - _SOLVER_FIELDS)
    try:
        upgrade.upgrade_solver(solver, source)
    except upgrade.UpgradeError as e:
        raise ProtoFileError("%s: %s" % (source, e)) from None
    return solver


def read_net_param(path, upgrade=True):
    """NetParameter from a text prototxt file (legacy formats upgraded; ``upgrade=False``
    keeps them as written, for the upgrade command)."""
    path = os.fspath(path)
    text = _decode_text(_read_bytes(path, "a net prototxt"), path, "net")
    if not upgrade:
        return _parse_text(text, caffe_pb2.NetParameter(), path, "net", "solver",
                           _SOLVER_FIELDS - _NET_FIELDS)
    return parse_net_text(text, path)


def read_solver_param(path, upgrade=True):
    """SolverParameter from a text prototxt file (legacy solver_type upgraded unless
    ``upgrade=False``)."""
    path = os.fspath(path)
    text = _decode_text(_read_bytes(path, "a solver prototxt"), path, "solver")
    if not upgrade:
        return _parse_text(text, caffe_pb2.SolverParameter(), path, "solver", "net",
                           (_NET_FIELDS | _LAYER_FIELDS) - _SOLVER_FIELDS)
    return parse_solver_text(text, path)


def write_text_proto(message, path):
    """Write any message as prototxt text, atomically."""
    atomic_write(path, text_format.MessageToString(message).encode("utf-8"))


def _upgrade_net(net, source):
    try:
        upgrade.upgrade_net(net, source)
    except upgrade.UpgradeError as e:
        raise ProtoFileError("%s: %s" % (source, e)) from None


# ---------------------------------------------------------------------------
# Binary files
# ---------------------------------------------------------------------------

_TEXT_BYTES = frozenset(b"\t\n\r\f\v") | frozenset(range(0x20, 0x7F))


def _looks_like_text(data):
    head = data[:4096]
    if not head:
        return False
    if all(b in _TEXT_BYTES for b in head):
        return True
    try:
        head.decode("utf-8")
    except UnicodeDecodeError as e:
        if e.start < len(head) - 4:  # a cut multi-byte character at the end is still text
            return False
    return all(b >= 0x20 or b in b"\t\n\r\f\v" for b in head)


def _parse_binary(data, message, path, kind):
    name = message.DESCRIPTOR.name
    if not data:
        # parses as an empty message; Caffe never writes one (a model, state or mean is data)
        raise ProtoFileError("%s: empty file (0 bytes), expected a binary %s (%s)"
                             % (path, kind, name))
    if _looks_like_text(data):
        raise ProtoFileError("%s: is a text file, expected a binary %s (%s); "
                             "was a prototxt given by mistake?" % (path, kind, name))
    try:
        message.ParseFromString(data)
    except DecodeError as e:
        problem = _wire_problem(data) or str(e) or "protobuf could not decode it"
        raise ProtoFileError("%s: cannot read binary %s (%s, %d bytes): %s"
                             % (path, kind, name, len(data), problem)) from None
    unknown = _unknown_numbers(message)
    if unknown:
        raise ProtoFileError("%s: not a binary %s: top-level field number(s) %s are not in %s "
                             "(a different kind of file?)"
                             % (path, kind, ", ".join(map(str, unknown)), name))
    bad = _undecodable_string(message)
    if bad:
        raise ProtoFileError("%s: cannot read binary %s (%s): string field %s is not UTF-8 text"
                             % (path, kind, name, bad))
    return message


_STRING_HOLDERS = {}


def _holds_strings(descriptor):
    """Whether a message type has a string field, itself or in a nested message."""
    found = _STRING_HOLDERS.get(descriptor.full_name)
    if found is None:
        _STRING_HOLDERS[descriptor.full_name] = False      # recursive types end here
        found = any(fd.type == fd.TYPE_STRING or (fd.type == fd.TYPE_MESSAGE
                                                  and _holds_strings(fd.message_type))
                    for fd in descriptor.fields)
        _STRING_HOLDERS[descriptor.full_name] = found
    return found


def _undecodable_string(message, where=""):
    """The path of the first string field that is not valid UTF-8, or None.

    Binary parsing does not check proto2 strings: such a value comes back as bytes, and would
    fail far from the file (in upgrade or net building) with a raw UnicodeDecodeError."""
    if not _holds_strings(message.DESCRIPTOR):
        return None
    for fd, value in message.ListFields():
        if fd.type not in (fd.TYPE_STRING, fd.TYPE_MESSAGE):
            continue
        items = list(value) if fd.is_repeated else [value]
        for i, item in enumerate(items):
            name = "%s%s%s" % (where, fd.name, "[%d]" % i if fd.is_repeated else "")
            if fd.type == fd.TYPE_STRING and isinstance(item, bytes):
                return name
            if fd.type == fd.TYPE_MESSAGE:
                bad = _undecodable_string(item, name + ".")
                if bad:
                    return bad
    return None


def read_net_binary(path, upgrade=True):
    """NetParameter from a binary .caffemodel (legacy V0/V1 models upgraded unless
    ``upgrade=False``)."""
    path = os.fspath(path)
    data = _read_bytes(path, "a binary .caffemodel")
    net = _parse_binary(data, caffe_pb2.NetParameter(), path, ".caffemodel")
    del data
    if upgrade:
        _upgrade_net(net, path)
    return net


def write_net_binary(net_param, path):
    """Write a NetParameter as a binary .caffemodel, atomically, one layer at a time."""
    atomic_write(path, _message_chunks(net_param))


# Fast path for weights: float payloads move between numpy and the file as raw bytes, never
# through the protobuf runtime's repeated-field containers (which cost ~10x a memcpy).

_LAYER_BLOBS_FIELD = {  # NetParameter field -> number of `blobs` in that layer message
    caffe_pb2.NetParameter.DESCRIPTOR.fields_by_name["layer"].number:
        caffe_pb2.LayerParameter.DESCRIPTOR.fields_by_name["blobs"].number,
    caffe_pb2.NetParameter.DESCRIPTOR.fields_by_name["layers"].number:
        caffe_pb2.V1LayerParameter.DESCRIPTOR.fields_by_name["blobs"].number,
}
_PAYLOAD_FIELDS = {5: "<f4", 8: "<f8"}  # BlobProto data, double_data (diffs stay in the proto)


def _strip_blob(buf, start, end):
    """(BlobProto bytes without its data payload, the payload array or None)."""
    kept, parts, payload_number = [], [], None
    for number, wire, s, e, key in _scan_fields(buf, start, end):
        if number in _PAYLOAD_FIELDS and wire == _WIRE_LEN and payload_number in (None, number):
            dtype = np.dtype(_PAYLOAD_FIELDS[number])
            if (e - s) % dtype.itemsize:
                raise ValueError("a blob's packed %s payload is %d bytes, not a whole number "
                                 "of %d-byte values" % (dtype.name, e - s, dtype.itemsize))
            # a repeated field may come in several pieces; protobuf appends them
            parts.append(np.frombuffer(buf, dtype=dtype, count=(e - s) // dtype.itemsize,
                                       offset=s))
            payload_number = number
        else:
            kept.append(buf[key:e])
    values = np.concatenate(parts) if parts else None
    return b"".join(kept), values


def _strip_layer(buf, start, end, blobs_field):
    kept, arrays = [], []
    for number, wire, s, e, key in _scan_fields(buf, start, end):
        if number == blobs_field and wire == _WIRE_LEN:
            blob, values = _strip_blob(buf, s, e)
            kept += [_len_header(blobs_field, len(blob)), blob]
            arrays.append(values)
        else:
            kept.append(buf[key:e])
    return b"".join(kept), arrays


def read_net_weights(path):
    """(NetParameter, {layer name: [float arrays]}) from a .caffemodel, fast.

    The NetParameter is upgraded like read_net_binary's, but its blobs keep only their shapes
    (and diffs); the values come back as arrays of those shapes, float32 (float64 for
    double_data).  This is the path for loading weights into a net.
    """
    path = os.fspath(path)
    data = _read_bytes(path, "a binary .caffemodel")
    if _looks_like_text(data):
        _parse_binary(data, caffe_pb2.NetParameter(), path, ".caffemodel")  # raises
    problem = _wire_problem(data)
    if problem:
        raise ProtoFileError("%s: cannot read binary .caffemodel (NetParameter, %d bytes): %s"
                             % (path, len(data), problem))
    stripped, payloads = [], {number: [] for number in _LAYER_BLOBS_FIELD}
    try:
        for number, wire, s, e, key in _scan_fields(data):
            if number in _LAYER_BLOBS_FIELD and wire == _WIRE_LEN:
                layer, arrays = _strip_layer(data, s, e, _LAYER_BLOBS_FIELD[number])
                stripped += [_len_header(number, len(layer)), layer]
                payloads[number].append(arrays)
            else:
                stripped.append(data[key:e])
    except (EOFError, ValueError) as e:
        raise ProtoFileError("%s: cannot read binary .caffemodel: corrupt layer: %s"
                             % (path, e)) from None
    del data
    net = _parse_binary(b"".join(stripped), caffe_pb2.NetParameter(), path, ".caffemodel")
    weights = OrderedDict()
    for number, layer_list in ((2, net.layers), (100, net.layer)):
        for layer, arrays in zip(layer_list, payloads[number]):
            values = []
            for blob, arr in zip(layer.blobs, arrays):
                where = "%s: layer %s" % (path, layer.name)
                shape, count = _checked_shape(blob, where)
                if arr is None:  # unpacked legacy encoding: it stayed in the proto
                    arr = blobproto_to_array(blob, source=where)
                    blob.ClearField("data")
                    blob.ClearField("double_data")
                if arr.size != count:
                    raise ProtoFileError("%s: a blob holds %d values but its shape %s needs %d"
                                         % (where, arr.size, list(shape), count))
                values.append(arr.reshape(shape))
            weights[layer.name] = values
    _upgrade_net(net, path)
    return net, weights


def _weights_layer_chunks(layer, arrays):
    """Chunks of one serialized LayerParameter whose blobs are ``arrays``, canonical order."""
    blobs_number = caffe_pb2.LayerParameter.DESCRIPTOR.fields_by_name["blobs"].number
    low, high = caffe_pb2.LayerParameter(), caffe_pb2.LayerParameter()
    for fd, value in layer.ListFields():
        if fd.number == blobs_number:
            continue
        target = low if fd.number < blobs_number else high
        if fd.is_repeated:
            getattr(target, fd.name).extend(value)
        elif fd.type == fd.TYPE_MESSAGE:
            getattr(target, fd.name).CopyFrom(value)
        else:
            setattr(target, fd.name, value)
    body = [low.SerializeToString()]
    for arr in arrays:
        arr = np.asarray(arr)
        shape = caffe_pb2.BlobProto()
        shape.shape.SetInParent()
        shape.shape.dim.extend(int(d) for d in arr.shape)
        head = shape.SerializeToString()
        values = np.ascontiguousarray(arr, dtype="<f4").reshape(-1)
        # Canonical BlobProto order: data (5) before shape (7).
        payload = [_len_header(_BLOB_FIELD["data"], values.nbytes),
                   memoryview(values).cast("B")] if values.size else []
        size = sum(len(c) for c in payload) + len(head)
        body += [_len_header(blobs_number, size)] + payload + [head]
    body.append(high.SerializeToString())
    return body


def write_net_weights(net_param, weights, path):
    """Write a .caffemodel from a NetParameter and {layer name: [arrays]}, fast and atomic.

    Layers named in ``weights`` get those arrays as their blobs (shape + float32 data); other
    layers are written as they are.  The bytes equal those of write_net_binary on the
    equivalent NetParameter.
    """
    layer_number = caffe_pb2.NetParameter.DESCRIPTOR.fields_by_name["layer"].number
    if len(net_param.layers):
        raise ValueError("write_net_weights needs a current-format net (layer, not V1 layers)")

    def chunks():
        for fd, value in net_param.ListFields():
            if fd.name == "layer":
                continue
            part = caffe_pb2.NetParameter()
            if fd.is_repeated:
                getattr(part, fd.name).extend(value)
            elif fd.type == fd.TYPE_MESSAGE:
                getattr(part, fd.name).CopyFrom(value)
            else:
                setattr(part, fd.name, value)
            yield part.SerializeToString()
        for layer in net_param.layer:
            if layer.name in weights:
                body = _weights_layer_chunks(layer, weights[layer.name])
            else:
                body = [layer.SerializeToString()]
            yield _len_header(layer_number, sum(len(c) for c in body))
            yield from body

    atomic_write(path, chunks())


def read_blobproto(path):
    """BlobProto from a binary file (a mean .binaryproto)."""
    path = os.fspath(path)
    return _parse_binary(_read_bytes(path, "a binary BlobProto"), caffe_pb2.BlobProto(),
                         path, "BlobProto (.binaryproto)")


def write_blobproto(blob_proto, path):
    atomic_write(path, blob_proto.SerializeToString())


def read_solverstate(path):
    """SolverState from a binary .solverstate."""
    path = os.fspath(path)
    return _parse_binary(_read_bytes(path, "a binary .solverstate"), caffe_pb2.SolverState(),
                         path, ".solverstate")


def write_solverstate(state, path):
    atomic_write(path, _message_chunks(state))


def parse_datum(data, source="<datum>"):
    """Datum from the bytes of one database record."""
    datum = caffe_pb2.Datum()
    try:
        datum.ParseFromString(bytes(data))
    except DecodeError:
        raise ProtoFileError("%s: cannot decode Datum record (%d bytes): %s"
                             % (source, len(data), _wire_problem(bytes(data)) or "corrupt"))
    return datum


# ---------------------------------------------------------------------------
# Arrays <-> BlobProto (pycaffe's helpers)
# ---------------------------------------------------------------------------

_BLOB_FIELD = {f.name: f.number for f in caffe_pb2.BlobProto.DESCRIPTOR.fields}


def _packed_payload(message, field_number):
    """(buffer, start, end) of a packed repeated field's payload in message's own bytes."""
    buf = message.SerializeToString()
    for number, wire, start, end, _ in _scan_fields(buf):
        if number == field_number and wire == _WIRE_LEN:
            return buf, start, end
    return buf, 0, 0


def _payload_array(message, field_name, dtype):
    buf, start, end = _packed_payload(message, _BLOB_FIELD[field_name])
    # The copy makes the result writable and lets the serialized buffer go.
    return np.frombuffer(buf, dtype=dtype, count=(end - start) // np.dtype(dtype).itemsize,
                         offset=start).copy()


def _blob_shape(blob):
    if (blob.HasField("num") or blob.HasField("channels") or blob.HasField("height")
            or blob.HasField("width")):
        return (blob.num, blob.channels, blob.height, blob.width)
    return tuple(blob.shape.dim)


def _checked_shape(blob, source):
    """(shape, element count) of a BlobProto; a negative dimension is an error naming source.
    The count is a Python integer: a file's dimensions never overflow it into a small number."""
    shape = _blob_shape(blob)
    count = 1
    for d in shape:
        if d < 0:
            raise ProtoFileError("%s: BlobProto shape %s has a negative dimension"
                                 % (source, list(shape)))
        count *= int(d)
    if _too_large(shape):
        raise ProtoFileError("%s: BlobProto shape %s is too large for any array"
                             % (source, list(shape)))
    return shape, count


def _too_large(shape):
    """Whether no array, not even an empty one, can have these axes (numpy: "array is too
    big"): the product of the non-zero axes times 8 bytes overflows the address space."""
    span = 1
    for d in shape:
        span *= max(int(d), 1)
    return span * 8 > np.iinfo(np.intp).max


def blobproto_to_array(blob, return_diff=False, source="BlobProto"):
    """The blob's data (or diff) as an array of the blob's shape.

    The legacy num/channels/height/width shape wins when any of them is set, as in Caffe.
    Single-precision fields come back float32 (exactly the stored values), double_data /
    double_diff float64.  A blob whose values do not fill its shape raises ProtoFileError
    naming ``source`` (the file it came from).
    """
    if return_diff:
        names = ("diff", "double_diff")
    else:
        names = ("data", "double_data")
    single, double = names
    if len(getattr(blob, single)):
        values = _payload_array(blob, single, "<f4")
    elif len(getattr(blob, double)):
        values = _payload_array(blob, double, "<f8")
    else:
        values = np.zeros(0, dtype=np.float32)
    shape, count = _checked_shape(blob, source)
    if values.size != count:
        raise ProtoFileError("%s: BlobProto holds %d %s values but its shape %s needs %d"
                             % (source, values.size, "diff" if return_diff else "data",
                                list(shape), count))
    return values.reshape(shape)


def _packed_floats(field_number, arr, dtype="<f4"):
    """Wire bytes of a packed repeated float field holding arr, built with one copy."""
    values = np.ascontiguousarray(arr, dtype=dtype).reshape(-1)
    if not values.size:
        return b""
    header = _len_header(field_number, values.nbytes)
    buf = bytearray(len(header) + values.nbytes)
    buf[:len(header)] = header
    np.frombuffer(buf, dtype=np.uint8, offset=len(header))[:] = values.view(np.uint8)
    return buf


def fill_blobproto(blob, arr, diff=None):
    """Fill an existing BlobProto (e.g. ``layer.blobs.add()``) from arrays, in place.

    Sets ``shape`` to arr.shape and float32 ``data`` (and ``diff``), replacing what was there.
    Filling in place spares the copy that ``blobs.add().CopyFrom(array_to_blobproto(a))`` makes.
    """
    arr = np.asarray(arr)
    blob.Clear()
    blob.shape.SetInParent()
    blob.shape.dim.extend(int(d) for d in arr.shape)
    # Packed wire bytes are merged in one call: no per-element Python work.
    blob.MergeFromString(_packed_floats(_BLOB_FIELD["data"], arr))
    if diff is not None:
        diff = np.asarray(diff)
        if diff.size != arr.size:
            raise ValueError("diff has %d values but data has %d" % (diff.size, arr.size))
        blob.MergeFromString(_packed_floats(_BLOB_FIELD["diff"], diff))
    return blob


def array_to_blobproto(arr, diff=None):
    """BlobProto with ``shape`` set to arr.shape and float32 ``data`` (and ``diff``)."""
    return fill_blobproto(caffe_pb2.BlobProto(), arr, diff)


def arraylist_to_blobprotovector_str(arraylist):
    """Serialized BlobProtoVector of the given arrays."""
    vec = caffe_pb2.BlobProtoVector()
    for arr in arraylist:
        vec.blobs.add().CopyFrom(array_to_blobproto(arr))
    return vec.SerializeToString()


def blobprotovector_str_to_arraylist(data):
    """List of arrays from a serialized BlobProtoVector."""
    vec = caffe_pb2.BlobProtoVector()
    try:
        vec.ParseFromString(bytes(data))
    except DecodeError:
        raise ProtoFileError("<BlobProtoVector>: cannot decode %d bytes: %s"
                             % (len(data), _wire_problem(bytes(data)) or "corrupt"))
    return [blobproto_to_array(b) for b in vec.blobs]


# ---------------------------------------------------------------------------
# Arrays <-> Datum
# ---------------------------------------------------------------------------

_DATUM_FLOAT_DATA = caffe_pb2.Datum.DESCRIPTOR.fields_by_name["float_data"].number


def array_to_datum(arr, label=None):
    """Datum from a C x H x W array: uint8 arrays fill ``data`` bytes, others ``float_data``."""
    arr = np.asarray(arr)
    if arr.ndim != 3:
        raise ValueError("array_to_datum needs a 3-axis C x H x W array, got shape %s"
                         % (arr.shape,))
    datum = caffe_pb2.Datum()
    datum.channels, datum.height, datum.width = (int(d) for d in arr.shape)
    if arr.dtype == np.uint8:
        datum.data = np.ascontiguousarray(arr).tobytes()
    else:
        datum.MergeFromString(_packed_floats(_DATUM_FLOAT_DATA, arr))
    if label is not None:
        datum.label = int(label)
    return datum


def _decode_image(encoded, source):
    """C x H x W uint8 from PNG/JPEG bytes, channels in BGR order as Caffe decodes them."""
    import io as _bytes_io
    from PIL import Image
    try:
        img = Image.open(_bytes_io.BytesIO(encoded))
        img.load()
    except Exception as e:    # Pillow raises many kinds for corrupt data
        raise ProtoFileError("%s: encoded Datum holds no decodable image: %s"
                             % (source, str(e).replace("\n", " "))) from None
    if img.mode not in ("L", "RGB"):
        img = img.convert("L" if img.mode in ("1", "I", "I;16", "F") else "RGB")
    pixels = np.asarray(img, dtype=np.uint8)
    if pixels.ndim == 2:
        return pixels[np.newaxis].copy()
    return np.ascontiguousarray(pixels[:, :, ::-1].transpose(2, 0, 1))


def datum_to_array(datum, source="Datum"):
    """C x H x W array of a Datum: uint8 from ``data`` (decoded when ``encoded``), else float32.

    A Datum whose values do not fill channels x height x width raises ProtoFileError naming
    ``source`` (the record it came from)."""
    if datum.encoded:
        return _decode_image(datum.data, source)
    shape = (datum.channels, datum.height, datum.width)
    stored = len(datum.data) or len(datum.float_data)
    if min(shape) < 0 or stored != shape[0] * shape[1] * shape[2] or _too_large(shape):
        raise ProtoFileError("%s: Datum channels x height x width = %d x %d x %d but it holds "
                             "%d values" % ((source,) + shape + (stored,)))
    if len(datum.data):
        return np.frombuffer(datum.data, dtype=np.uint8).reshape(shape).copy()
    return np.array(datum.float_data, dtype=np.float32).reshape(shape)
