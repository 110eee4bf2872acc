"""Direct convolution (kernels/direct.c): 2-D, stride 1, no dilation, one group, on CPUs with
AVX-512 where the compiled kernels were built.

A GEMM library runs the products of a layer with tens of output channels (CIFAR-10's 5x5
layers: (32 x 800) times (800 x 25600)) at a third of its rate, and an FFT's forward pays for
three transforms. Here the output channels are the vector lanes and each input value is
broadcast once per tap: forward, backward-data (the forward of dy with the weights flipped in
space and their channel axes swapped) and backward-filter each run near the machine's
multiply-add rate on such layers. Nothing is kept between calls; results equal the other
plans' up to float summation order.

Backward-data runs the kernel's zero padding too: on a layer without padding (LeNet's conv2,
its 8x8 gradient padded to 16x16 for a 12x12 result) most of its multiply-adds are by zeros.
There (backend.direct_data_by_gemm) it is im2col's instead: W' dy as one GEMM, and the
compiled col2im.
"""
import numpy as np

from . import native


def serves(geom):
    """Whether the direct kernels run this geometry here (built, not POSEIDON_NATIVE=0, and
    AVX-512)."""
    return (native.direct and len(geom.kernel) == 2 and geom.group == 1
            and all(s == 1 for s in geom.stride) and all(d == 1 for d in geom.dilation)
            and all(p < k for p, k in zip(geom.pad, geom.kernel)) and not geom.is_pointwise)


def _address(a):
    return None if a is None else native.address(a)


def _contiguous(a):
    return np.ascontiguousarray(a, dtype=np.float32)


def _check(status, what):
    if status == -1:
        raise MemoryError("direct convolution: no memory for %s" % what)
    if status:
        raise RuntimeError("direct convolution: the kernels are not available on this CPU")


class DirectConvPlan:
    """The plan contract of backend/ops.py's conv_plan by the direct kernels."""

    def __init__(self, geom, dtype=np.float32, data_by_gemm=False):
        self.geom = geom
        self.dtype = dtype
        self.lib = native.lib
        self._data_plan = None
        if data_by_gemm:
            from .conv import ConvPlan
            # keeps nothing: its columns and product are the thread's scratch
            self._data_plan = ConvPlan(geom, dtype, shared=True)

    def prepare(self, x):
        """Nothing to keep: backward-filter reads x itself."""

    def workspace_bytes(self, n):
        """The kernels' buffers while a call runs (a padded image, the weights in lanes, one
        image's output gradient and the weight gradient in lanes); none is kept."""
        g = self.geom
        lanes = -(-max(g.channels, g.num_output) // 32) * 32
        padded = max(g.channels, g.num_output) * int(np.prod(
            [s + 2 * p for s, p in zip(g.in_shape, g.pad)]))
        return 4 * (padded + 2 * g.taps * max(g.channels, g.num_output) * lanes +
                    g.out_count * lanes)

    def shared_workspace_bytes(self, n):
        """Backward-data by GEMM: what its im2col plan takes of the thread's scratch (the
        product W' dy lies where a shared plan's columns do)."""
        return 0 if self._data_plan is None else self._data_plan.shared_workspace_bytes(n)

    def _run_forward(self, x, w, bias, y, channels, outputs, pad, flip):
        g = self.geom
        x, w = _contiguous(x), _contiguous(w)
        bias = None if bias is None else _contiguous(bias).reshape(-1)
        out = y if y.flags.c_contiguous and y.dtype == np.float32 else \
            np.empty(y.shape, np.float32)
        h, wd = x.shape[2:]
        _check(self.lib.conv_direct_forward(
            _address(x), _address(w), _address(bias), _address(out), x.shape[0], channels, h,
            wd, outputs, g.kernel[0], g.kernel[1], pad[0], pad[1], int(flip)),
            "an image of %d channels" % channels)
        if out is not y:
            y[...] = out

    def forward(self, x, w, bias, y):
        g = self.geom
        self._run_forward(x, w, bias, y, g.channels, g.num_output, g.pad, False)

    def backward(self, x, dy, w, dx=None, dw=None, dbias=None):
        g = self.geom
        if dx is not None and self._data_plan is not None:
            self._data_plan.backward(None, dy, w, dx=dx)
        elif dx is not None:
            flipped_pad = tuple(k - 1 - p for k, p in zip(g.kernel, g.pad))
            self._run_forward(dy, w, None, dx, g.num_output, g.channels, flipped_pad, True)
        if dw is not None:
            x, dy_c = _contiguous(x), _contiguous(dy)
            target = dw if dw.flags.c_contiguous and dw.dtype == np.float32 else \
                np.ascontiguousarray(dw, dtype=np.float32)
            h, wd = x.shape[2:]
            _check(self.lib.conv_direct_filter(
                _address(x), _address(dy_c), _address(target), x.shape[0], g.channels, h, wd,
                g.num_output, g.kernel[0], g.kernel[1], g.pad[0], g.pad[1]),
                "the weight gradient")
            if target is not dw:
                dw[...] = target
        if dbias is not None:
            dbias += dy.sum(axis=(0, 2, 3), dtype=np.float32).reshape(dbias.shape)
