"""Loss layers, Softmax and Accuracy: hand-worked values and finite-difference gradients."""
import math

import numpy as np
import pytest

from gradcheck import blob_from, check_gradient, make_layer, run_layer
from poseidon_caffe.blob import Blob
from poseidon_caffe.layers import LayerError


def backward_diff(layer, bottoms, top, weight=1.0):
    top[0].diff[...] = weight
    layer.backward(top, [True] + [False] * (len(bottoms) - 1), bottoms)
    return bottoms[0].diff.copy()


def swl(extra=""):
    return make_layer('name: "loss" type: "SoftmaxWithLoss" %s' % extra)


# -- SoftmaxWithLoss ---------------------------------------------------------------------------
def test_softmax_with_loss_hand_worked_2x3():
    # row 0: x = (1, 2, 3), label 2: -log p = log(1 + e^-1 + e^-2) = log(1.50321472) = 0.40760596
    # row 1: x = (1, 1, 1), label 0: -log(1/3) = 1.09861229; VALID divides by 2 labels
    x = blob_from([[1, 2, 3], [1, 1, 1]])
    y = blob_from([2, 0])
    layer = swl()
    top = run_layer(layer, [x, y], 2)
    assert top[0].shape == ()
    assert float(top[0].data) == pytest.approx((0.40760596 + 1.09861229) / 2, rel=1e-6)
    p0 = np.array([0.09003057, 0.24472847, 0.66524096])
    np.testing.assert_allclose(top[1].data, [p0, [1 / 3.] * 3], rtol=1e-6)
    grad = backward_diff(layer, [x, y], top, weight=2.0)   # loss weight 2 cancels the 1/2
    np.testing.assert_allclose(grad, [p0 - [0, 0, 1], [1 / 3. - 1, 1 / 3., 1 / 3.]], atol=1e-6)


@pytest.mark.parametrize("mode,divisor", [("FULL", 6), ("VALID", 4), ("BATCH_SIZE", 2),
                                          ("NONE", 1)])
def test_softmax_with_loss_normalization_and_ignore(mode, divisor):
    # 2 x 3 classes x 3 positions along the last axis; label 7 is ignored at two positions
    rs = np.random.RandomState(3)
    x = rs.randn(2, 3, 3).astype(np.float32)
    labels = np.array([[0, 7, 2], [1, 1, 7]], dtype=np.float32)
    layer = swl("loss_param { ignore_label: 7 normalization: %s }" % mode)
    top = run_layer(layer, [blob_from(x), blob_from(labels)])
    total = 0.0
    for n in range(2):
        for s in range(3):
            if labels[n, s] == 7:
                continue
            col = x[n, :, s].astype(np.float64)
            total -= col[int(labels[n, s])] - math.log(np.exp(col).sum())
    assert float(top[0].data) == pytest.approx(total / divisor, rel=1e-5)


@pytest.mark.parametrize("normalize,divisor", [("true", 3), ("false", 2)])
def test_softmax_with_loss_legacy_normalize(normalize, divisor):
    x = np.zeros((2, 4, 2), np.float32)          # uniform: every label costs log 4
    labels = np.array([[0, 1], [2, 5]], np.float32)
    layer = swl("loss_param { ignore_label: 5 normalize: %s }" % normalize)
    top = run_layer(layer, [blob_from(x), blob_from(labels)])
    assert float(top[0].data) == pytest.approx(3 * math.log(4) / divisor, rel=1e-6)


def test_softmax_with_loss_all_ignored_is_zero_not_nan():
    layer = swl("loss_param { ignore_label: 1 }")
    top = run_layer(layer, [blob_from(np.ones((2, 3))), blob_from([1, 1])])
    assert float(top[0].data) == 0.0


@pytest.mark.parametrize("extra,labels", [
    ("", [[0, 2, 1], [1, 1, 0]]),
    ("loss_param { ignore_label: 1 }", [[0, 2, 1], [1, 1, 0]]),
    ("loss_param { normalization: FULL ignore_label: 0 }", [[0, 2, 1], [1, 1, 0]]),
    ("loss_param { normalization: BATCH_SIZE }", [[0, 2, 1], [1, 1, 0]]),
    ("loss_param { normalization: NONE }", [[0, 2, 1], [1, 1, 0]]),
])
def test_softmax_with_loss_gradient_axis1(extra, labels):
    rs = np.random.RandomState(0)
    x = blob_from(rs.randn(2, 3, 3))
    check_gradient(swl(extra), [x, blob_from(labels)], [Blob()], check_bottom=[0])


def test_softmax_with_loss_gradient_last_axis():
    rs = np.random.RandomState(1)
    x = blob_from(rs.randn(3, 2, 4))
    labels = blob_from(rs.randint(0, 4, size=(3, 2)))
    check_gradient(swl("softmax_param { axis: -1 }"), [x, labels], [Blob()], check_bottom=[0])


def test_softmax_with_loss_label_count_error():
    with pytest.raises(LayerError, match="Number of labels must match"):
        run_layer(swl(), [blob_from(np.zeros((2, 3, 2))), blob_from([0, 1])])


def test_softmax_with_loss_label_out_of_range():
    with pytest.raises(LayerError, match="out of range"):
        run_layer(swl(), [blob_from(np.zeros((2, 3))), blob_from([0, 3])])


def test_softmax_with_loss_refuses_label_gradient():
    x, y = blob_from(np.zeros((2, 3))), blob_from([0, 1])
    layer = swl()
    top = run_layer(layer, [x, y])
    with pytest.raises(LayerError, match="label"):
        layer.backward(top, [True, True], [x, y])


# -- Softmax -----------------------------------------------------------------------------------
def test_softmax_values_sum_to_one_along_axis():
    rs = np.random.RandomState(2)
    x = rs.randn(2, 3, 4).astype(np.float32) * 10
    top = run_layer(make_layer('name: "s" type: "Softmax" softmax_param { axis: 2 }'),
                    [blob_from(x)])
    e = np.exp(x.astype(np.float64) - x.max(axis=2, keepdims=True))
    np.testing.assert_allclose(top[0].data, e / e.sum(axis=2, keepdims=True), rtol=1e-5)


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_softmax_gradient(axis):
    rs = np.random.RandomState(4)
    layer = make_layer('name: "s" type: "Softmax" softmax_param { axis: %d }' % axis)
    check_gradient(layer, [blob_from(rs.randn(2, 3, 2))], [Blob()])


# -- Accuracy ----------------------------------------------------------------------------------
def acc(extra=""):
    return make_layer('name: "acc" type: "Accuracy" %s' % extra)


SCORES = [[0.1, 0.5, 0.3, 0.1],    # label 1: rank 1
          [0.4, 0.3, 0.2, 0.1],    # label 2: rank 3
          [0.2, 0.2, 0.5, 0.1],    # label 1: ties with 0, behind 2 -> counts as rank 3
          [0.7, 0.1, 0.1, 0.1]]    # label 0: rank 1


def test_accuracy_top1_top2_top3():
    labels = [1, 2, 1, 0]
    assert float(run_layer(acc(), [blob_from(SCORES), blob_from(labels)])[0].data) == 0.5
    top2 = run_layer(acc("accuracy_param { top_k: 2 }"), [blob_from(SCORES), blob_from(labels)])
    assert float(top2[0].data) == 0.5       # the tie at row 2 is counted against the label
    top3 = run_layer(acc("accuracy_param { top_k: 3 }"), [blob_from(SCORES), blob_from(labels)])
    assert float(top3[0].data) == 1.0


def test_accuracy_per_class_and_ignore():
    labels = [1, 2, 1, 0]
    top = run_layer(acc(), [blob_from(SCORES), blob_from(labels)], 2)
    np.testing.assert_allclose(top[1].data, [1.0, 0.5, 0.0, 0.0])
    assert top[1].shape == (4,)
    ignored = run_layer(acc("accuracy_param { ignore_label: 2 }"),
                        [blob_from(SCORES), blob_from(labels)], 2)
    assert float(ignored[0].data) == pytest.approx(2 / 3.)
    np.testing.assert_allclose(ignored[1].data, [1.0, 0.5, 0.0, 0.0])


def test_accuracy_spatial_axis():
    # N=1, C=2, two positions; label along axis 1
    scores = np.array([[[0.9, 0.2], [0.1, 0.8]]], np.float32)
    top = run_layer(acc(), [blob_from(scores), blob_from([[0, 0]])])
    assert float(top[0].data) == 0.5


def test_accuracy_top_k_too_large():
    with pytest.raises(LayerError, match="top_k"):
        run_layer(acc("accuracy_param { top_k: 5 }"), [blob_from(SCORES), blob_from([0, 0, 0, 0])])


def test_accuracy_has_no_backward_and_no_loss_weight():
    layer = acc()
    assert not layer.has_backward()
    assert layer.default_loss_weight(0) == 0.0


# -- EuclideanLoss, HingeLoss ------------------------------------------------------------------
def test_euclidean_value_and_gradient():
    a = blob_from([[1, 2], [3, 4]])
    b = blob_from([[0, 0], [3, 2]])
    top = run_layer(make_layer('name: "e" type: "EuclideanLoss"'), [a, b])
    assert float(top[0].data) == pytest.approx((1 + 4 + 0 + 4) / 2 / 2)
    rs = np.random.RandomState(5)
    layer = make_layer('name: "e" type: "EuclideanLoss"')
    assert layer.allow_force_backward(1)
    check_gradient(layer, [blob_from(rs.randn(3, 4)), blob_from(rs.randn(3, 4))], [Blob()])


def test_hinge_l1_value():
    x = blob_from([[0.5, -2.0, 0.3], [2.0, 0.0, -0.5]])
    # row 0, label 0: max(0, 1-0.5) + max(0, 1-2) + max(0, 1+0.3) = 0.5 + 0 + 1.3
    # row 1, label 1: max(0, 1+2) + max(0, 1-0) + max(0, 1-0.5) = 3 + 1 + 0.5
    top = run_layer(make_layer('name: "h" type: "HingeLoss"'), [x, blob_from([0, 1])])
    assert float(top[0].data) == pytest.approx((1.8 + 4.5) / 2, rel=1e-6)
    l2 = run_layer(make_layer('name: "h" type: "HingeLoss" hinge_loss_param { norm: L2 }'),
                   [x, blob_from([0, 1])])
    assert float(l2[0].data) == pytest.approx((0.25 + 1.69 + 9 + 1 + 0.25) / 2, rel=1e-6)


@pytest.mark.parametrize("norm", ["L1", "L2"])
def test_hinge_gradient(norm):
    rs = np.random.RandomState(6)
    x = rs.randn(4, 5).astype(np.float32)
    layer = make_layer('name: "h" type: "HingeLoss" hinge_loss_param { norm: %s }' % norm)
    # the kink of max(0, 1 -+ x) sits at x = +-1; keep samples clear of both
    x[np.abs(np.abs(x) - 1) < 0.05] += 0.2
    check_gradient(layer, [blob_from(x), blob_from(rs.randint(0, 5, 4))], [Blob()],
                   check_bottom=[0])


# -- ContrastiveLoss ---------------------------------------------------------------------------
def test_contrastive_value_both_versions():
    a = blob_from([[0, 0], [0, 0], [1, 0]])
    b = blob_from([[3, 4], [0.3, 0.4], [1, 0.5]])
    sim = blob_from([1, 0, 0])
    # d = 5, 0.5, 0.5; similar pair costs d^2 = 25; margin 2
    new = run_layer(make_layer('name: "c" type: "ContrastiveLoss" '
                               'contrastive_loss_param { margin: 2 }'), [a, b, sim])
    assert float(new[0].data) == pytest.approx((25 + 1.5 ** 2 + 1.5 ** 2) / 3 / 2, rel=1e-6)
    old = run_layer(make_layer('name: "c" type: "ContrastiveLoss" '
                               'contrastive_loss_param { margin: 2 legacy_version: true }'),
                    [a, b, sim])
    assert float(old[0].data) == pytest.approx((25 + 1.75 + 1.75) / 3 / 2, rel=1e-6)


@pytest.mark.parametrize("legacy", ["false", "true"])
def test_contrastive_gradient(legacy):
    rs = np.random.RandomState(7)
    a, b = rs.uniform(-0.5, 0.5, (6, 3)), rs.uniform(-0.5, 0.5, (6, 3))
    sim = np.array([1, 0, 1, 0, 0, 1])
    layer = make_layer('name: "c" type: "ContrastiveLoss" contrastive_loss_param '
                       '{ margin: 1.5 legacy_version: %s }' % legacy)
    assert not layer.allow_force_backward(2)
    check_gradient(layer, [blob_from(a), blob_from(b), blob_from(sim)], [Blob()],
                   check_bottom=[0, 1])


# -- InfogainLoss ------------------------------------------------------------------------------
H = np.array([[1.0, 0.5, 0.0], [0.2, 1.0, 0.1], [0.0, 0.3, 2.0]], np.float32)


def test_infogain_identity_equals_softmax_loss():
    rs = np.random.RandomState(8)
    x, y = rs.randn(4, 3), rs.randint(0, 3, 4)
    info = run_layer(make_layer('name: "i" type: "InfogainLoss"'),
                     [blob_from(x), blob_from(y), blob_from(np.eye(3))])
    soft = run_layer(swl(), [blob_from(x), blob_from(y)])
    assert float(info[0].data) == pytest.approx(float(soft[0].data), rel=1e-5)


def test_infogain_value_with_matrix():
    x = np.array([[0.0, 1.0, 2.0], [1.0, 0.0, 0.0]], np.float32)
    y = [2, 0]
    top = run_layer(make_layer('name: "i" type: "InfogainLoss"'),
                    [blob_from(x), blob_from(y), blob_from(H)], 2)
    expected = 0.0
    for n, label in enumerate(y):
        p = np.exp(x[n].astype(np.float64))
        p /= p.sum()
        expected -= (H[label] * np.log(p)).sum()
    assert float(top[0].data) == pytest.approx(expected / 2, rel=1e-5)
    assert top[1].shape == (2, 3)


@pytest.mark.parametrize("extra", ["", "loss_param { ignore_label: 1 normalization: FULL }",
                                   "infogain_loss_param { axis: 2 }"])
def test_infogain_gradient(extra):
    rs = np.random.RandomState(9)
    if "axis: 2" in extra:
        x, y = rs.randn(2, 2, 3), rs.randint(0, 3, (2, 2))
    else:
        x, y = rs.randn(2, 3, 2), rs.randint(0, 3, (2, 2))
    layer = make_layer('name: "i" type: "InfogainLoss" %s' % extra)
    check_gradient(layer, [blob_from(x), blob_from(y), blob_from(H)], [Blob()], check_bottom=[0])


def test_infogain_matrix_from_binaryproto(tmp_path):
    from poseidon_caffe.proto import caffe_pb2
    bp = caffe_pb2.BlobProto()
    bp.shape.dim.extend([1, 1, 3, 3])
    bp.data.extend(H.ravel().tolist())
    path = tmp_path / "h.binaryproto"
    path.write_bytes(bp.SerializeToString())
    x, y = np.array([[0.0, 1.0, 2.0], [1.0, 0.0, 0.0]], np.float32), [2, 0]
    from_file = run_layer(make_layer('name: "i" type: "InfogainLoss" infogain_loss_param '
                                     '{ source: "%s" }' % path), [blob_from(x), blob_from(y)])
    from_bottom = run_layer(make_layer('name: "i" type: "InfogainLoss"'),
                            [blob_from(x), blob_from(y), blob_from(H)])
    assert float(from_file[0].data) == pytest.approx(float(from_bottom[0].data), rel=1e-6)


def test_infogain_wrong_matrix_size():
    with pytest.raises(LayerError, match="3 x 3"):
        run_layer(make_layer('name: "i" type: "InfogainLoss"'),
                  [blob_from(np.zeros((2, 3))), blob_from([0, 1]), blob_from(np.eye(2))])


def test_infogain_needs_a_source():
    with pytest.raises(LayerError, match="source"):
        run_layer(make_layer('name: "i" type: "InfogainLoss"'),
                  [blob_from(np.zeros((2, 3))), blob_from([0, 1])])


# -- MultinomialLogisticLoss -------------------------------------------------------------------
def test_multinomial_logistic_value_and_gradient():
    p = blob_from([[0.2, 0.8], [0.6, 0.4]])
    top = run_layer(make_layer('name: "m" type: "MultinomialLogisticLoss"'), [p, blob_from([1, 0])])
    assert float(top[0].data) == pytest.approx(-(math.log(0.8) + math.log(0.6)) / 2, rel=1e-6)
    rs = np.random.RandomState(10)
    probs = rs.uniform(0.2, 1.0, (3, 4))
    check_gradient(make_layer('name: "m" type: "MultinomialLogisticLoss"'),
                   [blob_from(probs), blob_from([0, 3, 1])], [Blob()], check_bottom=[0],
                   stepsize=1e-3)


# -- SigmoidCrossEntropyLoss -------------------------------------------------------------------
def sce_reference(x, t, ignore=None):
    x, t = np.asarray(x, np.float64).ravel(), np.asarray(t, np.float64).ravel()
    s = 1 / (1 + np.exp(-x))
    loss = -(t * np.log(s) + (1 - t) * np.log(1 - s))
    keep = np.ones_like(x, bool) if ignore is None else t != ignore
    return loss[keep].sum(), keep.sum()


def test_sigmoid_cross_entropy_defaults_to_batch_size():
    x = [[0.5, -1.0, 2.0], [0.0, 3.0, -0.2]]
    t = [[1, 0, 1], [0, 1, 1]]
    top = run_layer(make_layer('name: "s" type: "SigmoidCrossEntropyLoss"'),
                    [blob_from(x), blob_from(t)])
    total, _ = sce_reference(x, t)
    assert float(top[0].data) == pytest.approx(total / 2, rel=1e-5)


def test_sigmoid_cross_entropy_ignore_and_valid():
    x = [[0.5, -1.0, 2.0], [0.0, 3.0, -0.2]]
    t = [[1, -1, 1], [0, 1, -1]]
    layer = make_layer('name: "s" type: "SigmoidCrossEntropyLoss" '
                       'loss_param { ignore_label: -1 normalization: VALID }')
    top = run_layer(layer, [blob_from(x), blob_from(t)])
    total, count = sce_reference(x, t, ignore=-1)
    assert count == 4
    assert float(top[0].data) == pytest.approx(total / 4, rel=1e-5)


def test_sigmoid_cross_entropy_large_inputs_stay_finite():
    top = run_layer(make_layer('name: "s" type: "SigmoidCrossEntropyLoss"'),
                    [blob_from([[100.0, -100.0]]), blob_from([[0, 1]])])
    assert float(top[0].data) == pytest.approx(200.0, rel=1e-5)


@pytest.mark.parametrize("extra", ["", "loss_param { ignore_label: -1 normalization: VALID }",
                                   "loss_param { normalization: FULL }",
                                   "loss_param { normalize: true }"])
def test_sigmoid_cross_entropy_gradient(extra):
    rs = np.random.RandomState(11)
    x = rs.randn(3, 4) * 2
    t = rs.uniform(0, 1, (3, 4))
    t[0, 1] = t[2, 3] = -1
    layer = make_layer('name: "s" type: "SigmoidCrossEntropyLoss" %s' % extra)
    check_gradient(layer, [blob_from(x), blob_from(t)], [Blob()], check_bottom=[0])
