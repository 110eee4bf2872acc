"""Values are checked when a solver or net is loaded, with the field in the error: nothing
non-finite, nothing out of the range the update rules are defined on, no unknown policy, and
every failure of net building is one of the project's error classes."""
import re
import subprocess
import sys

import pytest

from poseidon_caffe import TEST, io as pio
from poseidon_caffe.layers.base import LayerError
from poseidon_caffe.net import Net, NetError
from poseidon_caffe.solver import SolverError, get_solver

NET = """name: "tiny"
layer { name: "data" type: "DummyData" top: "data" top: "label"
  dummy_data_param { shape { dim: 4 dim: 3 } shape { dim: 4 }
    data_filler { type: "gaussian" std: 1 } data_filler { type: "constant" value: 1 } } }
layer { name: "ip" type: "InnerProduct" bottom: "data" top: "ip"
  inner_product_param { num_output: 2 weight_filler { type: "gaussian" std: 0.1 } } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip" bottom: "label" top: "loss" }
"""

BASE = 'net: "net.prototxt" lr_policy: "fixed" '


@pytest.fixture
def solver_dir(tmp_path, monkeypatch):
    (tmp_path / "net.prototxt").write_text(NET)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def load(solver_dir, extra, base=BASE):
    path = solver_dir / "solver.prototxt"
    path.write_text(base + extra)
    return get_solver(str(path))


@pytest.mark.parametrize("extra, expected", [
    ("base_lr: nan", "values must be finite numbers: base_lr = nan"),
    ("weight_decay: inf", "values must be finite numbers: weight_decay = inf"),
    ("clip_gradients: -inf", "values must be finite numbers: clip_gradients = -inf"),
    ("momentum: 1e30", "momentum must be in [0, 1) (got 1e+30)"),
    ("momentum: 1", "momentum must be in [0, 1) (got 1)"),
    ("momentum: -0.5", "momentum must be in [0, 1) (got -0.5)"),
    ("momentum2: 1.5 type: \"Adam\"", "momentum2 must be in [0, 1) (got 1.5)"),
    ("delta: 0", "delta must be > 0 (got 0)"),
    ("weight_decay: -0.001", "weight_decay must be >= 0 (got -0.001)"),
    ("max_iter: -1", "max_iter must be >= 0 (got -1)"),
    ("display: -1", "display must be >= 0 (got -1)"),
    ("snapshot: -1", "snapshot must be >= 0 (got -1)"),
    ("test_iter: -1 test_interval: 2", "test_iter[0] must be >= 0 (got -1)"),
    ("test_iter: 1 test_interval: -1", "test_interval must be >= 0 (got -1)"),
    ("test_iter: 1", "test_interval must be > 0 when test_iter is given (got 0)"),
    ("iter_size: 0", "iter_size must be >= 1 (got 0)"),
    ("average_loss: 0", "average_loss must be >= 1 (got 0)"),
    ("stepsize: -3", "stepsize must be >= 0 (got -3)"),
])
def test_solver_values_are_checked_at_load_naming_the_field_and_file(solver_dir, extra,
                                                                      expected):
    with pytest.raises(SolverError) as info:
        load(solver_dir, extra)
    message = str(info.value)
    assert expected in message
    assert message.startswith(str(solver_dir / "solver.prototxt") + ": ")


def test_every_problem_is_named_in_one_line(solver_dir):
    with pytest.raises(SolverError) as info:
        load(solver_dir, "momentum: 2 max_iter: -5")
    message = str(info.value)
    assert "momentum must be in [0, 1) (got 2)" in message
    assert "max_iter must be >= 0 (got -5)" in message
    assert "\n" not in message


@pytest.mark.parametrize("policy, expected", [
    ('lr_policy: "bogus"', "lr_policy 'bogus' is unknown (expected one of fixed, step, exp, "
                           "inv, multistep, poly, sigmoid)"),
    ("", "lr_policy is not set"),
    ('lr_policy: "step"', 'lr_policy "step" needs stepsize > 0 (got 0)'),
    ('lr_policy: "poly" power: 1', 'lr_policy "poly" needs max_iter > 0 (got 0)'),
    ('lr_policy: "multistep" stepvalue: 5 stepvalue: 2',
     'lr_policy "multistep" needs stepvalue entries >= 0 in non-decreasing order (got [5, 2])'),
])
def test_learning_rate_policy_is_checked_at_load(solver_dir, policy, expected):
    with pytest.raises(SolverError) as info:
        load(solver_dir, policy, base='net: "net.prototxt" base_lr: 0.1 ')
    assert expected in str(info.value)


def test_good_values_still_load(solver_dir):
    solver = load(solver_dir, 'type: "Adam" base_lr: 0.1 momentum: 0.9 momentum2: 0.999 '
                              'delta: 1e-8 max_iter: 4 test_iter: 0 test_interval: 2')
    solver.solve()          # test_iter 0 runs no test batch and divides by nothing
    assert solver.iter == 4


def test_an_unknown_policy_stops_the_cli_before_any_test_pass(solver_dir):
    (solver_dir / "solver.prototxt").write_text(
        BASE.replace('"fixed"', '"bogus"') + "max_iter: 4 test_iter: 1 test_interval: 2 "
        "test_initialization: true")
    proc = subprocess.run([sys.executable, "-m", "poseidon_caffe.cli", "train",
                           "-solver", "solver.prototxt"], cwd=str(solver_dir),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr and "Testing net" not in proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("E")]
    assert len(errors) == 1 and "lr_policy 'bogus' is unknown" in errors[0]
    assert "solver.prototxt: " in errors[0]


def test_an_unwritable_prefix_for_the_final_snapshot_stops_before_training(solver_dir):
    # snapshot: 0, so only the snapshot after training would find out, after all the work
    solver = load(solver_dir, 'max_iter: 2 snapshot_prefix: "missing/dir/x"')
    with pytest.raises(SolverError, match=r"^Cannot write to snapshot prefix 'missing/dir/x'"):
        solver.solve()
    assert solver.iter == 0


BAD_IP = ('inner_product_param { num_output: 2 weight_filler { type: "gaussian" std: 0.1 } } }',
          'param { lr_mult: nan } inner_product_param { num_output: 2 '
          'weight_filler { type: "gaussian" std: 0.1 } } }')


def test_a_bad_layer_of_the_solvers_net_file_names_that_file(solver_dir):
    (solver_dir / "net.prototxt").write_text(NET.replace(*BAD_IP))
    with pytest.raises(NetError, match=r"^net.prototxt: layer 'ip' of type InnerProduct: values "
                                       r"must be finite numbers: param\[0\].lr_mult = nan$"):
        load(solver_dir, "max_iter: 1")


def test_a_bad_layer_of_a_net_inside_the_solver_names_the_solver_and_field(solver_dir):
    base = "net_param { %s } lr_policy: \"fixed\" " % NET.replace(*BAD_IP)
    with pytest.raises(NetError, match=r"^%s \(net_param\): layer 'ip' of type InnerProduct"
                                       % re.escape(str(solver_dir / "solver.prototxt"))):
        load(solver_dir, "max_iter: 1", base=base)


# -- layers ------------------------------------------------------------------------------------

def build(text, source="net.prototxt"):
    return Net(pio.parse_net_text('name: "n"\n' + text, source), TEST)


INPUT = 'layer { name: "data" type: "Input" top: "data" input_param { shape { dim: 2 dim: 3 } } }\n'


@pytest.mark.parametrize("layer, expected", [
    ('layer { name: "ip" type: "InnerProduct" bottom: "data" top: "ip" param { lr_mult: nan } '
     'inner_product_param { num_output: 2 } }',
     "layer 'ip' of type InnerProduct: values must be finite numbers: param[0].lr_mult = nan"),
    ('layer { name: "ip" type: "InnerProduct" bottom: "data" top: "ip" param { lr_mult: 1 } '
     'param { decay_mult: -inf } inner_product_param { num_output: 2 } }',
     "param[1].decay_mult = -inf"),
    ('layer { name: "pow" type: "Power" bottom: "data" top: "pow" '
     'power_param { power: inf scale: nan shift: 1 } }',
     "layer 'pow' of type Power: values must be finite numbers: power_param.power = inf, "
     "power_param.scale = nan"),
    ('layer { name: "pow" type: "Power" bottom: "data" top: "pow" power_param { shift: -inf } }',
     "power_param.shift = -inf"),
    ('layer { name: "ip" type: "InnerProduct" bottom: "data" top: "ip" '
     'inner_product_param { num_output: 2 weight_filler { type: "gaussian" std: inf } } }',
     "inner_product_param.weight_filler.std = inf"),
    ('layer { name: "r" type: "ReLU" bottom: "data" top: "r" loss_weight: nan }',
     "loss_weight[0] = nan"),
])
def test_layer_values_must_be_finite(layer, expected):
    with pytest.raises(NetError) as info:
        build(INPUT + layer)
    assert expected in str(info.value)


def test_an_unknown_layer_type_is_a_layer_error_with_close_matches():
    with pytest.raises(LayerError) as info:
        build(INPUT + 'layer { name: "conv" type: "convolution" bottom: "data" top: "c" }')
    message = str(info.value)
    assert "Unknown layer type: 'convolution' (layer 'conv'); did you mean 'Convolution'" in message
    with pytest.raises(LayerError, match=r"'Relu' \(layer 'r'\); did you mean 'ReLU'"):
        build(INPUT + 'layer { name: "r" type: "Relu" bottom: "data" top: "r" }')
    with pytest.raises(LayerError) as info:
        build(INPUT + 'layer { name: "x" type: "Zzzzz" bottom: "data" top: "x" }')
    assert "did you mean" not in str(info.value)


def test_a_net_file_names_itself_in_its_errors(tmp_path):
    path = tmp_path / "bad.prototxt"
    path.write_text('name: "n"\n' + INPUT +
                    'layer { name: "r" type: "Relu" bottom: "data" top: "r" }')
    with pytest.raises(LayerError, match=r"^%s: Unknown layer type: 'Relu'" % str(path)):
        Net(str(path), TEST)


def test_failures_inside_layer_creation_become_project_errors():
    # a stored blob whose values do not fill its shape, named by layer
    with pytest.raises(NetError, match=r"layer 'ip' of type InnerProduct cannot be created: "
                                       r"ProtoFileError: BlobProto: BlobProto holds 2 data "
                                       r"values but its "
                                       r"shape \[2, 3\] needs 6"):
        build(INPUT + 'layer { name: "ip" type: "InnerProduct" bottom: "data" top: "ip" '
              'inner_product_param { num_output: 2 } blobs { shape { dim: 2 dim: 3 } '
              'data: 1 data: 2 } blobs { shape { dim: 2 } data: 0 data: 0 } }')


def test_a_filler_that_cannot_fill_is_named_by_its_layer():
    # fills are made after the memory check; a failing one still names its layer
    with pytest.raises(NetError, match=r"layer 'up'.*: bilinear filler needs a 4-axis blob "
                                       r"with equal height and width"):
        build('layer { name: "data" type: "Input" top: "data" '
              'input_param { shape { dim: 1 dim: 2 dim: 4 dim: 4 } } }\n'
              'layer { name: "up" type: "Deconvolution" bottom: "data" top: "up" '
              'convolution_param { num_output: 2 kernel_h: 2 kernel_w: 3 stride: 2 '
              'weight_filler { type: "bilinear" } } }')


@pytest.mark.parametrize("layer, expected", [
    ('layer { name: "bn" type: "BatchNorm" bottom: "data" top: "bn" '
     'batch_norm_param { eps: -1 } }', "BatchNorm layer 'bn': batch_norm_param.eps must be >= 0 "
                                       "(got -1)"),
    ('layer { name: "bn" type: "BatchNorm" bottom: "data" top: "bn" '
     'batch_norm_param { moving_average_fraction: 1.5 } }',
     "batch_norm_param.moving_average_fraction must be in [0, 1] (got 1.5)"),
    ('layer { name: "mvn" type: "MVN" bottom: "data" top: "mvn" mvn_param { eps: -0.5 } }',
     "MVN layer 'mvn': mvn_param.eps must be >= 0 (got -0.5)"),
])
def test_normalization_constants_are_in_range(layer, expected):
    with pytest.raises(LayerError) as info:
        build(INPUT + layer)
    assert expected in str(info.value)


def test_every_unknown_layer_type_is_named_in_the_one_error():
    # ShuffleNet's two custom types, one of them used twice, and a typo of a known type
    with pytest.raises(LayerError) as info:
        build(INPUT + 'layer { name: "dw1" type: "ConvolutionDepthwise" bottom: "data" '
                      'top: "a" }\n'
                      'layer { name: "shuffle" type: "ShuffleChannel" bottom: "a" top: "b" }\n'
                      'layer { name: "dw2" type: "ConvolutionDepthwise" bottom: "b" top: "c" }\n'
                      'layer { name: "r" type: "Relu" bottom: "c" top: "d" }')
    message = str(info.value)
    assert message.startswith("Unknown layer types: 'ConvolutionDepthwise' (layers 'dw1', "
                              "'dw2'); did you mean 'Convolution'?, 'ShuffleChannel' (layer "
                              "'shuffle'), 'Relu' (layer 'r'); did you mean 'ReLU'")
    assert "\n" not in message and message.count("Known types: ") == 1
