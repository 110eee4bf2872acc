"""Files <-> protos <-> arrays (see proto_files.py)."""
from .proto_files import *  # noqa: F401,F403
from .proto_files import (  # noqa: F401
    __all__, _WIRE_LEN, _varint, _read_varint, _len_header, _scan_fields, _message_chunks,
    _weights_layer_chunks, _read_bytes, _decode_text, _parse_text, _parse_binary,
    _NET_FIELDS, _SOLVER_FIELDS, _LAYER_FIELDS)
