"""Which known Caffe file a file is, for the error that says a file of one kind was given
where another was expected (a solver state as weights): what it is, and what takes it.

Binary files are told apart by their top-level fields (numbers and wire types) alone, which the
wire scanner reads without copying the file: a solver state starts with ``iter`` as a varint
where a NetParameter has its ``name`` string; a mean image is a BlobProto's data and shape.
"""
from google.protobuf import text_format
from google.protobuf.descriptor import FieldDescriptor

from ..proto import caffe_pb2, is_repeated
from .wire import _WIRE_32BIT, _WIRE_64BIT, _WIRE_LEN, _WIRE_VARINT, _scan_fields

HDF5_SIGNATURE = b"\x89HDF\r\n\x1a\n"
_TEXT_LIMIT = 64 << 20           # larger "text" is not a prototxt worth parsing to name it

_FIXED64 = {FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FIXED64,
            FieldDescriptor.TYPE_SFIXED64}
_FIXED32 = {FieldDescriptor.TYPE_FLOAT, FieldDescriptor.TYPE_FIXED32,
            FieldDescriptor.TYPE_SFIXED32}
_LENGTH = {FieldDescriptor.TYPE_STRING, FieldDescriptor.TYPE_BYTES,
           FieldDescriptor.TYPE_MESSAGE}


def _wire_types(field):
    """The wire types a field may arrive in (a repeated number may come packed or not)."""
    if field.type in _LENGTH:
        return {_WIRE_LEN}
    plain = (_WIRE_64BIT if field.type in _FIXED64 else
             _WIRE_32BIT if field.type in _FIXED32 else _WIRE_VARINT)
    return {plain, _WIRE_LEN} if is_repeated(field) else {plain}


def _fits(fields, message_class):
    by_number = message_class.DESCRIPTOR.fields_by_number
    return all(number in by_number and wire in _wire_types(by_number[number])
               for number, wire in fields)


# (message, fields one of which it must have, what it is, what takes it)
_BINARY_KINDS = (
    (caffe_pb2.SolverState, {1, 3}, "a solver state (.solverstate)",
     "resume training from it with -snapshot"),
    (caffe_pb2.BlobProto, {5, 7, 8}, "a blob (.binaryproto, e.g. a mean image)",
     "a data layer's transform_param mean_file takes a mean image"),
)
_TEXT_KINDS = (
    (caffe_pb2.NetParameter, "a net definition (text prototxt)", "-model takes it"),
    (caffe_pb2.SolverParameter, "a solver definition (text prototxt)", "-solver takes it"),
)


def describe_caffe_file(data, expected=caffe_pb2.NetParameter):
    """(what the file is, what takes it) for a solver state, a blob such as a mean image, a
    net or solver prototxt or an HDF5 file given where a binary ``expected`` message was
    asked for; else None."""
    if bytes(data[:len(HDF5_SIGNATURE)]) == HDF5_SIGNATURE:
        return ("an HDF5 file", "HDF5 weights are read from a file whose name ends in .h5, "
                "an HDF5 solver state by -snapshot")
    if not data:
        return None
    text = _as_text(data)
    if text is not None:
        for message_class, what, taker in _TEXT_KINDS:
            message = message_class()
            try:
                text_format.Parse(text, message)
            except (text_format.ParseError, ValueError, RecursionError):
                continue
            if message.ListFields():
                return what, taker
        return None
    try:
        fields = {(number, wire) for number, wire, _, _, _ in _scan_fields(data)}
    except (EOFError, ValueError):
        return None
    if _fits(fields, expected):
        return None
    for message_class, telling, what, taker in _BINARY_KINDS:
        if message_class is not expected and _fits(fields, message_class) and \
                telling & {number for number, _ in fields}:
            return what, taker
    return None


def _as_text(data):
    if len(data) > _TEXT_LIMIT:
        return None
    try:
        text = bytes(data).decode("utf-8")
    except UnicodeDecodeError:
        return None
    if all(c.isprintable() or c in "\t\n\r\f\v" for c in text[:4096]):
        return text
    return None
