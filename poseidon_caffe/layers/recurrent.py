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


def _mean_abs(backend, array):
    array = backend.to_host(array)
    return float(np.abs(array).mean()) if array.size else 0.0


class _RecurrentLayer(Layer):
    """What RNN and LSTM share: bottoms, tops, blob bookkeeping, carried state, input GEMMs.

    Subclasses set ``state_names`` (hidden states carried over time), ``output_name``,
    ``gate_factor`` (rows of the input transform per hidden unit), ``blob_names`` and implement
    ``_run(x_gates, static_gates, cont, states)`` and ``_run_backward(...)``.
    """
    state_names = ()
    gate_factor = 1
    device_ready = True

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
    def _copy(self, array):
        return self.backend.copy(array, self.backend.empty(array.shape))

    def _initial_states(self, bottom):
        if self.expose_hidden:
            first = 2 + int(self.static_input)
            return [self._copy(bottom[first + j].dev_data.reshape(self.N, self.hidden))
                    for j in range(len(self.state_names))]
        if self._states is None:
            self._states = [self.backend.zeros((self.N, self.hidden))
                            for _ in self.state_names]
        return [self._copy(s) for s in self._states]

    def forward(self, bottom, top):
        be = self.backend
        T, N, rows = self.T, self.N, self.gate_factor * self.hidden
        x = bottom[0].dev_data.reshape(T * N, self.input_dim)
        x_gates = be.gemm(x, self.blobs[0].dev_data, trans_b=True)
        be.add_bias(x_gates.reshape(T * N, rows, 1), self.blobs[1].dev_data)
        x_gates = x_gates.reshape(T, N, rows)
        static_gates = None
        if self.static_input:
            xs = bottom[2].dev_data.reshape(N, self.static_dim)
            static_gates = be.gemm(xs, self.blobs[2].dev_data, trans_b=True)
        cont = bottom[1].dev_data
        initial = self._initial_states(bottom)
        finals = self._run(top[0].mutable_dev_data, x_gates, static_gates, cont, initial)
        if self.expose_hidden:
            for j, state in enumerate(finals):
                be.copy(state, top[1 + j].mutable_dev_data)
        else:
            self._states = [self._copy(s) for s in finals]
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
            final_diffs = [t.dev_diff.reshape(N, self.hidden) for t in top[1:]]
        else:
            final_diffs = [None] * len(self.state_names)
        d_gates, d_initial = self._run_backward(top[0].dev_diff, bottom[1].dev_data,
                                                final_diffs)
        flat = d_gates.reshape(T * N, rows)
        pd = self.param_propagate_down
        if pd[0]:
            be.gemm(flat, bottom[0].dev_data.reshape(T * N, self.input_dim), trans_a=True,
                    beta=1.0, out=self.blobs[0].mutable_dev_diff)
        if pd[1]:
            be.add_bias_grad(flat.reshape(T * N, rows, 1), self.blobs[1].mutable_dev_diff)
        if propagate_down[0]:
            be.gemm(flat, self.blobs[0].dev_data,
                    out=bottom[0].mutable_dev_diff.reshape(T * N, self.input_dim))
        if self.static_input:
            # the sum over time steps (0 + the sum: the same values as a plain sum)
            d_static = be.add_bias_grad(d_gates.reshape(T, N * rows, 1),
                                        be.zeros((N * rows,))).reshape(N, rows)
            if pd[2]:
                be.gemm(d_static, bottom[2].dev_data.reshape(N, self.static_dim), trans_a=True,
                        beta=1.0, out=self.blobs[2].mutable_dev_diff)
            if propagate_down[2]:
                be.gemm(d_static, self.blobs[2].dev_data,
                        out=bottom[2].mutable_dev_diff.reshape(N, self.static_dim))
        if self.expose_hidden:
            first = 2 + int(self.static_input)
            for j, d in enumerate(d_initial):
                if propagate_down[first + j]:
                    be.copy(d, bottom[first + j].mutable_dev_diff)
        if self.debug_info:
            self._log_backward(bottom, propagate_down, d_gates)

    def _recurrent_step_backward(self, t, d_pre, conted):
        """Add step t's share of the recurrent weight gradient and return the gradient of
        cont_t * h_{t-1}; the caller multiplies it by cont_t to reach h_{t-1}."""
        be = self.backend
        w = self.blobs[self._recurrent_offset]
        if self.param_propagate_down[self._recurrent_offset]:
            be.gemm(d_pre, conted, trans_a=True, beta=1.0, out=w.mutable_dev_diff)
        return be.gemm(d_pre, w.dev_data)

    # -- debug_info: Caffe's unrolled net logs its blobs' mean absolute values -------------
    def _layer_prefix(self):
        return self.name + "_" if self.name else ""

    def _log_forward(self, x_gates):
        prefix = self._layer_prefix()
        be = self.backend
        log.info("    [Forward] Layer %sx_transform, top blob %s_x data: %g", prefix,
                 self.x_weight_name, _mean_abs(be, x_gates))
        for name, values in self._debug_steps():
            log.info("    [Forward] Layer %s%s data: %g", prefix, name, _mean_abs(be, values))
        for (name, _), blob in zip(self._blob_shapes(), self.blobs):
            log.info("    [Forward] Layer %s, param blob %s data: %g", self.name, name,
                     _mean_abs(be, blob.dev_data))

    def _log_backward(self, bottom, propagate_down, d_gates):
        prefix = self._layer_prefix()
        be = self.backend
        log.info("    [Backward] Layer %sx_transform, top blob %s_x diff: %g", prefix,
                 self.x_weight_name, _mean_abs(be, d_gates))
        if propagate_down[0]:
            log.info("    [Backward] Layer %sx_transform, bottom blob x diff: %g", prefix,
                     _mean_abs(be, bottom[0].dev_diff))
        for (name, _), blob, down in zip(self._blob_shapes(), self.blobs,
                                         self.param_propagate_down):
            if down:
                log.info("    [Backward] Layer %s, param blob %s diff: %g", self.name, name,
                         _mean_abs(be, blob.dev_diff))


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
        w_hh = self.blobs[off].dev_data
        hs = be.empty((T + 1, N, H))
        be.copy(initial[0], be.step(hs, 0))
        conted = be.empty((T, N, H))
        for t in range(T):
            step_conted = be.scale_rows(be.step(hs, t), be.step(cont, t), be.step(conted, t))
            pre = be.gemm(step_conted, w_hh, trans_b=True)
            be.axpby(1.0, be.step(x_gates, t), 1.0, pre)
            if static_gates is not None:
                be.axpby(1.0, static_gates, 1.0, pre)
            be.neuron_forward("tanh", pre, be.step(hs, t + 1))
        flat_out = out.reshape(T * N, H)
        be.gemm(be.steps(hs, 1, T + 1).reshape(T * N, H),
                self.blobs[off + 1].dev_data, trans_b=True, out=flat_out)
        be.add_bias(flat_out.reshape(T * N, H, 1), self.blobs[off + 2].dev_data)
        be.neuron_forward("tanh", flat_out, flat_out)
        self._cache = (hs, conted, self._copy(out))
        return [be.step(hs, T)]

    def _run_backward(self, d_out, cont, final_diffs):
        be = self.backend
        T, N, H = self.T, self.N, self.hidden
        off = self._recurrent_offset
        hs, conted, out = self._cache
        d_o_pre = be.neuron_backward("tanh", d_out, out, be.empty(out.shape)).reshape(T * N, H)
        w_ho, b_o = self.blobs[off + 1], self.blobs[off + 2]
        if self.param_propagate_down[off + 1]:
            be.gemm(d_o_pre, be.steps(hs, 1, T + 1).reshape(T * N, H), trans_a=True,
                    beta=1.0, out=w_ho.mutable_dev_diff)
        if self.param_propagate_down[off + 2]:
            be.add_bias_grad(d_o_pre.reshape(T * N, H, 1), b_o.mutable_dev_diff)
        d_h = be.gemm(d_o_pre, w_ho.dev_data).reshape(T, N, H)
        carry = final_diffs[0]
        d_pre = be.empty((T, N, H))
        for t in range(T - 1, -1, -1):
            d_h_t = be.step(d_h, t)
            if carry is not None:
                be.axpby(1.0, carry, 1.0, d_h_t)
            be.neuron_backward("tanh", d_h_t, be.step(hs, t + 1), be.step(d_pre, t))
            carry = self._recurrent_step_backward(t, be.step(d_pre, t), be.step(conted, t))
            be.scale_rows(carry, be.step(cont, t), carry)
        if carry is None:
            carry = be.zeros((N, H))
        return d_pre, [carry]

    def _debug_steps(self):
        be = self.backend
        hs, _, out = self._cache
        for t in range(self.T):
            yield "h_neuron_%d, top blob h_%d" % (t + 1, t + 1), be.step(hs, t + 1)
            yield "o_neuron_%d, top blob o_%d" % (t + 1, t + 1), be.step(out, t)


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
        w_hc = self.blobs[self._recurrent_offset].dev_data
        h_prev, c_prev = initial
        cs = be.empty((T + 1, N, H))
        be.copy(c_prev, be.step(cs, 0))
        conted = be.empty((T, N, H))
        gate_inputs = be.empty((T, N, 4 * H))
        caches = []
        for t in range(T):
            cont_t = be.step(cont, t)
            be.scale_rows(h_prev, cont_t, be.step(conted, t))
            pre = be.step(gate_inputs, t)
            be.gemm(be.step(conted, t), w_hc, trans_b=True, out=pre)
            be.axpby(1.0, be.step(x_gates, t), 1.0, pre)
            if static_gates is not None:
                be.axpby(1.0, static_gates, 1.0, pre)
            h_prev = be.step(out, t)
            caches.append(be.lstm_unit_forward(be.step(cs, t), pre, cont_t,
                                               be.step(cs, t + 1), h_prev))
        self._cache = (cs, conted, caches, gate_inputs, self._copy(out))
        return [self._copy(be.step(out, T - 1)), self._copy(be.step(cs, T))]

    def _run_backward(self, d_out, cont, final_diffs):
        be = self.backend
        T, N, H = self.T, self.N, self.hidden
        cs, conted, caches, _, _ = self._cache
        d_h_carry = final_diffs[0]
        d_c = self._copy(final_diffs[1]) if final_diffs[1] is not None else be.zeros((N, H))
        d_gates = be.empty((T, N, 4 * H))
        summed = be.empty((N, H))
        for t in range(T - 1, -1, -1):
            cont_t = be.step(cont, t)
            d_h = be.step(d_out, t)
            if d_h_carry is not None:
                d_h = be.add(d_h, d_h_carry, summed)
            be.lstm_unit_backward(be.step(cs, t), cont_t, caches[t], d_c, d_h, d_c,
                                  be.step(d_gates, t))
            d_h_carry = self._recurrent_step_backward(t, be.step(d_gates, t),
                                                      be.step(conted, t))
            be.scale_rows(d_h_carry, cont_t, d_h_carry)
        if d_h_carry is None:
            d_h_carry = be.zeros((N, H))
        return d_gates, [d_h_carry, d_c]

    def _debug_steps(self):
        be = self.backend
        cs, _, _, gate_inputs, out = self._cache
        for t in range(self.T):
            yield "gate_input_%d, top blob gate_input_%d" % (t + 1, t + 1), \
                be.step(gate_inputs, t)
            yield "unit_%d, top blob c_%d" % (t + 1, t + 1), be.step(cs, t + 1)
            yield "unit_%d, top blob h_%d" % (t + 1, t + 1), be.step(out, t)


@register("LSTMUnit")
class LSTMUnitLayer(Layer):
    """One LSTM step: bottoms c_{t-1} (1 x N x D), gate inputs (1 x N x 4D) in (i, f, o, g)
    order, cont (1 x N); tops c_t and h_t (1 x N x D)."""
    device_ready = True
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
        be = self.backend
        self._cache = be.lstm_unit_forward(
            be.step(bottom[0].dev_data, 0), be.step(bottom[1].dev_data, 0),
            be.step(bottom[2].dev_data, 0), be.step(top[0].mutable_dev_data, 0),
            be.step(top[1].mutable_dev_data, 0))

    def backward(self, top, propagate_down, bottom):
        if propagate_down[2]:
            raise self.error("cannot backpropagate to the sequence continuation indicators "
                             "(bottom 2)")
        if not (propagate_down[0] or propagate_down[1]):
            return
        be = self.backend
        c_prev = be.step(bottom[0].dev_data, 0)
        d_c_prev = (be.step(bottom[0].mutable_dev_diff, 0) if propagate_down[0]
                    else be.empty(c_prev.shape))
        d_gates = (be.step(bottom[1].mutable_dev_diff, 0) if propagate_down[1]
                   else be.empty(bottom[1].shape[1:]))
        be.lstm_unit_backward(c_prev, be.step(bottom[2].dev_data, 0), self._cache,
                              be.step(top[0].dev_diff, 0), be.step(top[1].dev_diff, 0),
                              d_c_prev, d_gates)
