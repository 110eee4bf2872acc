"""The schema: Caffe-compatible messages generated from caffe.proto.

    from poseidon_caffe.proto import caffe_pb2

caffe_pb2.py is generated and committed; regenerate it with
`python scripts/gen_proto.py` after editing caffe.proto.  It needs a protobuf
runtime at least as new as the protoc that generated it (see the version check
at the top of the module).
"""

from . import caffe_pb2

__all__ = ["caffe_pb2"]
