"""The Net engine: Caffe's build rules, gradients of whole nets, and the well-known nets' shapes."""
import logging
import re

import numpy as np
import pytest
from google.protobuf import text_format

import nets
from poseidon_caffe.net import Net, NetError, filter_net, insert_splits, state_meets_rule
from poseidon_caffe.proto import caffe_pb2

TRAIN, TEST = caffe_pb2.TRAIN, caffe_pb2.TEST


def net_from_text(text, phase=TRAIN, **kw):
    return Net(text_format.Parse(text, caffe_pb2.NetParameter()), phase, **kw)


def fill_inputs(net, seed=0, classes=10):
    rs = np.random.RandomState(seed)
    for name in net.inputs:
        blob = net.blobs[name]
        if name == "label":
            blob.data[...] = rs.randint(0, classes, blob.shape)
        else:
            blob.data[...] = rs.uniform(-1, 1, blob.shape)


# -- the well-known nets ---------------------------------------------------------------------

@pytest.mark.parametrize("which", sorted(nets.ALL))
def test_well_known_net_shapes_forward_backward_and_save(which, tmp_path):
    text, shapes, params = nets.ALL[which]()
    path = tmp_path / (which + ".prototxt")
    path.write_text(text)
    net = Net(str(path), TRAIN)
    for name, shape in shapes.items():
        got = net.blobs[name].shape
        assert len(got) == len(shape), (name, got, shape)
        assert all(e is None or e == g for e, g in zip(shape, got)), (name, got, shape)
    for layer_name, blob_shapes in params.items():
        assert [b.shape for b in net.params[layer_name]] == blob_shapes, layer_name
    fill_inputs(net)
    loss = net.forward_backward()
    assert np.isfinite(loss) and loss > 0
    first = net.params[next(iter(params))][0]
    assert np.abs(first.diff).sum() > 0, "no gradient reached the first layer"

    # the TEST net builds with the same shapes and picks up the saved weights by name
    model = tmp_path / (which + ".caffemodel")
    net.save(str(model))
    test_net = Net(str(path), str(model), TEST)
    assert any(n.endswith("accuracy") for n in test_net.outputs)
    for layer_name, blobs in net.params.items():
        for a, b in zip(blobs, test_net.params[layer_name]):
            np.testing.assert_array_equal(a.data, b.data)


# -- rules ------------------------------------------------------------------------------------

def test_state_meets_rule_phase_level_stage():
    state = caffe_pb2.NetState(phase=TEST, level=2, stage=["deploy", "big"])
    rule = caffe_pb2.NetStateRule
    assert state_meets_rule(state, rule(phase=TEST))
    assert not state_meets_rule(state, rule(phase=TRAIN))
    assert state_meets_rule(state, rule(min_level=2, max_level=2))
    assert not state_meets_rule(state, rule(min_level=3))
    assert not state_meets_rule(state, rule(max_level=1))
    assert state_meets_rule(state, rule(stage=["deploy", "big"]))
    assert not state_meets_rule(state, rule(stage=["deploy", "small"]))
    assert not state_meets_rule(state, rule(not_stage=["big"]))
    assert state_meets_rule(state, rule(not_stage=["small"]))


def test_filter_net_include_exclude_and_both_is_an_error():
    text = """
    layer { name: "a" type: "Input" top: "x" include { phase: TRAIN } }
    layer { name: "b" type: "Input" top: "x" include { phase: TEST } include { stage: "s" } }
    layer { name: "c" type: "Input" top: "y" exclude { phase: TEST } }
    layer { name: "d" type: "Input" top: "z" }
    """
    param = text_format.Parse(text, caffe_pb2.NetParameter())
    names = lambda st: [l.name for l in filter_net(param, st).layer]  # noqa: E731
    assert names(caffe_pb2.NetState(phase=TRAIN)) == ["a", "c", "d"]
    assert names(caffe_pb2.NetState(phase=TEST)) == ["b", "d"]
    assert names(caffe_pb2.NetState(phase=TRAIN, stage=["s"])) == ["a", "b", "c", "d"]
    param.layer[3].include.add(phase=TRAIN)
    param.layer[3].exclude.add(phase=TEST)
    with pytest.raises(NetError, match="'d'.*both include and exclude"):
        filter_net(param, caffe_pb2.NetState(phase=TRAIN))


def test_net_level_and_stages_select_layers():
    text = """
    layer { name: "in" type: "Input" top: "x" input_param { shape { dim: 2 dim: 3 } } }
    layer { name: "deep" type: "ReLU" bottom: "x" top: "y" include { min_level: 1 } }
    layer { name: "staged" type: "Sigmoid" bottom: "x" top: "z" include { stage: "extra" } }
    """
    assert net_from_text(text).layer_names == ["in"]
    assert net_from_text(text, level=1).layer_names == ["in", "deep"]
    assert net_from_text(text, stages=["extra"]).layer_names == ["in", "staged"]


def test_net_stages_join_the_prototxt_state():
    # Caffe's Net(file, phase, level, stages) adds the stages to those of the file's state
    text = """
    state { stage: "base" }
    layer { name: "in" type: "Input" top: "x" input_param { shape { dim: 2 dim: 3 } } }
    layer { name: "both" type: "ReLU" bottom: "x" top: "y"
            include { stage: "base" stage: "extra" } }
    layer { name: "base_only" type: "Sigmoid" bottom: "x" top: "z" include { stage: "base" } }
    """
    assert net_from_text(text).layer_names == ["in", "base_only"]
    net = net_from_text(text, stages=["extra"])
    assert [n for n in net.layer_names if "split" not in n] == ["in", "both", "base_only"]
    assert list(net.state.stage) == ["base", "extra"]


# -- splits, in-place, gradients of whole nets ---------------------------------------------

def test_insert_splits_names_and_loss_use():
    text = """
    layer { name: "data" type: "Input" top: "x" }
    layer { name: "a" type: "ReLU" bottom: "x" top: "a" }
    layer { name: "b" type: "Sigmoid" bottom: "x" top: "b" }
    layer { name: "c" type: "TanH" bottom: "a" top: "c" loss_weight: 2 }
    layer { name: "d" type: "AbsVal" bottom: "c" top: "d" }
    """
    out = insert_splits(text_format.Parse(text, caffe_pb2.NetParameter()))
    by_name = {l.name: l for l in out.layer}
    split = by_name["x_data_0_split"]
    assert list(split.top) == ["x_data_0_split_0", "x_data_0_split_1"]
    assert by_name["a"].bottom[0] == "x_data_0_split_0"
    assert by_name["b"].bottom[0] == "x_data_0_split_1"
    # a top with a loss weight that is also consumed: the loss takes the first split output
    csplit = by_name["c_c_0_split"]
    assert list(csplit.loss_weight) == [2, 0]
    assert by_name["d"].bottom[0] == "c_c_0_split_1"
    assert list(by_name["c"].loss_weight) == [0]


GRAPH = """
name: "graph"
force_backward: true
layer { name: "in" type: "Input" top: "x" top: "t"
        input_param { shape { dim: 3 dim: 4 } shape { dim: 3 dim: 5 } } }
layer { name: "fc_a" type: "InnerProduct" bottom: "x" top: "a"
        param { name: "shared_w" } param { name: "shared_b" lr_mult: 2 }
        inner_product_param { num_output: 5 weight_filler { type: "gaussian" std: 0.5 }
                              bias_filler { type: "gaussian" std: 0.5 } } }
layer { name: "fc_b" type: "InnerProduct" bottom: "x" top: "b"
        param { name: "shared_w" } param { name: "shared_b" }
        inner_product_param { num_output: 5 } }
layer { name: "tanh" type: "TanH" bottom: "a" top: "a" }
layer { name: "sig" type: "Sigmoid" bottom: "b" top: "s" }
layer { name: "prod" type: "Eltwise" bottom: "a" bottom: "s" top: "p"
        eltwise_param { operation: PROD } }
layer { name: "l1" type: "EuclideanLoss" bottom: "p" bottom: "t" top: "l1" }
layer { name: "l2" type: "EuclideanLoss" bottom: "a" bottom: "t" top: "l2" loss_weight: 0.5 }
"""


def test_whole_net_gradient_matches_finite_differences():
    """Splits, in-place layers, shared parameters and loss weights together: the gradient the
    net computes equals the numerical derivative of its total loss."""
    net = net_from_text(GRAPH)
    assert len(net.learnable_params) == 2           # two shared blobs, owned once
    assert net.params["fc_a"][0] is net.params["fc_b"][0]
    assert net.params_lr == [1.0, 2.0]
    rs = np.random.RandomState(3)
    net.blobs["x"].data[...] = rs.uniform(-1, 1, (3, 4))
    net.blobs["t"].data[...] = rs.uniform(-1, 1, (3, 5))
    net.clear_param_diffs()
    net.forward_backward()
    targets = [net.blobs["x"]] + net.learnable_params
    analytic = [b.diff.astype(np.float64).copy() for b in targets]
    h = 1e-2
    for blob, grad in zip(targets, analytic):
        flat = blob.data.reshape(-1)
        for j in range(flat.size):
            keep = flat[j]
            flat[j] = keep + h
            plus = net.forward_prefilled()
            flat[j] = keep - h
            minus = net.forward_prefilled()
            flat[j] = keep
            numeric = (plus - minus) / (2 * h)
            assert abs(numeric - grad.reshape(-1)[j]) <= 2e-2 * max(1, abs(numeric)), (blob, j)


def test_loss_is_weighted_sum_of_loss_tops():
    net = net_from_text(GRAPH)
    fill_inputs(net)
    loss = net.forward_prefilled()
    assert loss == pytest.approx(float(net.blobs["l1"].data) + 0.5 * float(net.blobs["l2"].data),
                                 rel=1e-6)
    assert net.blob_loss_weights["l1"] == 1 and net.blob_loss_weights["l2"] == 0.5


def test_backward_only_where_a_loss_depends():
    text = """
    layer { name: "in" type: "Input" top: "x" top: "label"
            input_param { shape { dim: 2 dim: 3 } shape { dim: 2 } } }
    layer { name: "frozen" type: "InnerProduct" bottom: "x" top: "f"
            param { lr_mult: 0 } param { lr_mult: 0 }
            inner_product_param { num_output: 4 weight_filler { type: "gaussian" std: 1 } } }
    layer { name: "fc" type: "InnerProduct" bottom: "f" top: "y" inner_product_param { num_output: 3 } }
    layer { name: "side" type: "InnerProduct" bottom: "f" top: "side" inner_product_param { num_output: 2 } }
    layer { name: "acc" type: "Accuracy" bottom: "y" bottom: "label" top: "acc" }
    layer { name: "loss" type: "SoftmaxWithLoss" bottom: "y" bottom: "label" top: "loss" }
    """
    net = net_from_text(text)
    need = dict(zip(net.layer_names, net.layer_need_backward))
    assert need["frozen"] is False          # lr_mult 0 and nothing below needs a gradient
    assert need["fc"] is True and need["loss"] is True
    assert need["side"] is False            # feeds no loss
    assert need["acc"] is False
    fill_inputs(net, classes=3)
    net.clear_param_diffs()
    net.forward_backward()
    assert not net.params["frozen"][0].diff.any()
    assert not net.params["side"][0].diff.any()
    assert net.params["fc"][0].diff.any()


def test_propagate_down_false_stops_the_gradient():
    text = GRAPH.replace('layer { name: "sig" type: "Sigmoid" bottom: "b" top: "s" }',
                         'layer { name: "sig" type: "Sigmoid" bottom: "b" top: "s" '
                         'propagate_down: false }').replace("force_backward: true", "")
    net = net_from_text(text)
    i = net.layer_names.index("sig")
    assert net.bottom_need_backward[i] == [False]
    with pytest.raises(NetError, match="propagate_down"):
        net_from_text(GRAPH.replace('top: "l1" }', 'top: "l1" propagate_down: true }'))


def test_force_backward_reaches_inputs():
    text = nets.lenet(batch=2)[0]
    plain = net_from_text(text)
    fill_inputs(plain)
    plain.forward_backward()
    assert not plain.blobs["data"].diff.any()
    forced = net_from_text("force_backward: true\n" + text)
    fill_inputs(forced)
    forced.forward_backward()
    assert forced.blobs["data"].diff.any()
    assert not forced.blobs["label"].diff.any()      # never toward labels


# -- errors -------------------------------------------------------------------------------

def test_errors_name_the_layer_and_blob():
    with pytest.raises(ValueError, match=r"Unknown layer type: 'Convolutionn'.*Known types:.*"
                                         r"Convolution"):
        net_from_text('layer { name: "c" type: "Convolutionn" }')
    with pytest.raises(NetError, match=r"Unknown bottom blob 'nope' \(layer 'r', bottom index 0\)"):
        net_from_text('layer { name: "r" type: "ReLU" bottom: "nope" top: "r" }')
    with pytest.raises(NetError, match=r"Top blob 'x' produced by multiple sources \(layer 'b'"):
        net_from_text('layer { name: "a" type: "Input" top: "x" input_param { shape { dim: 1 } } }'
                      'layer { name: "b" type: "Input" top: "x" input_param { shape { dim: 1 } } }')
    with pytest.raises(ValueError, match="'sum'"):
        net_from_text("""
        layer { name: "in" type: "Input" top: "a" top: "b"
                input_param { shape { dim: 2 dim: 3 } shape { dim: 2 dim: 4 } } }
        layer { name: "sum" type: "Eltwise" bottom: "a" bottom: "b" top: "c" }""")
    with pytest.raises(NetError, match="shape mismatch"):
        net_from_text("""
        layer { name: "in" type: "Input" top: "x" input_param { shape { dim: 2 dim: 3 } } }
        layer { name: "p" type: "InnerProduct" bottom: "x" top: "y" param { name: "w" }
                inner_product_param { num_output: 4 } }
        layer { name: "q" type: "InnerProduct" bottom: "x" top: "z" param { name: "w" }
                inner_product_param { num_output: 5 } }""")


def test_copy_from_reports_shape_mismatch(tmp_path):
    text = nets.lenet(batch=1)[0]
    net = net_from_text(text)
    model = tmp_path / "lenet.caffemodel"
    net.save(str(model))
    other = net_from_text(text.replace("num_output: 500", "num_output: 400"))
    with pytest.raises(NetError, match=r"^%s: Cannot copy param 0 weights from layer 'ip1'; "
                                       r"shape mismatch.*rename the layer" % re.escape(str(model))):
        other.copy_from(str(model))



def test_copy_from_legacy_blob_must_be_the_shape_padded_in_front():
    # a legacy num/channels/height/width blob fits a (2, 3) weight only as (1, 1, 2, 3)
    text = """
    layer { name: "in" type: "Input" top: "x" input_param { shape { dim: 1 dim: 3 } } }
    layer { name: "ip" type: "InnerProduct" bottom: "x" top: "y"
            inner_product_param { num_output: 2 bias_term: false } }"""
    net = net_from_text(text)
    values = np.arange(6, dtype=np.float32)

    def source(dims):
        src = caffe_pb2.NetParameter()
        blob = src.layer.add(name="ip").blobs.add()
        blob.num, blob.channels, blob.height, blob.width = dims
        blob.data.extend(values.tolist())
        return src

    net.copy_from(source((1, 1, 2, 3)))
    np.testing.assert_array_equal(net.params["ip"][0].data, values.reshape(2, 3))
    for dims in ((1, 1, 3, 2), (2, 3, 1, 1)):
        with pytest.raises(NetError, match="Cannot copy param 0 weights from layer 'ip'"):
            net.copy_from(source(dims))

# -- hooks for the distributed engine ----------------------------------------------------

def test_grad_ready_hook_sees_final_gradients_in_backward_order():
    net = net_from_text(GRAPH)
    fill_inputs(net)
    seen = []

    def ready(i):
        ids = net.learnable_params_final_at(i)
        seen.append((net.layer_names[i], ids, [net.learnable_params[k].diff.copy() for k in ids]))

    before = []
    net.set_grad_ready_hook(ready)
    net.set_before_forward_hook(lambda i: before.append(net.layer_names[i]))
    net.clear_param_diffs()
    net.forward_backward()
    # the shared blobs are complete only once the first layer that uses them is done
    assert [s[0] for s in seen] == ["fc_a"]
    assert seen[0][1] == [0, 1]
    for k, snapshot in zip(seen[0][1], seen[0][2]):
        np.testing.assert_array_equal(snapshot, net.learnable_params[k].diff)
    assert before == ["fc_a", "fc_b"]


# -- pycaffe's API --------------------------------------------------------------------------

def test_pycaffe_style_usage(tmp_path):
    import poseidon_caffe as caffe
    text, _, _ = nets.lenet(batch=2)
    deploy = tmp_path / "lenet.prototxt"
    deploy.write_text(text)
    net = caffe.Net(str(deploy), caffe.TEST)
    assert net.inputs == ["data", "label"]
    assert set(net.outputs) == {"loss", "loss_accuracy"}
    assert list(net.params) == ["conv1", "conv2", "ip1", "ip2"]
    assert net.params["conv1"][0].data.shape == (20, 1, 5, 5)
    assert net.blobs["conv1"].num == 2 and net.blobs["conv1"].channels == 20
    assert net.blobs["conv1"].height == 24 and net.blobs["conv1"].width == 24
    assert net.blobs["conv1"].count == 2 * 20 * 24 * 24
    assert net.layer_dict["conv1"].type == "Convolution"
    assert [l.type for l in net.layers][:2] == ["Input", "Split"]
    assert net.top_names["conv1"] == ["conv1"] and net.bottom_names["conv1"] == ["data"]
    x = np.random.RandomState(0).rand(2, 1, 28, 28).astype(np.float32)
    out = net.forward(data=x, label=np.array([3, 7]))
    assert set(out) == {"loss", "loss_accuracy"}
    np.testing.assert_array_equal(net.blobs["data"].data, x)
    probs = net.forward(blobs=["ip2"], start="conv1", end="ip2")["ip2"]
    assert probs.shape == (2, 10)
    # backward from the classifier with a chosen top diff reaches conv1 (force_backward off:
    # pycaffe returns the diffs of the start layer's bottoms only when they are computed)
    net.blobs["ip2"].diff[...] = 1
    diffs = net.backward(start="ip2", diffs=["conv1"])
    assert diffs["conv1"].shape == (2, 20, 24, 24)
    with pytest.raises(NetError, match="do not match net inputs"):
        net.forward(data=x)
    # reshape the input and the whole net follows
    net.blobs["data"].reshape(5, 1, 28, 28)
    net.blobs["label"].reshape(5)
    net.reshape()
    assert net.blobs["ip2"].shape == (5, 10)
    # forward_all over a ragged number of inputs
    net.blobs["data"].reshape(2, 1, 28, 28)
    net.blobs["label"].reshape(2)
    net.reshape()
    many = np.random.RandomState(1).rand(5, 1, 28, 28).astype(np.float32)
    res = net.forward_all(data=many, label=np.zeros(5), blobs=["ip2"])
    assert res["ip2"].shape == (5, 10)
    np.testing.assert_allclose(res["ip2"][4], net.forward(
        data=np.concatenate([many[4:], many[:1]]), label=np.zeros(2),
        blobs=["ip2"])["ip2"][0], rtol=1e-5)
    # sharing: a second net sees the first one's weights without a copy
    other = caffe.Net(str(deploy), caffe.TRAIN)
    other.share_with(net)
    net.params["ip2"][0].data[...] = 0.25
    assert np.all(other.params["ip2"][0].data == 0.25)
    other.params["ip2"][0].diff[...] = 1
    other.clear_param_diffs()
    assert not other.params["ip2"][0].diff.any()


def test_pycaffe_phase_argument_is_checked(tmp_path):
    import poseidon_caffe as caffe
    deploy = tmp_path / "lenet.prototxt"
    deploy.write_text(nets.lenet(batch=1)[0])
    weights = tmp_path / "lenet.caffemodel"
    caffe.Net(str(deploy), caffe.TRAIN).save(str(weights))
    # Net(file, weights) without a phase must not quietly pick TRAIN
    with pytest.raises(NetError, match="needs a phase after the weights"):
        caffe.Net(str(deploy), str(weights))
    with pytest.raises(NetError, match="caffe.TRAIN or caffe.TEST, not 'test'"):
        caffe.Net(str(deploy), str(weights), "test")
    with pytest.raises(NetError, match="caffe.TRAIN or caffe.TEST, not 2"):
        caffe.Net(str(deploy), 2)
    net = caffe.Net(str(deploy), str(weights), caffe.TEST)
    assert net.phase == caffe.TEST and net.state.level == 0


def test_debug_info_logs_forward_and_backward(caplog):
    text = "debug_info: true\n" + nets.lenet(batch=1)[0]
    net = net_from_text(text)
    fill_inputs(net)
    logger = logging.getLogger("poseidon_caffe")
    logger.propagate = True
    try:
        with caplog.at_level(logging.INFO, logger="poseidon_caffe"):
            net.forward_backward()
    finally:
        logger.propagate = False
    text = caplog.text
    assert "[Forward] Layer conv1, top blob conv1 data:" in text
    assert "[Forward] Layer conv1, param blob 0 data:" in text
    assert "[Backward] Layer ip2, param blob 0 diff:" in text
    assert "[Backward] All net params (data, diff): L1 norm" in text


def test_backward_keeps_a_loss_diff_the_caller_gives():
    """pycaffe's net.backward(loss=...) seeds the loss top with the caller's value, as Caffe
    does; without it the loss weight is the seed. The gradient scales with the seed."""
    net = net_from_text(GRAPH.replace('loss_weight: 0.5', 'loss_weight: 0'))
    fill_inputs(net)
    net.forward()
    net.clear_param_diffs()
    plain = net.backward(l1=np.float32(1), l2=np.float32(0))["x"].copy()
    net.clear_param_diffs()
    tripled = net.backward(l1=np.float32(3), l2=np.float32(0))["x"].copy()
    np.testing.assert_allclose(tripled, 3 * plain, rtol=1e-5)
    net.clear_param_diffs()
    net.backward_from_to()
    np.testing.assert_allclose(net.blobs["x"].diff, plain, rtol=1e-5)


def test_layer_timing_hook_sees_every_forward_and_needed_backward():
    net = net_from_text(GRAPH)
    fill_inputs(net)
    seen = []
    net.set_layer_timing_hook(lambda kind, i, t0, t1: seen.append((kind, net.layer_names[i],
                                                                   t1 >= t0)))
    net.forward_backward()
    forward = [name for kind, name, _ in seen if kind == "forward"]
    backward = [name for kind, name, _ in seen if kind == "backward"]
    assert forward == net.layer_names
    assert backward == [n for n, need in reversed(list(zip(net.layer_names,
                                                           net.layer_need_backward))) if need]
    assert all(ok for _, _, ok in seen)
    net.set_layer_timing_hook(None)
    seen.clear()
    net.forward_backward()
    assert seen == []


def test_outputs_come_by_blob_name_and_inputs_by_layer_order(caplog):
    # Caffe gathers the blobs left over in a std::set<string>: the outputs are sorted by
    # name, whatever order the layers make them in; Input tops are inputs in layer order
    text = """
    layer { name: "in2" type: "Input" top: "zz_in" input_param { shape { dim: 1 dim: 2 } } }
    layer { name: "in1" type: "Input" top: "aa_in" input_param { shape { dim: 1 dim: 2 } } }
    layer { name: "z" type: "Power" bottom: "zz_in" top: "zeta" }
    layer { name: "m" type: "Power" bottom: "aa_in" top: "Mu" }
    layer { name: "a" type: "Power" bottom: "zz_in" top: "alpha" }
    layer { name: "u" type: "Power" bottom: "aa_in" top: "_under" }
    """
    with caplog.at_level(logging.INFO, logger="poseidon_caffe"):
        net = net_from_text(text, caffe_pb2.TEST)
    assert net.inputs == ["zz_in", "aa_in"]
    assert net.outputs == ["Mu", "_under", "alpha", "zeta"]       # bytewise: upper, _, lower
    produced = re.findall(r"This network produces output (\S+)", caplog.text)
    assert produced == ["Mu", "_under", "alpha", "zeta"]
