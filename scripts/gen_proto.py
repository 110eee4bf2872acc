#!/usr/bin/env python
"""Regenerate poseidon_caffe/proto/caffe_pb2.py from caffe.proto.

    python scripts/gen_proto.py            # rewrite the committed module
    python scripts/gen_proto.py --check    # exit 1 if the committed module is stale

Needs grpcio-tools (the `dev` extra), which bundles protoc.  Paths are resolved
relative to this file, so it runs from any working directory.

The check compares schemas, not text: the FileDescriptorProto embedded in the
committed module against a fresh compile of caffe.proto.  A newer protoc that
only changes the module's boilerplate therefore does not count as stale.

The module is written without protoc's runtime-version gate: the code builds
every class from the embedded descriptor through protobuf's builder, which every
runtime from 4.25 on has, so the gate would only refuse the older runtimes that
PyTorch, TensorFlow or ONNX keep (tests/test_protobuf_range.py runs the proto and
io tests under protobuf 4.25 to show it).
"""

import argparse
import ast
import os
import re
import sys
import tempfile

PROTO_DIR = os.path.normpath(os.path.join(
    os.path.dirname(os.path.abspath(__file__)), os.pardir, "poseidon_caffe", "proto"))
PROTO_PATH = os.path.join(PROTO_DIR, "caffe.proto")
MODULE_PATH = os.path.join(PROTO_DIR, "caffe_pb2.py")


def _run_protoc(proto_path, extra_args):
    try:
        from grpc_tools import protoc
    except ImportError:
        sys.exit("gen_proto: grpcio-tools is required (pip install -e '.[dev]')")
    proto_dir, proto_name = os.path.split(os.path.abspath(proto_path))
    status = protoc.main(["grpc_tools.protoc", "-I" + proto_dir] + extra_args + [proto_name])
    if status != 0:
        sys.exit("gen_proto: protoc failed on %s (exit status %d)" % (proto_path, status))
    return proto_name


def generate_module(proto_path, out_dir):
    """Compile `proto_path` into `out_dir`; return the path of the new module."""
    proto_name = _run_protoc(proto_path, ["--python_out=" + out_dir])
    return os.path.join(out_dir, os.path.splitext(proto_name)[0] + "_pb2.py")


# protoc's "this code needs runtime >= its own version" call, and its import
RUNTIME_GATE = re.compile(r"^from google\.protobuf import runtime_version as _runtime_version\n"
                          r"|^_runtime_version\.ValidateProtobufRuntimeVersion\(\n(?:.*\n)*?\)\n",
                          re.M)


def without_runtime_gate(text):
    """The generated module's text with protoc's runtime-version gate taken out."""
    return RUNTIME_GATE.sub("", text)


def compiled_descriptor(proto_path):
    """FileDescriptorProto of a fresh compile of `proto_path`."""
    from google.protobuf import descriptor_pb2
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "schema.desc")
        _run_protoc(proto_path, ["--descriptor_set_out=" + out])
        with open(out, "rb") as f:
            descriptor_set = descriptor_pb2.FileDescriptorSet.FromString(f.read())
    fresh = descriptor_set.file[0]
    _drop_json_names(fresh.message_type)  # the Python generator leaves them out
    return fresh


def _drop_json_names(messages):
    for message in messages:
        for field in message.field:
            field.ClearField("json_name")
        _drop_json_names(message.nested_type)


def module_descriptor(module_path):
    """FileDescriptorProto embedded in a generated module, read without importing it."""
    from google.protobuf import descriptor_pb2
    with open(module_path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), module_path)
    for node in ast.walk(tree):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr == "AddSerializedFile" and node.args
                and isinstance(node.args[0], ast.Constant)):
            return descriptor_pb2.FileDescriptorProto.FromString(node.args[0].value)
    raise ValueError("%s: no AddSerializedFile(...) call; not a generated protobuf module"
                     % module_path)


def is_up_to_date(proto_path=PROTO_PATH, module_path=MODULE_PATH):
    if not os.path.exists(module_path):
        return False
    return module_descriptor(module_path) == compiled_descriptor(proto_path)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true",
                        help="compare instead of writing; exit 1 when out of date")
    parser.add_argument("--proto", default=PROTO_PATH, help="schema to compile")
    parser.add_argument("--module", default=MODULE_PATH, help="generated module path")
    args = parser.parse_args(argv)

    if args.check:
        if not is_up_to_date(args.proto, args.module):
            print("%s is out of date with %s; run scripts/gen_proto.py"
                  % (args.module, args.proto), file=sys.stderr)
            return 1
        print("%s is up to date" % args.module)
        return 0

    with tempfile.TemporaryDirectory() as tmp:
        with open(generate_module(args.proto, tmp), encoding="utf-8") as f:
            text = without_runtime_gate(f.read())
    tmp_module = args.module + ".tmp"
    with open(tmp_module, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp_module, args.module)
    print("wrote %s" % args.module)
    return 0


if __name__ == "__main__":
    sys.exit(main())
