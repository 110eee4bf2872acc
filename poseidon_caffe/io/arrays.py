"""Arrays <-> BlobProto and Datum: pycaffe's caffe.io conversion helpers.

Large float payloads never go through the repeated field element by element: arrays enter a
message as ready-made packed wire bytes, and leave it by re-serializing the message and viewing
the packed payload with numpy.
"""
import numpy as np
from google.protobuf.message import DecodeError

from ..proto import caffe_pb2
from .encoded import _decode_image
from .errors import ProtoFileError
from .wire import _WIRE_LEN, _len_header, _scan_fields, _wire_problem


# ---------------------------------------------------------------------------
# Arrays <-> BlobProto
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


def _merge(message, data):
    """message.MergeFromString(data) for a bytearray: protobuf 5 and newer take it as it is,
    4.x's upb only bytes (one copy there)."""
    try:
        message.MergeFromString(data)
    except TypeError:
        message.MergeFromString(bytes(data))


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
    _merge(blob, _packed_floats(_BLOB_FIELD["data"], arr))
    if diff is not None:
        diff = np.asarray(diff)
        if diff.size != arr.size:
            raise ValueError("diff has %d values but data has %d" % (diff.size, arr.size))
        _merge(blob, _packed_floats(_BLOB_FIELD["diff"], diff))
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
        _merge(datum, _packed_floats(_DATUM_FLOAT_DATA, arr))
    if label is not None:
        datum.label = int(label)
    return datum


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
