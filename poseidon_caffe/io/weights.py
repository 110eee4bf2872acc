"""The fast path for weights: .caffemodel payloads moved between numpy and the file as bytes.

Float payloads never go through the protobuf runtime's repeated-field containers (which cost
~10x a memcpy): read_net_weights cuts them out of the file's bytes with the wire scanner and
parses only what is left; write_net_weights frames the arrays' own memory as packed fields.
AlexNet-size save + load takes about a second (scripts/bench_io.py). The file is mapped, not
read whole: a file that is not a caffemodel stops at its first senseless field, and a net that
loads weights (``copy=False``) copies only its own layers' values out of the mapping.
"""
import os
from collections import OrderedDict

import numpy as np

from ..proto import caffe_pb2, is_repeated
from .arrays import _BLOB_FIELD, _checked_shape, blobproto_to_array
from .errors import ProtoFileError
from .file_kinds import describe_caffe_file
from .files import _map_bytes, atomic_write
from .proto_files import _looks_like_text, _parse_binary, _upgrade_net
from .wire import _WIRE_LEN, _len_header, _scan_fields, _wire_problem

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
    # one piece stays a view of the file: its size is checked before anything is copied
    values = (parts[0] if len(parts) == 1 else np.concatenate(parts)) if parts else None
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


def read_net_weights(path, copy=True):
    """(NetParameter, {layer name: [float arrays]}) from a .caffemodel, fast.

    The NetParameter is upgraded like read_net_binary's, but its blobs keep only their shapes
    (and diffs); the values come back as arrays of those shapes, float32 (float64 for
    double_data).  This is the path for loading weights into a net.  With ``copy=False`` the
    arrays are read-only views of the mapped file, for a caller that copies what it uses.
    A file of another known kind (a solver state, a mean image, a prototxt, HDF5) is named as
    such, with what takes it.
    """
    path = os.fspath(path)
    data = _map_bytes(path, "a binary .caffemodel")
    try:
        return _read_net_weights(data, path, copy)
    except ProtoFileError:
        kind = describe_caffe_file(data)
        if kind is None:
            raise
        raise ProtoFileError("%s: is %s, not a .caffemodel of weights; %s"
                             % (path, kind[0], kind[1])) from None


def _read_net_weights(data, path, copy):
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
                if copy and not arr.flags.writeable:
                    arr = arr.copy()
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
        if is_repeated(fd):
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
            if is_repeated(fd):
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
