"""The schema: Caffe-compatible messages generated from caffe.proto.

    from poseidon_caffe.proto import caffe_pb2

caffe_pb2.py is generated and committed; regenerate it with
`python scripts/gen_proto.py` after editing caffe.proto.  It builds its classes
from the embedded descriptor through protobuf's builder, so any runtime from 4.25
to the newest runs it (setup.cfg declares the range; the generator leaves out
protoc's runtime-version gate).
"""
from google.protobuf.descriptor import FieldDescriptor

from . import caffe_pb2

__all__ = ["caffe_pb2", "is_repeated"]


def is_repeated(field):
    """Whether a FieldDescriptor is repeated: protobuf 6 and newer say so themselves, older
    runtimes only through the label."""
    flag = getattr(field, "is_repeated", None)
    return flag if flag is not None else field.label == FieldDescriptor.LABEL_REPEATED
