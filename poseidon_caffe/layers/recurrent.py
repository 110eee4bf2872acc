"""Layer family: recurrent (RNN, LSTM, LSTMUnit), with Caffe 1.0's semantics and numbers.

Caffe builds RNN and LSTM by unrolling an internal net over the T time steps; here the same
arithmetic runs directly: one GEMM over all T x N rows for the input transform, then a loop over
time with one GEMM per step for the recurrent transform. The learnable blobs, their order and
their shapes are those of Caffe's unrolled net, so a Caffe model loads and gives the same outputs.

Blob layouts (H = num_output):
- x: T x N x ... (features from axis 2 on), cont: T x N (0 starts a new sequence: the previous
  hidden state, and for LSTM the previous cell through the forget gate, is multiplied by cont),
  optional x_static: N x ... (added to every step's pre-activation),
  with expose_hidden: h_0 (and c_0) of shape 1 x N x H as extra bottoms, h_T (and c_T) as extra
  tops. Without it, the final state of one forward is the initial state of the next (Caffe's
  state carried across batches); ``reset()`` zeroes it.
- RNN:  h_t = tanh(W_hh (cont_t h_{t-1}) + W_xh x_t + b_h [+ W_xh_static x_static]),
        o_t = tanh(W_ho h_t + b_o); blobs W_xh (H x K), b_h (H), [W_xh_static (H x Ks)],
        W_hh (H x H), W_ho (H x H), b_o (H); tops o (T x N x H) [, h_T].
- LSTM: gates_t = W_hc (cont_t h_{t-1}) + W_xc x_t + b_c [+ W_xc_static x_static], laid out
        (i, f, o, g) blocks of H; then LSTMUnit; blobs W_xc (4H x K), b_c (4H),
        [W_xc_static (4H x Ks)], W_hc (4H x H); tops h (T x N x H) [, h_T, c_T].
- LSTMUnit: i, f, o = sigmoid, g = tanh of the gate blocks; c_t = cont_t f c_{t-1} + i g;
  h_t = o tanh(c_t).

One deliberate difference: Caffe 1.0 shares only the *data* of exposed h_0/c_0 bottoms and
h_T/c_T tops with its internal net, so it silently drops the gradient arriving at h_T/c_T and
never writes a gradient to h_0/c_0. Here both flow as the math says (full backpropagation
through time within the batch); every other gradient is Caffe's.
"""
import numpy as np

from .. import log
from ..blob import Blob
from ..fillers import fill
from .base import Layer
from .registry import register


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


def _mean_abs(array):
    return float(np.abs(array).mean()) if array.size else 0.0


class _RecurrentLayer(Layer):
    """What RNN and LSTM share: bottoms, tops, blob bookkeeping, carried state, input GEMMs.

    Subclasses set ``state_names`` (hidden states carried over time), ``output_name``,
    ``gate_factor`` (rows of the input transform per hidden unit), ``blob_names`` and implement
    ``_run(x_gates, static_gates, cont, states)`` and ``_run_backward(...)``.
    """
    state_names = ()
    gate_factor = 1

    def __init__(self, layer_param, phase=None):
        super().__init__(layer_param, phase)
        exposed = len(self.state_names) if layer_param.recurrent_param.expose_hidden else 0
        # Caffe's MinBottomBlobs / MaxBottomBlobs / ExactNumTopBlobs depend on expose_hidden
        self.min_bottoms = 2 + exposed
        self.max_bottoms = self.min_bottoms + 1
        self.exact_tops = 1 + exposed

    def allow_force_backward(self, bottom_index):
        return bottom_index != 1          # never a gradient toward the sequence indicators

    # -- setup and shapes -------------------------------------------------------------------
    def setup(self, bottom, top):
        p = self.param.recurrent_param
        if p.num_output < 1:
            raise self.error("recurrent_param.num_output must be positive, got %d"
                             % p.num_output)
        self.hidden = int(p.num_output)
        self.expose_hidden = p.expose_hidden
        self.debug_info = p.debug_info
        self._check_sequence_bottoms(bottom)
        self.T, self.N = bottom[0].shape[0], bottom[0].shape[1]
        n_exposed = len(self.state_names) if self.expose_hidden else 0
        self.static_input = len(bottom) > 2 + n_exposed
        self.input_dim = bottom[0].count_axes(2)
        if self.static_input:
            if bottom[2].num_axes < 1 or bottom[2].shape[0] != self.N:
                raise self.error("the static input (bottom 2) must be N x ... with N = %d "
                                 "streams, got shape %s" % (self.N, bottom[2].shape))
            self.static_dim = bottom[2].count_axes(1)
        log.info("Initializing recurrent layer: assuming input batch contains %d timesteps "
                 "of %d independent streams.", self.T, self.N)
        shapes = self._blob_shapes()
        if self.blobs:
            self.check_loaded_blobs(
                [shape for _, shape in shapes], names=[name for name, _ in shapes],
                count_text="expected {want} parameter blobs ({names}), the model gives {got}")
        else:
            self.blobs = []
            for name, shape in shapes:
                blob = Blob(shape)
                fill(blob, p.bias_filler if name.startswith("b_") else p.weight_filler)
                self.blobs.append(blob)
        self.param_propagate_down = [True] * len(self.blobs)
        self._states = None

    def _blob_shapes(self):
        rows = self.gate_factor * self.hidden
        shapes = [(self.x_weight_name, (rows, self.input_dim)), (self.x_bias_name, (rows,))]
        if self.static_input:
            shapes.append((self.x_weight_name + "_static", (rows, self.static_dim)))
        shapes.extend(self._recurrent_blob_shapes())
        return shapes

    def _check_sequence_bottoms(self, bottom):
        if bottom[0].num_axes < 2:
            raise self.error("bottom[0] must have at least 2 axes -- (#timesteps, #streams, "
                             "...), got shape %s" % (bottom[0].shape,))
        if bottom[1].num_axes != 2 or bottom[1].shape != bottom[0].shape[:2]:
            raise self.error("bottom[1] (cont) must have exactly 2 axes -- (#timesteps, "
                             "#streams) = %s, got shape %s"
                             % (bottom[0].shape[:2], bottom[1].shape))

    def reshape(self, bottom, top):
        self._check_sequence_bottoms(bottom)
        if bottom[0].shape[0] != self.T:
            raise self.error("input number of timesteps changed: the layer was set up for %d, "
                             "bottom[0] has shape %s" % (self.T, bottom[0].shape))
        if bottom[0].count_axes(2) != self.input_dim:
            raise self.error("bottom[0] %s gives %d input features per step, the weights take "
                             "%d" % (bottom[0].shape, bottom[0].count_axes(2), self.input_dim))
        n = bottom[0].shape[1]
        if n != self.N:
            self._states = None                  # a new number of streams starts from zero
        self.N = n
        state_shape = (1, n, self.hidden)
        if self.static_input:
            s = bottom[2]
            if s.num_axes < 1 or s.shape[0] != n or s.count_axes(1) != self.static_dim:
                raise self.error("the static input (bottom 2) must be %d x (%d features), got "
                                 "shape %s" % (n, self.static_dim, s.shape))
        if self.expose_hidden:
            first = 2 + int(self.static_input)
            for j, name in enumerate(self.state_names):
                if bottom[first + j].shape != state_shape:
                    raise self.error("bottom[%d] (%s_0) shape must match hidden state input "
                                     "shape %s, got %s" % (first + j, name, state_shape,
                                                           bottom[first + j].shape))
        top[0].reshape((self.T, n, self.hidden))
        for j in range(1, len(top)):
            top[j].reshape(state_shape)

    def reset(self):
        """Zero the state carried from one forward to the next (Caffe's Reset())."""
        self._states = None

    # -- forward ------------------------------------------------------------------------------
    def _initial_states(self, bottom):
        if self.expose_hidden:
            first = 2 + int(self.static_input)
            return [bottom[first + j].data.reshape(self.N, self.hidden).astype(np.float32)
                    for j in range(len(self.state_names))]
        if self._states is None:
            self._states = [np.zeros((self.N, self.hidden), np.float32)
                            for _ in self.state_names]
        return [s.copy() for s in self._states]

    def forward(self, bottom, top):
        be = self.backend
        T, N, rows = self.T, self.N, self.gate_factor * self.hidden
        x = bottom[0].data.reshape(T * N, self.input_dim)
        x_gates = be.gemm(x, self.blobs[0].data, trans_b=True).reshape(T, N, rows)
        x_gates += self.blobs[1].data
        static_gates = None
        if self.static_input:
            xs = bottom[2].data.reshape(N, self.static_dim)
            static_gates = be.gemm(xs, self.blobs[2].data, trans_b=True)
        cont = bottom[1].data
        initial = self._initial_states(bottom)
        finals = self._run(top[0].data, x_gates, static_gates, cont, initial)
        if self.expose_hidden:
            for j, state in enumerate(finals):
                top[1 + j].data[...] = state.reshape(1, N, self.hidden)
        else:
            self._states = [s.copy() for s in finals]
        if self.debug_info:
            self._log_forward(x_gates)

    @property
    def _recurrent_offset(self):
        return 3 if self.static_input else 2

    # -- backward -----------------------------------------------------------------------------
    def backward(self, top, propagate_down, bottom):
        if propagate_down[1]:
            raise self.error("cannot backpropagate to the sequence continuation indicators "
                             "(bottom 1)")
        be = self.backend
        T, N, rows = self.T, self.N, self.gate_factor * self.hidden
        if self.expose_hidden:           # gradients arriving at the exposed h_T (and c_T)
            final_diffs = [t.diff.reshape(N, self.hidden) for t in top[1:]]
        else:
            final_diffs = [None] * len(self.state_names)
        d_gates, d_initial = self._run_backward(top[0].diff, bottom[1].data, final_diffs)
        flat = d_gates.reshape(T * N, rows)
        pd = self.param_propagate_down
        if pd[0]:
            be.gemm(flat, bottom[0].data.reshape(T * N, self.input_dim), trans_a=True,
                    beta=1.0, out=self.blobs[0].diff)
        if pd[1]:
            self.blobs[1].diff += flat.sum(axis=0)
        if propagate_down[0]:
            be.gemm(flat, self.blobs[0].data,
                    out=bottom[0].diff.reshape(T * N, self.input_dim))
        if self.static_input:
            d_static = d_gates.sum(axis=0)
            if pd[2]:
                be.gemm(d_static, bottom[2].data.reshape(N, self.static_dim), trans_a=True,
                        beta=1.0, out=self.blobs[2].diff)
            if propagate_down[2]:
                be.gemm(d_static, self.blobs[2].data,
                        out=bottom[2].diff.reshape(N, self.static_dim))
        if self.expose_hidden:
            first = 2 + int(self.static_input)
            for j, d in enumerate(d_initial):
                if propagate_down[first + j]:
                    bottom[first + j].diff[...] = d.reshape(1, N, self.hidden)
        if self.debug_info:
            self._log_backward(bottom, propagate_down, d_gates)

    def _recurrent_step_backward(self, t, d_pre, conted):
        """Add step t's share of the recurrent weight gradient and return the gradient of
        cont_t * h_{t-1}; the caller multiplies it by cont_t to reach h_{t-1}."""
        be = self.backend
        w = self.blobs[self._recurrent_offset]
        if self.param_propagate_down[self._recurrent_offset]:
            be.gemm(d_pre, conted, trans_a=True, beta=1.0, out=w.diff)
        return be.gemm(d_pre, w.data)

    # -- debug_info: Caffe's unrolled net logs its blobs' mean absolute values -------------
    def _layer_prefix(self):
        return self.name + "_" if self.name else ""

    def _log_forward(self, x_gates):
        prefix = self._layer_prefix()
        log.info("    [Forward] Layer %sx_transform, top blob %s_x data: %g", prefix,
                 self.x_weight_name, _mean_abs(x_gates))
        for name, values in self._debug_steps():
            log.info("    [Forward] Layer %s%s data: %g", prefix, name, _mean_abs(values))
        for (name, _), blob in zip(self._blob_shapes(), self.blobs):
            log.info("    [Forward] Layer %s, param blob %s data: %g", self.name, name,
                     _mean_abs(blob.data))

    def _log_backward(self, bottom, propagate_down, d_gates):
        prefix = self._layer_prefix()
        log.info("    [Backward] Layer %sx_transform, top blob %s_x diff: %g", prefix,
                 self.x_weight_name, _mean_abs(d_gates))
        if propagate_down[0]:
            log.info("    [Backward] Layer %sx_transform, bottom blob x diff: %g", prefix,
                     _mean_abs(bottom[0].diff))
        for (name, _), blob, down in zip(self._blob_shapes(), self.blobs,
                                         self.param_propagate_down):
            if down:
                log.info("    [Backward] Layer %s, param blob %s diff: %g", self.name, name,
                         _mean_abs(blob.diff))


@register("RNN")
class RNNLayer(_RecurrentLayer):
    """Caffe's RNN: tanh hidden state, tanh output o_t = tanh(W_ho h_t + b_o)."""
    state_names = ("h",)
    gate_factor = 1
    x_weight_name = "W_xh"
    x_bias_name = "b_h"

    def _recurrent_blob_shapes(self):
        H = self.hidden
        return [("W_hh", (H, H)), ("W_ho", (H, H)), ("b_o", (H,))]

    def _run(self, out, x_gates, static_gates, cont, initial):
        be = self.backend
        T, N, H = self.T, self.N, self.hidden
        off = self._recurrent_offset
        w_hh = self.blobs[off].data
        hs = np.empty((T + 1, N, H), np.float32)
        hs[0] = initial[0]
        conted = np.empty((T, N, H), np.float32)
        for t in range(T):
            np.multiply(hs[t], cont[t][:, None], out=conted[t])
            pre = be.gemm(conted[t], w_hh, trans_b=True)
            pre += x_gates[t]
            if static_gates is not None:
                pre += static_gates
            np.tanh(pre, out=hs[t + 1])
        flat_out = out.reshape(T * N, H)
        be.gemm(hs[1:].reshape(T * N, H), self.blobs[off + 1].data, trans_b=True, out=flat_out)
        flat_out += self.blobs[off + 2].data
        np.tanh(flat_out, out=flat_out)
        self._cache = (hs, conted, out.copy())
        return [hs[T]]

    def _run_backward(self, d_out, cont, final_diffs):
        be = self.backend
        T, N, H = self.T, self.N, self.hidden
        off = self._recurrent_offset
        hs, conted, out = self._cache
        d_o_pre = (d_out * (1 - out * out)).reshape(T * N, H)
        w_ho, b_o = self.blobs[off + 1], self.blobs[off + 2]
        if self.param_propagate_down[off + 1]:
            be.gemm(d_o_pre, hs[1:].reshape(T * N, H), trans_a=True, beta=1.0, out=w_ho.diff)
        if self.param_propagate_down[off + 2]:
            b_o.diff += d_o_pre.sum(axis=0)
        d_h = be.gemm(d_o_pre, w_ho.data).reshape(T, N, H)
        carry = final_diffs[0] if final_diffs[0] is not None else 0.0
        d_pre = np.empty((T, N, H), np.float32)
        for t in range(T - 1, -1, -1):
            h = hs[t + 1]
            d_pre[t] = (d_h[t] + carry) * (1 - h * h)
            carry = self._recurrent_step_backward(t, d_pre[t], conted[t]) * cont[t][:, None]
        return d_pre, [np.broadcast_to(carry, (N, H))]

    def _debug_steps(self):
        hs, _, out = self._cache
        for t in range(self.T):
            yield "h_neuron_%d, top blob h_%d" % (t + 1, t + 1), hs[t + 1]
            yield "o_neuron_%d, top blob o_%d" % (t + 1, t + 1), out[t]


@register("LSTM")
class LSTMLayer(_RecurrentLayer):
    """Caffe's LSTM: gate blocks (i, f, o, g) from W_xc x_t + b_c + W_hc (cont_t h_{t-1})."""
    state_names = ("h", "c")
    gate_factor = 4
    x_weight_name = "W_xc"
    x_bias_name = "b_c"

    def _recurrent_blob_shapes(self):
        return [("W_hc", (4 * self.hidden, self.hidden))]

    def _run(self, out, x_gates, static_gates, cont, initial):
        be = self.backend
        T, N, H = self.T, self.N, self.hidden
        w_hc = self.blobs[self._recurrent_offset].data
        h_prev, c_prev = initial
        cs = np.empty((T + 1, N, H), np.float32)
        cs[0] = c_prev
        conted = np.empty((T, N, H), np.float32)
        gate_inputs = np.empty((T, N, 4 * H), np.float32)
        caches = []
        for t in range(T):
            np.multiply(h_prev, cont[t][:, None], out=conted[t])
            pre = gate_inputs[t]
            be.gemm(conted[t], w_hc, trans_b=True, out=pre)
            pre += x_gates[t]
            if static_gates is not None:
                pre += static_gates
            cs[t + 1], out[t], cache = lstm_unit_forward(cs[t], pre, cont[t])
            caches.append(cache)
            h_prev = out[t]
        self._cache = (cs, conted, caches, gate_inputs, out.copy())
        return [out[T - 1].copy(), cs[T].copy()]

    def _run_backward(self, d_out, cont, final_diffs):
        T, N, H = self.T, self.N, self.hidden
        cs, conted, caches, _, _ = self._cache
        d_h_carry = final_diffs[0] if final_diffs[0] is not None else 0.0
        d_c = (final_diffs[1].astype(np.float32) if final_diffs[1] is not None
               else np.zeros((N, H), np.float32))
        d_gates = np.empty((T, N, 4 * H), np.float32)
        for t in range(T - 1, -1, -1):
            d_h = d_out[t] + d_h_carry
            d_c, d_gates[t] = lstm_unit_backward(cs[t], cont[t], caches[t], d_c, d_h)
            d_h_carry = self._recurrent_step_backward(t, d_gates[t], conted[t]) * \
                cont[t][:, None]
        d_h0 = np.broadcast_to(d_h_carry, (N, H))
        return d_gates, [d_h0, d_c]

    def _debug_steps(self):
        cs, _, _, gate_inputs, out = self._cache
        for t in range(self.T):
            yield "gate_input_%d, top blob gate_input_%d" % (t + 1, t + 1), gate_inputs[t]
            yield "unit_%d, top blob c_%d" % (t + 1, t + 1), cs[t + 1]
            yield "unit_%d, top blob h_%d" % (t + 1, t + 1), out[t]


@register("LSTMUnit")
class LSTMUnitLayer(Layer):
    """One LSTM step: bottoms c_{t-1} (1 x N x D), gate inputs (1 x N x 4D) in (i, f, o, g)
    order, cont (1 x N); tops c_t and h_t (1 x N x D)."""
    exact_bottoms = 3
    exact_tops = 2

    def allow_force_backward(self, bottom_index):
        return bottom_index != 2

    def reshape(self, bottom, top):
        n = bottom[0].shape[1] if bottom[0].num_axes > 1 else -1
        for i, blob in enumerate(bottom):
            axes = 2 if i == 2 else 3
            if blob.num_axes != axes or blob.shape[0] != 1 or blob.shape[1] != n:
                raise self.error("bottom %d must have %d axes, 1 x N%s with N = %d, got shape %s"
                                 % (i, axes, " x ..." if axes == 3 else "", n, blob.shape))
        self.hidden = bottom[0].shape[2]
        if bottom[1].shape[2] != 4 * self.hidden:
            raise self.error("the gate input (bottom 1) must have 4 x %d = %d values per "
                             "stream, got shape %s" % (self.hidden, 4 * self.hidden,
                                                       bottom[1].shape))
        top[0].reshape(bottom[0].shape)
        top[1].reshape(bottom[0].shape)

    def forward(self, bottom, top):
        c, h, self._cache = lstm_unit_forward(bottom[0].data[0], bottom[1].data[0],
                                              bottom[2].data[0])
        top[0].data[0] = c
        top[1].data[0] = h

    def backward(self, top, propagate_down, bottom):
        if propagate_down[2]:
            raise self.error("cannot backpropagate to the sequence continuation indicators "
                             "(bottom 2)")
        if not (propagate_down[0] or propagate_down[1]):
            return
        d_c_prev, d_gates = lstm_unit_backward(bottom[0].data[0], bottom[2].data[0],
                                               self._cache, top[0].diff[0], top[1].diff[0])
        if propagate_down[0]:
            bottom[0].diff[0] = d_c_prev
        if propagate_down[1]:
            bottom[1].diff[0] = d_gates
