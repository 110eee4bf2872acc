"""RNN, LSTM and LSTMUnit: Caffe's blob lists and shapes, forward values against per-stream
reference loops written here, carried state, and finite-difference gradients."""
import logging

import numpy as np
import pytest

from gradcheck import blob_from, check_gradient, make_layer, run_layer
from poseidon_caffe import rng
from poseidon_caffe.blob import Blob
from poseidon_caffe.layers import LayerError
from poseidon_caffe.log import logger

T, N, K, H, KS = 3, 2, 3, 4, 5
FILLERS = ('weight_filler { type: "uniform" min: -0.6 max: 0.6 } '
           'bias_filler { type: "uniform" min: -0.4 max: 0.4 }')
# a new sequence starts at t = 0 for both streams and again at t = 2 for stream 1
CONT_RESET_MID = [[0, 0], [1, 1], [1, 0]]


@pytest.fixture(autouse=True)
def seeded():
    rng.set_random_seed(11)


def recurrent(kind, extra=""):
    return make_layer('name: "%s" type: "%s" recurrent_param { num_output: %d %s %s }'
                      % (kind.lower(), kind, H, FILLERS, extra))


def uniform(shape, seed, scale=1.0):
    return np.random.RandomState(seed).uniform(-scale, scale, shape)


def bottoms(cont=CONT_RESET_MID, static=False, hidden_states=0):
    blobs = [blob_from(uniform((T, N, K), 1)), blob_from(cont)]
    if static:
        blobs.append(blob_from(uniform((N, KS), 2)))
    for j in range(hidden_states):
        blobs.append(blob_from(uniform((1, N, H), 3 + j, 0.8)))
    return blobs


def sigmoid(z):
    return 1.0 / (1.0 + np.exp(-z))


# -- references: one stream and one step at a time, straight from the formulas ----------------

def reference_rnn(params, x, cont, h0, xs=None):
    if xs is None:
        w_xh, b_h, w_hh, w_ho, b_o = params
    else:
        w_xh, b_h, w_xs, w_hh, w_ho, b_o = params
    o = np.zeros((T, N, H))
    h = h0.astype(np.float64).copy()
    for t in range(T):
        for n in range(N):
            a = w_hh @ (cont[t][n] * h[n]) + w_xh @ x[t, n] + b_h
            if xs is not None:
                a = a + w_xs @ xs[n]
            h[n] = np.tanh(a)
            o[t, n] = np.tanh(w_ho @ h[n] + b_o)
    return o, h


def reference_lstm(params, x, cont, h0, c0, xs=None):
    if xs is None:
        w_xc, b_c, w_hc = params
    else:
        w_xc, b_c, w_xs, w_hc = params
    out = np.zeros((T, N, H))
    h, c = h0.astype(np.float64).copy(), c0.astype(np.float64).copy()
    for t in range(T):
        for n in range(N):
            gates = w_hc @ (cont[t][n] * h[n]) + w_xc @ x[t, n] + b_c
            if xs is not None:
                gates = gates + w_xs @ xs[n]
            i, f, o = sigmoid(gates[:H]), sigmoid(gates[H:2 * H]), sigmoid(gates[2 * H:3 * H])
            g = np.tanh(gates[3 * H:])
            c[n] = cont[t][n] * f * c[n] + i * g
            h[n] = o * np.tanh(c[n])
            out[t, n] = h[n]
    return out, h, c


def params_of(layer):
    return [b.data.astype(np.float64) for b in layer.blobs]


# -- blob lists and shapes, as Caffe's unrolled nets own them ----------------------------------

def test_rnn_blobs_in_caffe_order_and_shapes():
    layer = recurrent("RNN")
    top = run_layer(layer, bottoms())
    assert [b.shape for b in layer.blobs] == [(H, K), (H,), (H, H), (H, H), (H,)]
    assert top[0].shape == (T, N, H)
    layer = recurrent("RNN")
    run_layer(layer, bottoms(static=True))
    assert [b.shape for b in layer.blobs] == [(H, K), (H,), (H, KS), (H, H), (H, H), (H,)]


def test_lstm_blobs_in_caffe_order_and_shapes():
    layer = recurrent("LSTM")
    top = run_layer(layer, bottoms())
    assert [b.shape for b in layer.blobs] == [(4 * H, K), (4 * H,), (4 * H, H)]
    assert top[0].shape == (T, N, H)
    layer = recurrent("LSTM", "expose_hidden: true")
    top = run_layer(layer, bottoms(static=True, hidden_states=2), ntops=3)
    assert [b.shape for b in layer.blobs] == [(4 * H, K), (4 * H,), (4 * H, KS), (4 * H, H)]
    assert [t.shape for t in top] == [(T, N, H), (1, N, H), (1, N, H)]


def test_features_beyond_axis_two_are_flattened():
    layer = recurrent("LSTM")
    x = blob_from(uniform((T, N, 2, 3), 4))
    top = run_layer(layer, [x, blob_from(CONT_RESET_MID)])
    assert layer.blobs[0].shape == (4 * H, 6)
    want, _, _ = reference_lstm(params_of(layer), x.data.reshape(T, N, 6), CONT_RESET_MID,
                                np.zeros((N, H)), np.zeros((N, H)))
    np.testing.assert_allclose(top[0].data, want, rtol=1e-5, atol=1e-6)


def test_fillers_apply_to_weights_and_biases():
    layer = make_layer('name: "r" type: "RNN" recurrent_param { num_output: 4 '
                       'weight_filler { type: "constant" value: 0.25 } '
                       'bias_filler { type: "constant" value: -1 } }')
    run_layer(layer, bottoms())
    for blob in (layer.blobs[0], layer.blobs[2], layer.blobs[3]):
        assert np.all(blob.data == 0.25)
    for blob in (layer.blobs[1], layer.blobs[4]):
        assert np.all(blob.data == -1)


# -- forward values -----------------------------------------------------------------------------

def test_one_rnn_step_by_hand():
    layer = make_layer('name: "r" type: "RNN" recurrent_param { num_output: 2 }')
    x = blob_from([[[1.0, -2.0]]])          # T = 1, N = 1, two features
    run_layer(layer, [x, blob_from([[0]])])
    w_xh, b_h, w_hh, w_ho, b_o = layer.blobs
    w_xh.data[...] = [[0.5, 0.25], [-1.0, 0.0]]
    b_h.data[...] = [0.1, 0.2]
    w_hh.data[...] = [[9.0, 9.0], [9.0, 9.0]]     # multiplied by h_0 = 0
    w_ho.data[...] = [[1.0, 2.0], [0.0, -1.0]]
    b_o.data[...] = [0.0, 0.5]
    top = [Blob()]
    layer.reshape([x, blob_from([[0]])], top)
    layer.forward([x, blob_from([[0]])], top)
    h = np.tanh([0.5 - 0.5 + 0.1, -1.0 + 0.2])
    want = np.tanh([h[0] + 2 * h[1], -h[1] + 0.5])
    np.testing.assert_allclose(top[0].data.ravel(), want, rtol=1e-6)


def test_rnn_forward_matches_reference_with_resets_and_static_input():
    layer = recurrent("RNN")
    bottom = bottoms(static=True)
    top = run_layer(layer, bottom)
    want, _ = reference_rnn(params_of(layer), bottom[0].data, CONT_RESET_MID,
                            np.zeros((N, H)), bottom[2].data)
    np.testing.assert_allclose(top[0].data, want, rtol=1e-5, atol=1e-6)


def test_lstm_forward_matches_reference_with_resets_and_static_input():
    layer = recurrent("LSTM")
    bottom = bottoms(static=True)
    top = run_layer(layer, bottom)
    want, _, _ = reference_lstm(params_of(layer), bottom[0].data, CONT_RESET_MID,
                                np.zeros((N, H)), np.zeros((N, H)), bottom[2].data)
    np.testing.assert_allclose(top[0].data, want, rtol=1e-5, atol=1e-6)


def test_exposed_hidden_state_is_used_and_returned():
    cont = [[1, 1], [1, 0], [1, 1]]
    layer = recurrent("LSTM", "expose_hidden: true")
    bottom = bottoms(cont=cont, hidden_states=2)
    top = run_layer(layer, bottom, ntops=3)
    want, h_T, c_T = reference_lstm(params_of(layer), bottom[0].data, cont,
                                    bottom[2].data[0], bottom[3].data[0])
    np.testing.assert_allclose(top[0].data, want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(top[1].data[0], h_T, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(top[2].data[0], c_T, rtol=1e-5, atol=1e-6)

    layer = recurrent("RNN", "expose_hidden: true")
    bottom = bottoms(cont=cont, static=True, hidden_states=1)
    top = run_layer(layer, bottom, ntops=2)
    want, h_T = reference_rnn(params_of(layer), bottom[0].data, cont, bottom[3].data[0],
                              bottom[2].data)
    np.testing.assert_allclose(top[0].data, want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(top[1].data[0], h_T, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("kind", ["RNN", "LSTM"])
def test_state_carries_to_the_next_forward_until_a_reset(kind):
    cont = [[1, 1], [1, 1], [1, 1]]
    layer = recurrent(kind)
    bottom = bottoms(cont=cont)
    first = run_layer(layer, bottom)[0].data.copy()
    top = [Blob()]
    layer.reshape(bottom, top)
    layer.forward(bottom, top)
    params, x = params_of(layer), bottom[0].data
    if kind == "RNN":
        want_first, h = reference_rnn(params, x, cont, np.zeros((N, H)))
        want_second, _ = reference_rnn(params, x, cont, h)
    else:
        want_first, h, c = reference_lstm(params, x, cont, np.zeros((N, H)), np.zeros((N, H)))
        want_second, _, _ = reference_lstm(params, x, cont, h, c)
    np.testing.assert_allclose(first, want_first, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(top[0].data, want_second, rtol=1e-5, atol=1e-6)
    assert not np.allclose(first, top[0].data)
    layer.reset()
    layer.forward(bottom, top)
    np.testing.assert_allclose(top[0].data, first, rtol=1e-6)


def test_cont_zero_at_the_start_forgets_the_carried_state():
    layer = recurrent("LSTM")
    bottom = bottoms()                      # cont[0] = 0 for every stream
    first = run_layer(layer, bottom)[0].data.copy()
    top = [Blob()]
    layer.reshape(bottom, top)
    layer.forward(bottom, top)
    np.testing.assert_allclose(top[0].data, first, rtol=1e-6)


def test_lstm_unit_forward_by_hand():
    layer = make_layer('name: "u" type: "LSTMUnit"')
    c_prev = np.array([[[0.5, -1.0], [2.0, 0.3]]])
    gates = uniform((1, 2, 8), 7, 2.0)
    cont = np.array([[1.0, 0.0]])
    top = run_layer(layer, [blob_from(c_prev), blob_from(gates), blob_from(cont)], ntops=2)
    for n in range(2):
        z = gates[0, n]
        i, f, o, g = sigmoid(z[0:2]), sigmoid(z[2:4]), sigmoid(z[4:6]), np.tanh(z[6:8])
        c = cont[0, n] * f * c_prev[0, n] + i * g
        np.testing.assert_allclose(top[0].data[0, n], c, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(top[1].data[0, n], o * np.tanh(c), rtol=1e-5, atol=1e-6)


# -- gradients ------------------------------------------------------------------------------

def test_rnn_gradient_with_reset_mid_sequence():
    check_gradient(recurrent("RNN"), bottoms(), [Blob()], check_bottom=[0])


def test_rnn_gradient_with_static_input():
    check_gradient(recurrent("RNN"), bottoms(static=True), [Blob()], check_bottom=[0, 2])


def test_rnn_gradient_with_exposed_hidden_state():
    bottom = bottoms(cont=[[1, 1], [1, 0], [1, 1]], hidden_states=1)
    check_gradient(recurrent("RNN", "expose_hidden: true"), bottom, [Blob(), Blob()],
                   check_bottom=[0, 2])


def test_lstm_gradient_with_reset_mid_sequence():
    check_gradient(recurrent("LSTM"), bottoms(), [Blob()], check_bottom=[0])


def test_lstm_gradient_with_static_input():
    check_gradient(recurrent("LSTM"), bottoms(static=True), [Blob()], check_bottom=[0, 2])


def test_lstm_gradient_with_exposed_hidden_and_cell_state():
    bottom = bottoms(cont=[[1, 1], [1, 0], [1, 1]], static=True, hidden_states=2)
    check_gradient(recurrent("LSTM", "expose_hidden: true"), bottom, [Blob(), Blob(), Blob()],
                   check_bottom=[0, 2, 3, 4])


def test_lstm_unit_gradient():
    layer = make_layer('name: "u" type: "LSTMUnit"')
    bottom = [blob_from(uniform((1, 3, H), 8)), blob_from(uniform((1, 3, 4 * H), 9, 1.5)),
              blob_from([[1, 0, 1]])]
    check_gradient(layer, bottom, [Blob(), Blob()], check_bottom=[0, 1])


def test_parameter_gradients_accumulate():
    layer = recurrent("LSTM")
    bottom = bottoms()
    top = run_layer(layer, bottom)
    top[0].diff[...] = uniform(top[0].shape, 5)
    for blob in layer.blobs:
        blob.diff[...] = 0
    layer.backward(top, [True, False], bottom)
    once = [b.diff.copy() for b in layer.blobs]
    assert all(np.any(d != 0) for d in once)
    layer.backward(top, [True, False], bottom)
    for blob, d in zip(layer.blobs, once):
        np.testing.assert_allclose(blob.diff, 2 * d, rtol=1e-5)


# -- loading, errors, debug_info -------------------------------------------------------------

def test_layer_built_with_model_blobs_uses_them():
    from poseidon_caffe.io import array_to_blobproto
    trained = recurrent("LSTM")
    bottom = bottoms()
    want = run_layer(trained, bottom)[0].data.copy()
    param = trained.param.__class__()
    param.CopyFrom(trained.param)
    for blob in trained.blobs:
        param.blobs.add().CopyFrom(array_to_blobproto(blob.data))
    rng.set_random_seed(99)                 # a refill would draw different weights
    from poseidon_caffe.layers import create_layer
    loaded = create_layer(param)
    np.testing.assert_array_equal(run_layer(loaded, bottoms())[0].data, want)

    param.blobs[2].CopyFrom(array_to_blobproto(np.zeros((4 * H, H + 1), np.float32)))
    with pytest.raises(LayerError, match="W_hc"):
        run_layer(create_layer(param), bottoms())


def test_bad_inputs_name_the_layer_and_the_problem():
    with pytest.raises(LayerError, match="num_output"):
        run_layer(make_layer('name: "r" type: "RNN" recurrent_param { }'), bottoms())
    with pytest.raises(LayerError, match="cont"):
        run_layer(recurrent("LSTM"),
                  [blob_from(uniform((T, N, K), 1)), blob_from(np.ones((T, N + 1)))])
    layer = recurrent("LSTM")
    run_layer(layer, bottoms())
    with pytest.raises(LayerError, match="timesteps changed"):
        layer.reshape([blob_from(uniform((T + 1, N, K), 1)), blob_from(np.ones((T + 1, N)))],
                      [Blob()])
    with pytest.raises(LayerError, match="sequence continuation"):
        layer.backward([Blob((T, N, H))], [True, True], bottoms())
    with pytest.raises(LayerError, match="at least 4 bottom"):
        recurrent("LSTM", "expose_hidden: true").check_blob_counts(bottoms(), [Blob()] * 3)
    with pytest.raises(LayerError, match="hidden state input shape"):
        bad = bottoms(hidden_states=2)
        bad[3] = blob_from(np.zeros((1, N, H + 1)))
        run_layer(recurrent("LSTM", "expose_hidden: true"), bad, ntops=3)
    with pytest.raises(LayerError, match="4 x 2 = 8"):
        run_layer(make_layer('name: "u" type: "LSTMUnit"'),
                  [blob_from(np.zeros((1, 2, 2))), blob_from(np.zeros((1, 2, 6))),
                   blob_from(np.zeros((1, 2)))], ntops=2)


def test_cont_takes_no_forced_gradient():
    assert not recurrent("RNN").allow_force_backward(1)
    assert recurrent("RNN").allow_force_backward(0)
    assert not make_layer('name: "u" type: "LSTMUnit"').allow_force_backward(2)


def test_debug_info_logs_the_unrolled_blobs():
    records = []

    class Keep(logging.Handler):
        def emit(self, record):
            records.append(record.getMessage())
    handler = Keep()
    logger.addHandler(handler)
    try:
        layer = recurrent("LSTM", "debug_info: true")
        bottom = bottoms()
        top = run_layer(layer, bottom)
        top[0].diff[...] = 1
        layer.backward(top, [True, False], bottom)
    finally:
        logger.removeHandler(handler)
    text = "\n".join(records)
    assert "[Forward] Layer lstm_unit_3, top blob h_3 data:" in text
    assert "[Backward] Layer lstm, param blob W_hc diff:" in text


SEQUENCE_NET = '''
name: "sequence"
layer { name: "in" type: "Input" top: "x" top: "cont" top: "target"
  input_param { shape { dim: 3 dim: 2 dim: 3 } shape { dim: 3 dim: 2 }
                shape { dim: 3 dim: 2 dim: 4 } } }
layer { name: "lstm1" type: "LSTM" bottom: "x" bottom: "cont" top: "h"
  recurrent_param { num_output: 4 weight_filler { type: "uniform" min: -0.5 max: 0.5 } } }
layer { name: "rnn1" type: "RNN" bottom: "h" bottom: "cont" top: "o"
  recurrent_param { num_output: 4 weight_filler { type: "uniform" min: -0.5 max: 0.5 } } }
layer { name: "loss" type: "EuclideanLoss" bottom: "o" bottom: "target" top: "loss" }
'''


def test_stacked_recurrent_net_trains_and_its_saved_weights_reload(tmp_path):
    from poseidon_caffe.io import parse_net_text
    from poseidon_caffe.net import Net
    from poseidon_caffe.proto import caffe_pb2

    def fed(net):
        net.blobs["x"].data[...] = uniform((T, N, K), 1)
        net.blobs["cont"].data[...] = CONT_RESET_MID
        net.blobs["target"].data[...] = uniform((T, N, H), 2)
        return net

    net = fed(Net(parse_net_text(SEQUENCE_NET), caffe_pb2.TRAIN))
    assert [p.shape for p in net.params["lstm1"]] == [(4 * H, K), (4 * H,), (4 * H, H)]
    assert [p.shape for p in net.params["rnn1"]] == [(H, H), (H,), (H, H), (H, H), (H,)]
    loss = net.forward_backward()
    assert all(np.any(p.diff != 0) for p in net.params["lstm1"] + net.params["rnn1"])
    path = str(tmp_path / "sequence.caffemodel")
    net.save(path)
    rng.set_random_seed(123)
    again = fed(Net(parse_net_text(SEQUENCE_NET), caffe_pb2.TEST, weights=path))
    assert again.forward_backward() == pytest.approx(loss, rel=1e-6)
