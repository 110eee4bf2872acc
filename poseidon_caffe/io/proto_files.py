"""Prototxt and binary proto files: nets, solvers, .caffemodel, .binaryproto, .solverstate, Datum.

Readers upgrade legacy nets and solvers (see upgrade.py) and turn every failure into a one-line
ProtoFileError naming the file: text that does not parse (with line and column, and a hint when
a solver was given for a net or the other way round), a text file given for a binary one, broken
wire framing, fields of another message type, strings that are not UTF-8.
"""
import os
import re

from google.protobuf import text_format
from google.protobuf.message import DecodeError

from .. import upgrade
from ..proto import caffe_pb2, is_repeated
from .errors import ProtoFileError
from .files import _read_bytes, atomic_write
from .wire import _message_chunks, _unknown_numbers, _wire_problem


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
        items = list(value) if is_repeated(fd) else [value]
        for i, item in enumerate(items):
            name = "%s%s%s" % (where, fd.name, "[%d]" % i if is_repeated(fd) else "")
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
