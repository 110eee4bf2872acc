"""The recurrent layers' named ops on the CPU (RNN, LSTM, LSTMUnit): a step's view, rows
scaled by the continuation indicators, and the LSTM unit, with the formulas the layers had
inline (so results are unchanged). The CUDA backend has the same names over
kernels/recurrent.cu (cuda/recurrent_ops.py); the GEMMs between them are the backend's gemm."""
import numpy as np


def _sigmoid(x):
    # the tanh form never overflows in float32, and equals 1 / (1 + exp(-x))
    return 0.5 * np.tanh(0.5 * x) + 0.5


def lstm_unit_forward(c_prev, gates, cont):
    """One LSTM step for N streams. ``c_prev`` (N, H), ``gates`` (N, 4H) pre-activations in
    (i, f, o, g) order, ``cont`` (N,). Returns c, h and the cache for ``lstm_unit_backward``."""
    hidden = c_prev.shape[1]
    acts = np.empty_like(gates)
    acts[:, :3 * hidden] = _sigmoid(gates[:, :3 * hidden])
    acts[:, 3 * hidden:] = np.tanh(gates[:, 3 * hidden:])
    i, f_sig, o, g = (acts[:, k * hidden:(k + 1) * hidden] for k in range(4))
    c = (cont[:, None] * f_sig) * c_prev + i * g
    tanh_c = np.tanh(c)
    h = o * tanh_c
    return c, h, (acts, tanh_c)


def lstm_unit_backward(c_prev, cont, cache, dc, dh):
    """Gradients of one LSTM step: returns (d c_prev, d gates), as Caffe's LSTMUnit computes
    them (the forget gate's gradient is scaled by cont, exact for any cont value)."""
    acts, tanh_c = cache
    hidden = c_prev.shape[1]
    i, f_sig, o, g = (acts[:, k * hidden:(k + 1) * hidden] for k in range(4))
    cont = cont[:, None]
    c_term = dc + dh * o * (1 - tanh_c * tanh_c)
    dc_prev = c_term * (cont * f_sig)
    dgates = np.empty_like(acts)
    dgates[:, :hidden] = c_term * g * i * (1 - i)
    dgates[:, hidden:2 * hidden] = c_term * c_prev * cont * f_sig * (1 - f_sig)
    dgates[:, 2 * hidden:3 * hidden] = dh * tanh_c * o * (1 - o)
    dgates[:, 3 * hidden:] = c_term * i * (1 - g * g)
    return dc_prev, dgates


class RecurrentOps:

    def step(self, a, t):
        """The view of a[t] (time step t of a (T, ...) array)."""
        return a[t]

    def steps(self, a, start, stop):
        """The view of a[start:stop] along the first axis."""
        return a[start:stop]

    def scale_rows(self, x, c, out):
        """out (N, H) = x scaled per row by c (N); out may be x."""
        np.multiply(x, c[:, None], out=out)
        return out

    def add(self, a, b, out):
        """out = a + b, of one shape."""
        np.add(a, b, out=out)
        return out

    def lstm_unit_forward(self, c_prev, gates, cont, c, h):
        """c, h (N, H) of one LSTM step; returns the cache lstm_unit_backward reads."""
        c[...], h[...], cache = lstm_unit_forward(c_prev, gates, cont)
        return cache

    def lstm_unit_backward(self, c_prev, cont, cache, dc, dh, dc_prev, dgates):
        """d c_prev (N, H) and d gates (N, 4H) of one step; dc_prev may be dc."""
        dc_prev[...], dgates[...] = lstm_unit_backward(c_prev, cont, cache, dc, dh)
