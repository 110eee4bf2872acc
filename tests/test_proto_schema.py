"""The schema module: up to date, wire-compatible, every field reachable from text.

Expected numbers and defaults below are written down from Caffe's documented
schema, not read from the module under test.
"""

import importlib.util
import os
import struct
import subprocess
import sys

import pytest
from google.protobuf import descriptor as _descriptor
from google.protobuf import text_format

from poseidon_caffe.proto import caffe_pb2, is_repeated

REPO = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir))
GEN_SCRIPT = os.path.join(REPO, "scripts", "gen_proto.py")
PROTO_PATH = os.path.join(REPO, "poseidon_caffe", "proto", "caffe.proto")
MODULE_PATH = os.path.join(REPO, "poseidon_caffe", "proto", "caffe_pb2.py")

FD = _descriptor.FieldDescriptor


# ---------------------------------------------------------------------------
# The committed module matches caffe.proto
# ---------------------------------------------------------------------------

def _load_gen_script():
    spec = importlib.util.spec_from_file_location("gen_proto_script", GEN_SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_committed_module_matches_a_fresh_compile(tmp_path):
    pytest.importorskip("grpc_tools")
    gen = _load_gen_script()
    fresh_module = gen.generate_module(PROTO_PATH, str(tmp_path))
    fresh = gen.module_descriptor(fresh_module)
    committed = gen.module_descriptor(MODULE_PATH)
    assert fresh.name == "caffe.proto" and fresh.package == "caffe"
    assert committed == fresh, "caffe_pb2.py is stale: run scripts/gen_proto.py"
    # The imported module is the committed one.
    assert [m.name for m in committed.message_type] == list(
        caffe_pb2.DESCRIPTOR.message_types_by_name)


def test_gen_script_check_mode_passes_and_detects_a_stale_module(tmp_path):
    pytest.importorskip("grpc_tools")
    ok = subprocess.run([sys.executable, GEN_SCRIPT, "--check"], cwd=str(tmp_path),
                        capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr

    edited = tmp_path / "caffe.proto"
    with open(PROTO_PATH, encoding="utf-8") as f:
        text = f.read()
    marker = "message ELUParameter {\n"
    assert marker in text
    edited.write_text(text.replace(marker, marker + "  optional float extra = 9;\n"),
                      encoding="utf-8")
    stale = subprocess.run([sys.executable, GEN_SCRIPT, "--check", "--proto", str(edited)],
                           cwd=str(tmp_path), capture_output=True, text=True)
    assert stale.returncode == 1
    assert "out of date" in stale.stderr


# ---------------------------------------------------------------------------
# Wire compatibility against bytes assembled by hand
# ---------------------------------------------------------------------------

VARINT, FIXED64, LENGTH_DELIMITED, FIXED32 = 0, 1, 2, 5


def _varint(n):
    if n < 0:
        n += 1 << 64  # negative int32/int64 go on the wire as 10-byte two's complement
    out = bytearray()
    while True:
        low = n & 0x7F
        n >>= 7
        if n:
            out.append(low | 0x80)
        else:
            out.append(low)
            return bytes(out)


def _key(field_number, wire_type):
    return _varint(field_number << 3 | wire_type)


def _varint_field(field_number, value):
    return _key(field_number, VARINT) + _varint(value)


def _bytes_field(field_number, payload):
    return _key(field_number, LENGTH_DELIMITED) + _varint(len(payload)) + payload


def _blobproto_bytes():
    shape = _bytes_field(1, b"".join(_varint(d) for d in (2, 3, 300)))  # packed int64 dim
    return b"".join([
        _varint_field(1, 2),                                    # num
        _varint_field(2, 3),                                    # channels
        _varint_field(3, 1),                                    # height
        _varint_field(4, 300),                                  # width
        _bytes_field(5, struct.pack("<3f", 1.5, -2.0, 0.25)),   # data, packed float
        _bytes_field(7, shape),                                 # shape
        _bytes_field(8, struct.pack("<2d", 0.1, -1e300)),       # double_data, packed double
    ])


def test_hand_built_blobproto_parses_and_reserializes_identically():
    raw = _blobproto_bytes()
    assert raw[:2] == b"\x08\x02"  # field 1, varint, value 2
    blob = caffe_pb2.BlobProto.FromString(raw)
    assert (blob.num, blob.channels, blob.height, blob.width) == (2, 3, 1, 300)
    assert list(blob.shape.dim) == [2, 3, 300]
    assert list(blob.data) == [1.5, -2.0, 0.25]
    assert list(blob.double_data) == [0.1, -1e300]
    assert len(blob.diff) == 0 and len(blob.double_diff) == 0

    built = caffe_pb2.BlobProto()
    built.num, built.channels, built.height, built.width = 2, 3, 1, 300
    built.shape.dim.extend([2, 3, 300])
    built.data.extend([1.5, -2.0, 0.25])
    built.double_data.extend([0.1, -1e300])
    assert built.SerializeToString() == raw


def _netparameter_bytes():
    conv = b"".join([
        _varint_field(1, 20),    # num_output
        _varint_field(4, 5),     # kernel_size: repeated uint32, not packed in proto2
        _varint_field(5, 2),     # group
    ])
    layer = b"".join([
        _bytes_field(1, b"conv1"),
        _bytes_field(2, b"Convolution"),
        _bytes_field(3, b"data"),
        _bytes_field(4, b"conv1"),
        _bytes_field(106, conv),  # convolution_param: two-byte key
    ])
    return _bytes_field(1, b"LeNet") + _bytes_field(100, layer)


def test_hand_built_netparameter_parses_and_reserializes_identically():
    raw = _netparameter_bytes()
    assert _key(100, LENGTH_DELIMITED) == b"\xa2\x06"
    assert _key(106, LENGTH_DELIMITED) == b"\xd2\x06"
    net = caffe_pb2.NetParameter.FromString(raw)
    assert net.name == "LeNet"
    assert len(net.layer) == 1
    layer = net.layer[0]
    assert (layer.name, layer.type) == ("conv1", "Convolution")
    assert list(layer.bottom) == ["data"] and list(layer.top) == ["conv1"]
    conv = layer.convolution_param
    assert conv.num_output == 20 and list(conv.kernel_size) == [5] and conv.group == 2
    assert conv.bias_term is True  # unset on the wire: the schema default

    built = caffe_pb2.NetParameter(name="LeNet")
    new_layer = built.layer.add(name="conv1", type="Convolution", bottom=["data"], top=["conv1"])
    new_layer.convolution_param.num_output = 20
    new_layer.convolution_param.kernel_size.append(5)
    new_layer.convolution_param.group = 2
    assert built.SerializeToString() == raw


def test_negative_and_legacy_values_on_the_wire():
    # SolverParameter.random_seed (int64, field 20) = -1 and solver_type (enum, 30) = ADAM (5).
    raw = _varint_field(20, -1) + _varint_field(30, 5)
    assert len(_varint(-1)) == 10
    solver = caffe_pb2.SolverParameter.FromString(raw)
    assert solver.random_seed == -1
    assert solver.solver_type == caffe_pb2.SolverParameter.ADAM
    # V1 layer: type CONVOLUTION (field 5, value 4), blobs_lr (field 7, float, unpacked).
    v1 = caffe_pb2.V1LayerParameter.FromString(
        _varint_field(5, 4) + _key(7, FIXED32) + struct.pack("<f", 2.0))
    assert v1.type == caffe_pb2.V1LayerParameter.CONVOLUTION
    assert list(v1.blobs_lr) == [2.0]


# ---------------------------------------------------------------------------
# Field numbers and defaults, as Caffe documents them
# ---------------------------------------------------------------------------

DEFAULTS = [
    # (message, field, number, default); None: no explicit default (zero value)
    ("BlobShape", "dim", 1, None),
    ("BlobProto", "shape", 7, None),
    ("BlobProto", "data", 5, None),
    ("BlobProto", "diff", 6, None),
    ("BlobProto", "double_data", 8, None),
    ("BlobProto", "double_diff", 9, None),
    ("BlobProto", "num", 1, 0),
    ("BlobProto", "width", 4, 0),
    ("BlobProtoVector", "blobs", 1, None),
    ("Datum", "data", 4, None),
    ("Datum", "label", 5, None),
    ("Datum", "float_data", 6, None),
    ("Datum", "encoded", 7, False),
    ("FillerParameter", "type", 1, "constant"),
    ("FillerParameter", "max", 4, 1.0),
    ("FillerParameter", "std", 6, 1.0),
    ("FillerParameter", "sparse", 7, -1),
    ("FillerParameter", "variance_norm", 8, "FAN_IN"),
    ("NetParameter", "input", 3, None),
    ("NetParameter", "input_dim", 4, None),
    ("NetParameter", "input_shape", 8, None),
    ("NetParameter", "force_backward", 5, False),
    ("NetParameter", "layer", 100, None),
    ("NetParameter", "layers", 2, None),
    ("SolverParameter", "net", 24, None),
    ("SolverParameter", "test_iter", 3, None),
    ("SolverParameter", "test_interval", 4, 0),
    ("SolverParameter", "test_initialization", 32, True),
    ("SolverParameter", "base_lr", 5, None),
    ("SolverParameter", "average_loss", 33, 1),
    ("SolverParameter", "iter_size", 36, 1),
    ("SolverParameter", "lr_policy", 8, None),
    ("SolverParameter", "momentum", 11, None),
    ("SolverParameter", "weight_decay", 12, None),
    ("SolverParameter", "regularization_type", 29, "L2"),
    ("SolverParameter", "stepvalue", 34, None),
    ("SolverParameter", "clip_gradients", 35, -1.0),
    ("SolverParameter", "snapshot", 14, 0),
    ("SolverParameter", "snapshot_format", 37, "BINARYPROTO"),
    ("SolverParameter", "solver_mode", 17, "GPU"),
    ("SolverParameter", "random_seed", 20, -1),
    ("SolverParameter", "type", 40, "SGD"),
    ("SolverParameter", "delta", 31, 1e-8),
    ("SolverParameter", "momentum2", 39, 0.999),
    ("SolverParameter", "rms_decay", 38, 0.99),
    ("SolverParameter", "snapshot_after_train", 28, True),
    ("SolverParameter", "solver_type", 30, "SGD"),
    ("SolverParameter", "layer_wise_reduce", 41, True),
    ("SolverParameter", "weights", 42, None),
    ("SolverState", "history", 3, None),
    ("SolverState", "current_step", 4, 0),
    ("NetState", "phase", 1, "TEST"),
    ("NetStateRule", "not_stage", 5, None),
    ("ParamSpec", "share_mode", 2, None),
    ("ParamSpec", "lr_mult", 3, 1.0),
    ("ParamSpec", "decay_mult", 4, 1.0),
    ("LayerParameter", "phase", 10, None),
    ("LayerParameter", "loss_weight", 5, None),
    ("LayerParameter", "param", 6, None),
    ("LayerParameter", "blobs", 7, None),
    ("LayerParameter", "propagate_down", 11, None),
    ("LayerParameter", "include", 8, None),
    ("LayerParameter", "exclude", 9, None),
    ("TransformationParameter", "scale", 1, 1.0),
    ("TransformationParameter", "crop_size", 3, 0),
    ("TransformationParameter", "mean_value", 5, None),
    ("TransformationParameter", "force_gray", 7, False),
    ("LossParameter", "ignore_label", 1, None),
    ("LossParameter", "normalization", 3, "VALID"),
    ("LossParameter", "normalize", 2, None),
    ("AccuracyParameter", "top_k", 1, 1),
    ("AccuracyParameter", "axis", 2, 1),
    ("ArgMaxParameter", "top_k", 2, 1),
    ("BatchNormParameter", "moving_average_fraction", 2, 0.999),
    ("BatchNormParameter", "eps", 3, 1e-5),
    ("BiasParameter", "num_axes", 2, 1),
    ("ClipParameter", "max", 2, None),
    ("ConcatParameter", "axis", 2, 1),
    ("ConcatParameter", "concat_dim", 1, 1),
    ("ContrastiveLossParameter", "margin", 1, 1.0),
    ("ConvolutionParameter", "bias_term", 2, True),
    ("ConvolutionParameter", "pad", 3, None),
    ("ConvolutionParameter", "kernel_size", 4, None),
    ("ConvolutionParameter", "group", 5, 1),
    ("ConvolutionParameter", "stride", 6, None),
    ("ConvolutionParameter", "weight_filler", 7, None),
    ("ConvolutionParameter", "engine", 15, "DEFAULT"),
    ("ConvolutionParameter", "axis", 16, 1),
    ("ConvolutionParameter", "force_nd_im2col", 17, False),
    ("ConvolutionParameter", "dilation", 18, None),
    ("CropParameter", "axis", 1, 2),
    ("DataParameter", "batch_size", 4, None),
    ("DataParameter", "backend", 8, "LEVELDB"),
    ("DataParameter", "prefetch", 10, 4),
    ("DataParameter", "shared_file_system", 11, False),
    ("DropoutParameter", "dropout_ratio", 1, 0.5),
    ("DummyDataParameter", "shape", 6, None),
    ("EltwiseParameter", "operation", 1, "SUM"),
    ("EltwiseParameter", "stable_prod_grad", 3, True),
    ("ELUParameter", "alpha", 1, 1.0),
    ("EmbedParameter", "bias_term", 3, True),
    ("ExpParameter", "base", 1, -1.0),
    ("FlattenParameter", "end_axis", 2, -1),
    ("HingeLossParameter", "norm", 1, "L1"),
    ("ImageDataParameter", "batch_size", 4, 1),
    ("ImageDataParameter", "is_color", 11, True),
    ("ImageDataParameter", "root_folder", 12, ""),
    ("InnerProductParameter", "bias_term", 2, True),
    ("InnerProductParameter", "axis", 5, 1),
    ("InnerProductParameter", "transpose", 6, False),
    ("InputParameter", "shape", 1, None),
    ("LogParameter", "base", 1, -1.0),
    ("LRNParameter", "local_size", 1, 5),
    ("LRNParameter", "alpha", 2, 1.0),
    ("LRNParameter", "beta", 3, 0.75),
    ("LRNParameter", "norm_region", 4, "ACROSS_CHANNELS"),
    ("LRNParameter", "k", 5, 1.0),
    ("MVNParameter", "normalize_variance", 1, True),
    ("MVNParameter", "eps", 3, 1e-9),
    ("PoolingParameter", "pool", 1, "MAX"),
    ("PoolingParameter", "kernel_size", 2, None),
    ("PoolingParameter", "stride", 3, 1),
    ("PoolingParameter", "pad", 4, 0),
    ("PoolingParameter", "global_pooling", 12, False),
    ("PowerParameter", "power", 1, 1.0),
    ("PReLUParameter", "channel_shared", 2, False),
    ("PythonParameter", "param_str", 3, ""),
    ("ReductionParameter", "operation", 1, "SUM"),
    ("ReductionParameter", "axis", 2, 0),
    ("ReLUParameter", "negative_slope", 1, 0.0),
    ("ReshapeParameter", "num_axes", 3, -1),
    ("ScaleParameter", "bias_term", 4, False),
    ("SliceParameter", "axis", 3, 1),
    ("SliceParameter", "slice_point", 2, None),
    ("SoftmaxParameter", "axis", 2, 1),
    ("SPPParameter", "engine", 6, "DEFAULT"),
    ("SwishParameter", "beta", 1, 1.0),
    ("ThresholdParameter", "threshold", 1, 0.0),
    ("TileParameter", "tiles", 2, None),
    ("WindowDataParameter", "fg_fraction", 9, 0.25),
    ("WindowDataParameter", "crop_mode", 11, "warp"),
    ("V1LayerParameter", "type", 5, None),
    ("V1LayerParameter", "blobs_lr", 7, None),
    ("V1LayerParameter", "weight_decay", 8, None),
    ("V1LayerParameter", "include", 32, None),
    ("V1LayerParameter", "param", 1001, None),
    ("V1LayerParameter", "transform_param", 36, None),
    ("V1LayerParameter", "layer", 1, None),
    ("V0LayerParameter", "biasterm", 4, True),
    ("V0LayerParameter", "kernelsize", 8, None),
    ("V0LayerParameter", "k", 22, 1.0),
    ("V0LayerParameter", "det_crop_mode", 59, "warp"),
    ("V0LayerParameter", "concat_dim", 65, 1),
    ("V0LayerParameter", "hdf5_output_param", 1001, None),
]


@pytest.mark.parametrize("message,field,number,default", DEFAULTS,
                         ids=["%s.%s" % row[:2] for row in DEFAULTS])
def test_field_number_and_default(message, field, number, default):
    fd = caffe_pb2.DESCRIPTOR.message_types_by_name[message].fields_by_name[field]
    assert fd.number == number
    if default is None:
        assert not fd.has_default_value
        return
    assert fd.has_default_value
    if fd.type == FD.TYPE_ENUM:
        assert fd.enum_type.values_by_number[fd.default_value].name == default
    elif fd.type == FD.TYPE_FLOAT:
        assert fd.default_value == struct.unpack("<f", struct.pack("<f", default))[0]
    else:
        assert fd.default_value == default and type(fd.default_value) is type(default)


def test_default_values_seen_through_messages():
    solver = caffe_pb2.SolverParameter()
    assert solver.type == "SGD" and solver.solver_mode == caffe_pb2.SolverParameter.GPU
    assert solver.snapshot_format == caffe_pb2.SolverParameter.BINARYPROTO
    assert solver.delta == pytest.approx(1e-8, rel=1e-7)
    assert caffe_pb2.PoolingParameter().stride == 1
    lrn = caffe_pb2.LRNParameter()
    assert (lrn.local_size, lrn.alpha, lrn.beta, lrn.k) == (5, 1.0, 0.75, 1.0)
    assert caffe_pb2.NetState().phase == caffe_pb2.TEST
    assert not caffe_pb2.ConvolutionParameter().HasField("bias_term")


V1_LAYER_TYPES = {
    "NONE": 0, "ABSVAL": 35, "ACCURACY": 1, "ARGMAX": 30, "BNLL": 2, "CONCAT": 3,
    "CONTRASTIVE_LOSS": 37, "CONVOLUTION": 4, "DATA": 5, "DECONVOLUTION": 39, "DROPOUT": 6,
    "DUMMY_DATA": 32, "EUCLIDEAN_LOSS": 7, "ELTWISE": 25, "EXP": 38, "FLATTEN": 8,
    "HDF5_DATA": 9, "HDF5_OUTPUT": 10, "HINGE_LOSS": 28, "IM2COL": 11, "IMAGE_DATA": 12,
    "INFOGAIN_LOSS": 13, "INNER_PRODUCT": 14, "LRN": 15, "MEMORY_DATA": 29,
    "MULTINOMIAL_LOGISTIC_LOSS": 16, "MVN": 34, "POOLING": 17, "POWER": 26, "RELU": 18,
    "SIGMOID": 19, "SIGMOID_CROSS_ENTROPY_LOSS": 27, "SILENCE": 36, "SOFTMAX": 20,
    "SOFTMAX_LOSS": 21, "SPLIT": 22, "SLICE": 33, "TANH": 23, "WINDOW_DATA": 24,
    "THRESHOLD": 31,
}

ENUMS = {
    "Phase": {"TRAIN": 0, "TEST": 1},
    "FillerParameter.VarianceNorm": {"FAN_IN": 0, "FAN_OUT": 1, "AVERAGE": 2},
    "SolverParameter.SnapshotFormat": {"HDF5": 0, "BINARYPROTO": 1},
    "SolverParameter.SolverMode": {"CPU": 0, "GPU": 1},
    "SolverParameter.SolverType": {"SGD": 0, "NESTEROV": 1, "ADAGRAD": 2, "RMSPROP": 3,
                                   "ADADELTA": 4, "ADAM": 5},
    "ParamSpec.DimCheckMode": {"STRICT": 0, "PERMISSIVE": 1},
    "LossParameter.NormalizationMode": {"FULL": 0, "VALID": 1, "BATCH_SIZE": 2, "NONE": 3},
    "ConvolutionParameter.Engine": {"DEFAULT": 0, "CAFFE": 1, "CUDNN": 2},
    "DataParameter.DB": {"LEVELDB": 0, "LMDB": 1},
    "EltwiseParameter.EltwiseOp": {"PROD": 0, "SUM": 1, "MAX": 2},
    "HingeLossParameter.Norm": {"L1": 1, "L2": 2},
    "LRNParameter.NormRegion": {"ACROSS_CHANNELS": 0, "WITHIN_CHANNEL": 1},
    "PoolingParameter.PoolMethod": {"MAX": 0, "AVE": 1, "STOCHASTIC": 2},
    "ReductionParameter.ReductionOp": {"SUM": 1, "ASUM": 2, "SUMSQ": 3, "MEAN": 4},
    "V1LayerParameter.LayerType": V1_LAYER_TYPES,
    "V1LayerParameter.DimCheckMode": {"STRICT": 0, "PERMISSIVE": 1},
    "V0LayerParameter.PoolMethod": {"MAX": 0, "AVE": 1, "STOCHASTIC": 2},
}


@pytest.mark.parametrize("enum_name", sorted(ENUMS))
def test_enum_values(enum_name):
    enum = caffe_pb2.DESCRIPTOR.pool.FindEnumTypeByName("caffe." + enum_name)
    assert {v.name: v.number for v in enum.values} == ENUMS[enum_name]


# LayerParameter's per-type fields: name -> (number, message type).
LAYER_PARAMS = {
    "transform_param": (100, "TransformationParameter"), "loss_param": (101, "LossParameter"),
    "accuracy_param": (102, "AccuracyParameter"), "argmax_param": (103, "ArgMaxParameter"),
    "batch_norm_param": (139, "BatchNormParameter"), "bias_param": (141, "BiasParameter"),
    "clip_param": (148, "ClipParameter"), "concat_param": (104, "ConcatParameter"),
    "contrastive_loss_param": (105, "ContrastiveLossParameter"),
    "convolution_param": (106, "ConvolutionParameter"), "crop_param": (144, "CropParameter"),
    "data_param": (107, "DataParameter"), "dropout_param": (108, "DropoutParameter"),
    "dummy_data_param": (109, "DummyDataParameter"), "eltwise_param": (110, "EltwiseParameter"),
    "elu_param": (140, "ELUParameter"), "embed_param": (137, "EmbedParameter"),
    "exp_param": (111, "ExpParameter"), "flatten_param": (135, "FlattenParameter"),
    "hdf5_data_param": (112, "HDF5DataParameter"),
    "hdf5_output_param": (113, "HDF5OutputParameter"),
    "hinge_loss_param": (114, "HingeLossParameter"),
    "image_data_param": (115, "ImageDataParameter"),
    "infogain_loss_param": (116, "InfogainLossParameter"),
    "inner_product_param": (117, "InnerProductParameter"), "input_param": (143, "InputParameter"),
    "log_param": (134, "LogParameter"), "lrn_param": (118, "LRNParameter"),
    "memory_data_param": (119, "MemoryDataParameter"), "mvn_param": (120, "MVNParameter"),
    "parameter_param": (145, "ParameterParameter"), "pooling_param": (121, "PoolingParameter"),
    "power_param": (122, "PowerParameter"), "prelu_param": (131, "PReLUParameter"),
    "python_param": (130, "PythonParameter"), "recurrent_param": (146, "RecurrentParameter"),
    "reduction_param": (136, "ReductionParameter"), "relu_param": (123, "ReLUParameter"),
    "reshape_param": (133, "ReshapeParameter"), "scale_param": (142, "ScaleParameter"),
    "sigmoid_param": (124, "SigmoidParameter"), "softmax_param": (125, "SoftmaxParameter"),
    "spp_param": (132, "SPPParameter"), "slice_param": (126, "SliceParameter"),
    "swish_param": (147, "SwishParameter"), "tanh_param": (127, "TanHParameter"),
    "threshold_param": (128, "ThresholdParameter"), "tile_param": (138, "TileParameter"),
    "window_data_param": (129, "WindowDataParameter"),
}


def _param_fields(message_name):
    message = caffe_pb2.DESCRIPTOR.message_types_by_name[message_name]
    return {f.name: (f.number, f.message_type.name) for f in message.fields
            if f.type == FD.TYPE_MESSAGE and f.message_type.name.endswith("Parameter")}


def test_layer_parameter_carries_every_layer_type_field():
    assert _param_fields("LayerParameter") == LAYER_PARAMS


def test_v1_layer_parameter_fields():
    expected = {
        "accuracy_param": 27, "argmax_param": 23, "concat_param": 9,
        "contrastive_loss_param": 40, "convolution_param": 10, "data_param": 11,
        "dropout_param": 12, "dummy_data_param": 26, "eltwise_param": 24, "exp_param": 41,
        "hdf5_data_param": 13, "hdf5_output_param": 14, "hinge_loss_param": 29,
        "image_data_param": 15, "infogain_loss_param": 16, "inner_product_param": 17,
        "lrn_param": 18, "memory_data_param": 22, "mvn_param": 34, "pooling_param": 19,
        "power_param": 21, "relu_param": 30, "sigmoid_param": 38, "softmax_param": 39,
        "slice_param": 31, "tanh_param": 37, "threshold_param": 25, "window_data_param": 20,
        "transform_param": 36, "loss_param": 42, "layer": 1,
    }
    got = {name: number for name, (number, _) in _param_fields("V1LayerParameter").items()}
    got["layer"] = caffe_pb2.V1LayerParameter.DESCRIPTOR.fields_by_name["layer"].number
    assert got == expected


# ---------------------------------------------------------------------------
# Every field of every layer parameter message is reachable from text
# ---------------------------------------------------------------------------

def _sample_values(fd):
    """Two text tokens and the values they must parse to, for a scalar field."""
    if fd.type == FD.TYPE_ENUM:
        values = fd.enum_type.values
        picks = [values[0], values[-1]]
        return [v.name for v in picks], [v.number for v in picks]
    if fd.type == FD.TYPE_BOOL:
        return ["true", "false"], [True, False]
    if fd.type in (FD.TYPE_FLOAT, FD.TYPE_DOUBLE):
        return ["0.375", "-2.5"], [0.375, -2.5]  # exact in binary32
    if fd.type == FD.TYPE_STRING:
        return ['"s_%s"' % fd.name, '"t"'], ["s_%s" % fd.name, "t"]
    if fd.type == FD.TYPE_BYTES:
        return ['"\\001b"', '"c"'], [b"\x01b", b"c"]
    if fd.type in (FD.TYPE_UINT32, FD.TYPE_UINT64, FD.TYPE_FIXED32, FD.TYPE_FIXED64):
        return ["7", "300"], [7, 300]
    return ["-7", "300"], [-7, 300]  # signed integers


def _fill(message_desc, depth):
    """Text setting every field of `message_desc` (nested messages `depth` levels)
    and a checker comparing a parsed message against it."""
    parts, checks = [], []
    for fd in message_desc.fields:
        if fd.type == FD.TYPE_MESSAGE:
            if depth == 0:
                continue
            text, check = _fill(fd.message_type, depth - 1)
            copies = 2 if is_repeated(fd) else 1
            parts.extend(["%s { %s }" % (fd.name, text)] * copies)

            def check_message(msg, fd=fd, check=check, copies=copies):
                value = getattr(msg, fd.name)
                items = list(value) if is_repeated(fd) else [value]
                assert len(items) == copies, fd.full_name
                for item in items:
                    check(item)
            checks.append(check_message)
            continue
        tokens, values = _sample_values(fd)
        if not is_repeated(fd):
            tokens, values = tokens[:1], values[:1]
        parts.extend("%s: %s" % (fd.name, token) for token in tokens)

        def check_scalar(msg, fd=fd, values=values):
            got = getattr(msg, fd.name)
            got = list(got) if is_repeated(fd) else [got]
            assert got == values, fd.full_name
            if not is_repeated(fd):
                assert msg.HasField(fd.name), fd.full_name
        checks.append(check_scalar)

    def check_all(msg):
        for check in checks:
            check(msg)
    return " ".join(parts), check_all


def test_every_field_of_every_layer_parameter_parses_from_text():
    layer_desc = caffe_pb2.LayerParameter.DESCRIPTOR
    blocks, checks = [], []
    for index, field_name in enumerate(sorted(LAYER_PARAMS)):
        text, check = _fill(layer_desc.fields_by_name[field_name].message_type, depth=1)
        assert text, field_name
        blocks.append('layer { name: "l%d" type: "T" %s { %s } }' % (index, field_name, text))
        checks.append((field_name, check))
    prototxt = "\n".join(blocks)

    net = text_format.Parse(prototxt, caffe_pb2.NetParameter())
    assert len(net.layer) == len(LAYER_PARAMS)
    for layer, (field_name, check) in zip(net.layer, checks):
        assert layer.HasField(field_name)
        check(getattr(layer, field_name))

    # Printing and parsing again loses nothing, in text and on the wire.
    again = text_format.Parse(text_format.MessageToString(net), caffe_pb2.NetParameter())
    assert again == net
    assert caffe_pb2.NetParameter.FromString(net.SerializeToString()) == net


def test_unknown_field_is_rejected():
    with pytest.raises(text_format.ParseError, match="no_such_field"):
        text_format.Parse("layer { convolution_param { no_such_field: 1 } }",
                          caffe_pb2.NetParameter())


# ---------------------------------------------------------------------------
# Real-world prototxt shapes
# ---------------------------------------------------------------------------

LENET = """
name: "LeNet"
layer {
  name: "mnist" type: "Data" top: "data" top: "label"
  include { phase: TRAIN }
  transform_param { scale: 0.00390625 }
  data_param { source: "examples/mnist/mnist_train_lmdb" batch_size: 64 backend: LMDB }
}
layer {
  name: "mnist" type: "Data" top: "data" top: "label"
  include { phase: TEST }
  transform_param { scale: 0.00390625 }
  data_param { source: "examples/mnist/mnist_test_lmdb" batch_size: 100 backend: LMDB }
}
layer {
  name: "conv1" type: "Convolution" bottom: "data" top: "conv1"
  param { lr_mult: 1 } param { lr_mult: 2 }
  convolution_param {
    num_output: 20 kernel_size: 5 stride: 1
    weight_filler { type: "xavier" } bias_filler { type: "constant" }
  }
}
layer {
  name: "pool1" type: "Pooling" bottom: "conv1" top: "pool1"
  pooling_param { pool: MAX kernel_size: 2 stride: 2 }
}
layer {
  name: "ip1" type: "InnerProduct" bottom: "pool1" top: "ip1"
  param { lr_mult: 1 } param { lr_mult: 2 }
  inner_product_param { num_output: 500 weight_filler { type: "xavier" } }
}
layer { name: "relu1" type: "ReLU" bottom: "ip1" top: "ip1" }
layer {
  name: "accuracy" type: "Accuracy" bottom: "ip1" bottom: "label" top: "accuracy"
  include { phase: TEST }
}
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip1" bottom: "label" top: "loss" }
"""


def test_lenet_text_round_trip():
    net = text_format.Parse(LENET, caffe_pb2.NetParameter())
    assert [layer.name for layer in net.layer] == [
        "mnist", "mnist", "conv1", "pool1", "ip1", "relu1", "accuracy", "loss"]
    assert net.layer[0].include[0].phase == caffe_pb2.TRAIN
    assert net.layer[1].data_param.backend == caffe_pb2.DataParameter.LMDB
    assert [p.lr_mult for p in net.layer[2].param] == [1.0, 2.0]
    assert list(net.layer[2].convolution_param.kernel_size) == [5]
    assert net.layer[3].pooling_param.pool == caffe_pb2.PoolingParameter.MAX
    text = text_format.MessageToString(net)
    assert text_format.Parse(text, caffe_pb2.NetParameter()) == net


def test_legacy_v1_net_and_solver_parse():
    v1 = text_format.Parse("""
        name: "CaffeNet"
        input: "data" input_dim: 10 input_dim: 3 input_dim: 227 input_dim: 227
        layers {
          name: "conv2" type: CONVOLUTION bottom: "norm1" top: "conv2"
          blobs_lr: 1 blobs_lr: 2 weight_decay: 1 weight_decay: 0
          convolution_param { num_output: 256 pad: 2 kernel_size: 5 group: 2 }
        }
        layers {
          name: "norm1" type: LRN bottom: "pool1" top: "norm1"
          lrn_param { local_size: 5 alpha: 0.0001 beta: 0.75 }
        }
        layers { layer { name: "old" type: "conv" kernelsize: 3 biasterm: false } }
        """, caffe_pb2.NetParameter())
    assert list(v1.input_dim) == [10, 3, 227, 227]
    assert v1.layers[0].type == caffe_pb2.V1LayerParameter.CONVOLUTION
    assert list(v1.layers[0].blobs_lr) == [1.0, 2.0]
    assert v1.layers[1].lrn_param.alpha == pytest.approx(1e-4)
    assert v1.layers[2].layer.kernelsize == 3 and not v1.layers[2].layer.biasterm

    solver = text_format.Parse("""
        net: "lenet_train_test.prototxt" test_iter: 100 test_interval: 500
        base_lr: 0.01 momentum: 0.9 weight_decay: 0.0005
        lr_policy: "multistep" gamma: 0.1 stepvalue: 1000 stepvalue: 2000
        display: 100 max_iter: 10000 snapshot: 5000 snapshot_prefix: "lenet"
        solver_mode: CPU solver_type: NESTEROV delta: 1e-6 momentum2: 0.99
        rms_decay: 0.9 type: "Adam" clip_gradients: 10 iter_size: 2
        weights: "a.caffemodel" weights: "b.caffemodel" layer_wise_reduce: false
        snapshot_format: HDF5 average_loss: 20 test_initialization: false
        regularization_type: "L1" random_seed: 1701 device_id: 0
        train_state { phase: TRAIN stage: "s" level: 1 }
        """, caffe_pb2.SolverParameter())
    assert solver.solver_type == caffe_pb2.SolverParameter.NESTEROV
    assert solver.type == "Adam" and list(solver.weights) == ["a.caffemodel", "b.caffemodel"]
    assert list(solver.stepvalue) == [1000, 2000] and not solver.layer_wise_reduce


def test_the_committed_module_has_no_runtime_version_gate():
    # the gate would refuse the protobuf 4.25-6.x that PyTorch, TensorFlow and ONNX keep;
    # test_protobuf_range.py runs the proto and io tests under the lowest one
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), os.pardir, "scripts"))
    import gen_proto
    with open(gen_proto.MODULE_PATH, encoding="utf-8") as f:
        text = f.read()
    assert "runtime_version" not in text and "AddSerializedFile" in text
    gated = ("from google.protobuf import runtime_version as _runtime_version\n"
             "_runtime_version.ValidateProtobufRuntimeVersion(\n    _runtime_version.Domain."
             "PUBLIC,\n    7,\n    35,\n    1,\n    '',\n    'caffe.proto'\n)\n")
    assert gen_proto.without_runtime_gate(gated + "rest\n") == "rest\n"
