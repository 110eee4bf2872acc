"""The recurrent layers' named ops on the device (kernels/recurrent.cu); the CPU backend's
are in cpu/recurrent_ops.py under the same names."""
from . import kernels


class RecurrentOps:

    def step(self, a, t):
        return a.rows(t, t + 1).reshape(a.shape[1:])

    def steps(self, a, start, stop):
        return a.rows(start, stop)

    def scale_rows(self, x, c, out):
        if x.size:
            self.launcher.run(kernels.recurrent.rows_scale, x.size, x.ptr, c.ptr,
                              x.size // x.shape[0], out.ptr)
        return out

    def add(self, a, b, out):
        if out.size:
            self.launcher.run(kernels.math.vec_add, out.size, a.ptr, b.ptr, out.ptr)
        return out

    def lstm_unit_forward(self, c_prev, gates, cont, c, h):
        acts, tanh_c = self.empty(gates.shape), self.empty(c.shape)
        if c.size:
            self.launcher.run(kernels.recurrent.lstm_unit_forward, c.size, c_prev.ptr, gates.ptr,
                              cont.ptr, c.shape[-1], c.ptr, h.ptr, acts.ptr, tanh_c.ptr)
        return acts, tanh_c

    def lstm_unit_backward(self, c_prev, cont, cache, dc, dh, dc_prev, dgates):
        acts, tanh_c = cache
        if dc_prev.size:
            self.launcher.run(kernels.recurrent.lstm_unit_backward, dc_prev.size, c_prev.ptr,
                              cont.ptr, acts.ptr, tanh_c.ptr, dc.ptr, dh.ptr, c_prev.shape[-1],
                              dc_prev.ptr, dgates.ptr)
