"""Files <-> protos <-> arrays: prototxt, .caffemodel, .binaryproto, .solverstate and Datum.

This is the face users import (pycaffe's ``caffe.io``); the work is done by one module per idea:

  errors.py       ProtoFileError, the one-line error naming the file
  wire.py         the protobuf wire format, scanned and framed directly
  files.py        whole-file reads and maps; atomic writes (through poseidon_caffe.staging)
  proto_files.py  text and binary proto files read (checked, legacy formats upgraded) and written
  weights.py      the fast .caffemodel path: float payloads as raw bytes, no protobuf runtime
  file_kinds.py   which other Caffe file a wrong file is (a solver state given as weights)
  arrays.py       arrays <-> BlobProto / Datum (pycaffe's helpers)
  encoded.py      PNG/JPEG Datum images decoded as Caffe decodes them

and pycaffe's image helpers come from poseidon_caffe.imageio.
"""
from ..imageio import Transformer, load_image, oversample, resize_image
from .arrays import (array_to_blobproto, array_to_datum, arraylist_to_blobprotovector_str,
                     blobproto_to_array, blobprotovector_str_to_arraylist, datum_to_array,
                     fill_blobproto)
from .errors import ProtoFileError
from .files import atomic_write
from .proto_files import (parse_datum, parse_net_text, parse_solver_text, read_blobproto,
                          read_net_binary, read_net_param, read_solver_param, read_solverstate,
                          write_blobproto, write_net_binary, write_solverstate, write_text_proto)
from .weights import read_net_weights, write_net_weights

# Internals other modules and the tests reach through this face (the wire scanner, the
# parsing steps upgrade.py runs without upgrading).
from .files import _read_bytes  # noqa: F401
from .proto_files import (_LAYER_FIELDS, _NET_FIELDS, _SOLVER_FIELDS,  # noqa: F401
                          _decode_text, _message_chunks, _parse_binary, _parse_text)
from .weights import _weights_layer_chunks  # noqa: F401
from .wire import _WIRE_LEN, _len_header, _read_varint, _scan_fields, _varint  # noqa: F401

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
