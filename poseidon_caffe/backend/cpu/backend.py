"""The numpy backend: float32 arrays in host memory, every op vectorised over the whole batch."""
import ctypes
import os
import time

import numpy as np

from ..ops import Backend, Transfers
from . import dropout, native
from .common_ops import CommonOps
from .loss_ops import LossOps
from .prelu_ops import PReLUOps
from .mvn_ops import MVNOps
from .recurrent_ops import RecurrentOps
from .threads import over_parts, set_blas_threads, thread_count

try:                                  # a BLAS call that accumulates: out = a b + beta out
    from scipy.linalg.blas import sgemm as _sgemm
except ImportError:                   # scipy is optional
    _sgemm = None
# scipy's BLAS is a second library with its own thread pool. Two multi-threaded pools would
# spin against each other, but the backend holds every OpenBLAS loaded at one thread when it
# runs several (its batch parts and GEMM parts are the threads), scipy's included: it is
# imported here, before CPUBackend sets the counts. Accumulating in BLAS halves the time of a
# weight gradient over few rows (VGG's fc7: 15 -> 7.7 ms a half at one thread).
_ACCUMULATING_GEMM = _sgemm


# Rates of this kind of CPU, one thread, measured with the shapes of LeNet, CIFAR-10 and AlexNet:
# sgemm on im2col shapes, copies into columns, single-precision real FFTs of feature-map size,
# and the small batched complex GEMMs of an FFT convolution.
GEMM_FLOPS = 85e9
COPY_BYTES = 10e9
# The FFT's two rates sit a sixth below those its transforms and products reach alone: so
# priced, it loses to the direct plan where that is faster (LeNet's conv2 and GoogLeNet's
# 5x5 layers at 14x14 of 24 and 32 channels: direct 12.7, 18.3 and 19.7 ms against FFT's
# 14.0, 24.0 and 27.0, one thread) and keeps the layers where it is (GoogLeNet's 5x5 at 28x28)
FFT_FLOPS = 5e9
CGEMM_FLOPS = 42e9
# the share of GEMM_FLOPS Winograd's batched GEMMs and transforms reach (36 GEMMs of a chunk
# of images each, and small-matrix transforms)
WINOGRAD_GEMM_SHARE = 0.7
# Winograd's transformed weights (36 values a kernel: 38 MB for 512 -> 512 channels), made
# three times an iteration (forward, the flipped kernel of backward-data, the filter
# gradient's), are fresh arrays each time, written at about this rate page faults included:
# on a 4x4 map they cost more than the products. With these two rates the model comes within
# 0.9-1.2x of Winograd's times on the 3x3 layers of VGG-16, GoogLeNet and AlexNet at one and
# two threads (1.65x on GoogLeNet's 28x28 layer)
FRESH_BYTES = 1.5e9
# Winograd is taken over a cheaper FFT, direct or image-by-image im2col plan priced within
# this factor: FFT and im2col image by image keep memory between forward and backward, which
# Winograd does not, and on the 3x3 layers of VGG-16, GoogLeNet and AlexNet the model prices
# FFT 1.5-3.2x below its times and the direct kernels 2.4x and more, Winograd 1.0-1.5x. Only
# im2col on shared columns (keeping nothing, priced within 0.85-1.35x) is taken over
# Winograd as soon as it is cheaper.
KEEPS_NOTHING_MARGIN = 2.5
# tiles in a row from which the copies in and out of tiles run at COPY_BYTES
WINOGRAD_FULL_ROW = 8
# the direct kernels' rate (kernels/direct.c, AVX-512) in the units of the rates above, which
# this machine reaches only about half of on another day: set from their times beside the
# other plans' on one day (CIFAR-10's 5x5 layers, forward + backward: direct 54 and 25 ms,
# FFT 62 and 31 ms, im2col 162 and 53 ms; LeNet's conv2 18.6 against FFT's 14.8 ms)
DIRECT_FLOPS = 150e9
# the weights a block of outputs streams (inputs x taps x 32 lanes of floats) must stay in the
# core's share of L2: beyond it the kernels run at a fraction of that rate (AlexNet's conv2
# 324 ms against FFT's 240; VGG's 4x4 layers of 512 channels 743 against im2col's 91)
DIRECT_CACHE_BYTES = 104 * 1024
DIRECT_LANES = 32
# below this many products per output (input channels x taps) a block of outputs has too few
# multiply-adds to pay for storing it (a 3x3 layer on 3 channels: 27; 2x slower than im2col)
DIRECT_MIN_PRODUCTS = 64
# beyond this many output positions an image's output gradient in lanes (positions x 32
# floats), which backward-filter streams once per tap, leaves the cache: VGG's 64x64 maps ran
# its backward at a tenth of the rate
DIRECT_MAX_POSITIONS = 1024
# outputs of a row computed together: a shorter row wastes the rest of the block
DIRECT_ROW = 8
# a layer with at most this many input channels reads the images themselves (a net's first:
# gray or colour), whose gradient nobody asks for: the model leaves its backward-data out
IMAGE_CHANNELS = 4
# the im2col columns a plan keeps at most: larger batches run a chunk of images at a time
# (a chunk's GEMMs stay thousands of columns wide). Two threads' chunks then stay in the
# shared L3 between their copy and their GEMM: against 32 MB, GoogLeNet's first layer took
# 286 ms for 318 (one thread), AlexNet's 114 for 124 (two), in less memory
IM2COL_CHUNK_BYTES = 8 * 1024 * 1024
# the columns a chunk of a shared im2col plan makes (channel-major layout: small maps), in the
# thread's scratch where Winograd's tiles lie (VGG's 4x4 layers of 512 channels: 28 images)
SHARED_COLUMN_BYTES = 8 * 1024 * 1024
# a product with at most this many rows against a large operand read transposed is made as
# its transpose (see _gemm)
FEW_ROWS = 128
# a GEMM from which cutting it over the threads pays for handing the parts out
SPLIT_GEMM_FLOPS = 4e6
# elementwise passes (numpy's ReLU; Concat's copies) of at least this many values run a part
# per thread
ELEMENTWISE_SPLIT = 1 << 18
# the compiled ReLU and Dropout hand their parts to the library's own threads
# (kernels/parts.c) in about 10 us: from this many values the second core pays
NATIVE_SPLIT = 1 << 16
# but a ReLU's forward mostly follows a GEMM, whose BLAS threads keep spinning on the other
# cores for a while after it: below this many values, waiting for one costs more than it saves
# (two threads: AlexNet's relu6, 128K values, 38% -> 29% of the copy bandwidth when split;
# VGG's relu5_1, 256K, 42% -> 59%)
RELU_FORWARD_SPLIT = 1 << 18
# the product a GEMM adds into its output is made this many bytes of rows at a time
ACCUMULATE_BLOCK_BYTES = 2 * 1024 * 1024
# Caffe's FLT_MIN, the floor inside log(prob) of a softmax loss
FLT_MIN = float(np.finfo(np.float32).tiny)


def conv_algorithm(geom, batch, parts=1):
    """'pointwise', 'winograd', 'fft', 'direct' or 'im2col': whichever a cost model of one forward +
    backward says is cheaper, for one of ``parts`` batch parts (one a thread, each with a plan
    of its own, which pays its weight-sized work in full).

    pointwise: 1x1 stride-1 unpadded layers are plain GEMMs on the arrays as they lie.
    im2col: three GEMMs (forward, filter, data) and two copies of the columns.
    FFT: transforms of input and output, each forward and back, and three batched complex
    GEMMs. FFT needs stride 1; it wins for 5x5 kernels on the maps of CIFAR-10 and AlexNet,
    and loses when the input has only a few channels (a net's first layer), where the
    transforms of the outputs outweigh the small GEMMs they replace.
    Winograd F(4x4, 3x3) (3x3 stride 1): three GEMMs with a quarter of im2col's multiplies on
    the tiles that cover the map, plus the tiles' transforms (small GEMMs) and copies.
    direct (2-D stride 1, one group, AVX-512): forward, backward-data and backward-filter with
    the output channels as vector lanes (a direction with few of them wastes the rest); it
    wins on 5x5 layers of tens of channels, where a GEMM's one narrow side slows the library.
    """
    if geom.is_pointwise:
        return "pointwise"
    if any(s != 1 for s in geom.stride) or geom.taps == 1:
        return "im2col"
    batch = -(-batch // parts)
    n, c, m, g = batch, geom.channels, geom.num_output, geom.group
    gemm = 2.0 * n * geom.out_count * m * (c // g) * geom.taps
    directions = 2 if c <= IMAGE_CHANNELS else 3          # no backward-data on images
    from .conv import lays_out_by_image
    keeps_columns = lays_out_by_image(geom)      # else the columns are made again for backward
    copies = directions - 1 if keeps_columns else directions
    times = {"im2col": directions * gemm / GEMM_FLOPS +
             copies * n * geom.out_count * geom.col_rows * 8 / COPY_BYTES}
    from . import winograd
    if winograd.serves(geom):
        times["winograd"] = winograd_time(geom, batch)
    try:
        from .fftconv import fft_shape
    except ImportError:                       # scipy is optional
        fft_shape = None
    if fft_shape is not None:
        shape = fft_shape(geom)
        points = float(np.prod(shape))
        freqs = points / shape[-1] * (shape[-1] // 2 + 1)
        transforms = 2 * (n * c + n * m)      # the weights' few taps go by small DFT GEMMs
        times["fft"] = transforms * 2.5 * points * np.log2(points) / FFT_FLOPS + \
            3 * 8.0 * n * m * (c // g) * freqs / CGEMM_FLOPS
    from . import direct
    if direct.serves(geom) and DIRECT_MIN_PRODUCTS <= c * geom.taps and \
            c * geom.taps * DIRECT_LANES * 4 <= DIRECT_CACHE_BYTES and \
            geom.out_count <= DIRECT_MAX_POSITIONS and geom.out_shape[-1] >= DIRECT_ROW:
        times["direct"] = direct_time(geom, batch)
    best = min(times, key=times.get)
    if times.get("winograd", np.inf) <= KEEPS_NOTHING_MARGIN * times[best]:
        # FFT keeps its input's and its weights' spectra from forward to backward (80 MB on
        # a 14x14 map of 160 -> 320 channels); Winograd keeps nothing
        best = "winograd"
        if not keeps_columns and times["im2col"] < times["winograd"]:
            best = "im2col"
    return best


def direct_time(geom, batch):
    """Seconds of one forward + backward by the direct kernels on ``batch`` images: each
    direction's multiply-adds with its output channels rounded up to whole lanes and its rows
    to whole blocks; backward-data by them or by a GEMM and col2im, whichever is cheaper
    (direct_data_by_gemm)."""
    forward = _direct_direction(geom.out_shape, geom.channels, geom.num_output, geom, batch)
    data = 0.0
    if geom.channels > IMAGE_CHANNELS:
        data = min(_direct_data_times(geom, batch))
    return 2 * forward + data                    # forward, filter; backward-data


def _direct_direction(positions, inputs, outputs, geom, batch):
    rows, cols = positions[0], -(-positions[1] // DIRECT_ROW) * DIRECT_ROW
    lanes = -(-outputs // DIRECT_LANES) * DIRECT_LANES
    return 2.0 * batch * rows * cols * lanes * inputs * geom.taps / DIRECT_FLOPS


def _direct_data_times(geom, batch):
    """(the direct kernels', a GEMM's and col2im's) seconds of backward-data. The kernels run
    it as a forward over the input's positions with the kernel's zero padding: a layer without
    padding (LeNet's conv2: 8x8 -> 12x12) multiplies mostly zeros, where W' dy's product is
    all useful and col2im (compiled) adds its columns back at the copies' rate."""
    direct = _direct_direction(geom.in_shape, geom.num_output, geom.channels, geom, batch)
    gemm = 2.0 * batch * geom.out_count * geom.num_output * geom.channels * geom.taps / \
        GEMM_FLOPS + batch * geom.out_count * geom.col_rows * 8 / COPY_BYTES
    return direct, gemm


def direct_data_by_gemm(geom, batch):
    """Whether the direct plan makes backward-data by a GEMM and col2im (see
    _direct_data_times)."""
    direct, gemm = _direct_data_times(geom, batch)
    return gemm < direct


def winograd_time(geom, batch):
    """Seconds of one forward + backward by Winograd F(4x4, 3x3) on ``batch`` images: the
    36 GEMMs of each direction over the tiles, the tiles' transforms (GEMMs with the 36x36,
    16x36 and 36x16 matrices) and the copies in and out of tiles, at the rates measured on
    this kind of CPU (its small GEMMs and strided copies run below the big GEMMs' rate)."""
    from . import winograd
    from .winograd import TILE
    n, c, m, g = batch, geom.channels, geom.num_output, geom.group
    per_axis = [-(-o // TILE) for o in geom.out_shape]
    tiles = n * int(np.prod(per_axis))
    core = 3 * 2.0 * 36 * tiles * m * (c // g)
    transforms = 2.0 * tiles * (36 * 36 * (2 * c + m) + 16 * 36 * (2 * m + c))
    copies = 4.0 * tiles * (36 * (2 * c + m) * 3 + 16 * (2 * m + c) * 2)
    # numpy's copies in and out of tiles run a row of tiles at a time: short rows copy slowly
    # (the compiled transforms gather and scatter 16 tiles at a time wherever they lie)
    row = 1.0 if winograd.compiled() else min(1.0, per_axis[-1] / float(WINOGRAD_FULL_ROW))
    weights = 3 * 36 * 4.0 * m * (c // g)
    return (core + transforms) / (GEMM_FLOPS * WINOGRAD_GEMM_SHARE) + \
        copies / (COPY_BYTES * row) + weights / FRESH_BYTES


# glibc's mallopt parameters, and the values the backend sets (32 MB is glibc's largest mmap
# threshold on 64-bit)
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
_MMAP_THRESHOLD = 32 << 20
_TRIM_THRESHOLD = 1 << 30


def keep_freed_memory():
    """Let the C allocator keep freed blocks of up to 32 MB for reuse.

    An iteration allocates and frees the same temporaries every time (FFT outputs, GEMM
    results, a few MB each). glibc returns a freed block above its mmap threshold (128 KB, raised
    only after such a block is freed) to the system and trims the top of its heap, so each of
    them page-faults again on first touch: thousands of faults an iteration, several ms of a
    LeNet iteration. A no-op where the C library is not glibc, or where MALLOC_MMAP_THRESHOLD_ /
    MALLOC_TRIM_THRESHOLD_ in the environment already chose."""
    if "MALLOC_MMAP_THRESHOLD_" in os.environ or "MALLOC_TRIM_THRESHOLD_" in os.environ:
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    return bool(mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD) and
                mallopt(_M_TRIM_THRESHOLD, _TRIM_THRESHOLD))


def _assign(out, src):
    out[...] = src


def _add_into(y, x):
    np.add(y, x, out=y)


class HostStream:
    """The CPU's queue of copies: every copy is done when it returns, so there is nothing to
    wait for."""

    def synchronize(self):
        pass


class HostEvent:
    """An event on the CPU: complete as soon as it is recorded."""

    def __init__(self):
        self._at = time.perf_counter()

    def record(self, stream=None):
        self._at = time.perf_counter()

    def query(self):
        return True

    def synchronize(self):
        pass

    def elapsed_ms(self, start):
        return (self._at - start._at) * 1000.0


class CPUBackend(PReLUOps, LossOps, CommonOps, RecurrentOps, MVNOps, Backend):
    """The op set of backend/ops.py over numpy."""
    name = "cpu"
    xp = np                    # the array namespace layers use for light elementwise work

    def __init__(self):
        # With several threads, convolution and pooling run per batch part, one part per
        # thread (split.py), so every copy and pass uses every core, not only BLAS and the
        # FFT; large GEMMs are cut over the same threads. BLAS itself is then held to one
        # thread: its idle workers spin after each call and take the core from the parts.
        self.split_threads = thread_count()
        if self.split_threads > 1:
            set_blas_threads(1)
        keep_freed_memory()

    # -- memory ----------------------------------------------------------------------------
    def zeros(self, shape, dtype=None):
        return np.zeros(shape, dtype=dtype or self.dtype)

    def empty(self, shape, dtype=None):
        return np.empty(shape, dtype=dtype or self.dtype)

    def to_device(self, array, dtype=None):
        return np.ascontiguousarray(array, dtype=dtype or self.dtype)

    def to_host(self, array):
        return np.asarray(array)

    def synchronize(self):
        pass

    def describe(self):
        return ["Backend: CPU (numpy %s)" % np.__version__,
                "Threads: %d" % self.split_threads]

    # -- the seam's device side, as it is on the host --------------------------------------
    def pinned_empty(self, shape, dtype=np.float32):
        return np.empty(shape, dtype)

    def stream(self, non_blocking=False):
        return HostStream()

    def event(self):
        return HostEvent()

    def copy_to_host(self, dst, src, stream=None):
        dst.reshape(-1)[...] = np.asarray(src).reshape(-1)

    def enter_thread(self):
        pass

    def leave_thread(self):
        pass

    def transfers_now(self):
        return Transfers()

    # -- BLAS ------------------------------------------------------------------------------
    def gemm(self, a, b, trans_a=False, trans_b=False, alpha=1.0, beta=0.0, out=None):
        """out = alpha * op(a) @ op(b) + beta * out."""
        m = a.shape[1] if trans_a else a.shape[0]
        k = a.shape[0] if trans_a else a.shape[1]
        n = b.shape[0] if trans_b else b.shape[1]
        if self.split_threads > 1 and 2.0 * m * n * k >= SPLIT_GEMM_FLOPS:
            # BLAS runs on one thread here: cut the output's longer side over the threads
            if out is None:
                out = np.empty((m, n), dtype=np.result_type(a, b))
                beta = 0.0
            if m >= n:
                def part(i, lo, hi):
                    rows = a[:, lo:hi] if trans_a else a[lo:hi]
                    self._gemm(rows, b, trans_a, trans_b, alpha, beta, out[lo:hi])
                over_parts(part, m, self.split_threads)
            else:
                def part(i, lo, hi):
                    cols = b[lo:hi] if trans_b else b[:, lo:hi]
                    self._gemm(a, cols, trans_a, trans_b, alpha, beta, out[:, lo:hi])
                over_parts(part, n, self.split_threads)
            return out
        return self._gemm(a, b, trans_a, trans_b, alpha, beta, out)

    def _gemm(self, a, b, trans_a, trans_b, alpha, beta, out):
        """out = alpha op(a) @ op(b) + beta out, on the calling thread's BLAS."""
        if out is not None and beta != 0.0 and _ACCUMULATING_GEMM is not None and \
                out.dtype == a.dtype == b.dtype == np.float32 and out.flags.c_contiguous:
            # BLAS adds into out itself: no temporary the size of out, no extra pass.
            # Row-major out is column-major out.T = op(b).T @ op(a).T.
            result = _ACCUMULATING_GEMM(alpha, b.T, a.T, beta=beta, c=out.T,
                                        trans_a=int(trans_b), trans_b=int(trans_a),
                                        overwrite_c=1)
            if not np.shares_memory(result, out):
                out[...] = result.T
            return out
        if beta == 0.0 and trans_b and not trans_a and a.ndim == b.ndim == 2 and \
                a.shape[0] <= FEW_ROWS and b.shape[0] >= 2 * a.shape[0]:
            # a batch's rows times a weight matrix of at least twice as many rows read
            # transposed (InnerProduct's forward): OpenBLAS runs the transposed product, the
            # weights untransposed times the thin rows, faster (fc7 of VGG, 32 rows: 29 -> 18
            # ms at one thread; LeNet's ip1 in halves of 250 outputs: 0.40 -> 0.32 ms)
            result = np.matmul(b, a.T).T
            if alpha != 1.0:
                result *= alpha
            if out is None:
                return np.ascontiguousarray(result)
            np.copyto(out, result)
            return out
        a = a.T if trans_a else a
        b = b.T if trans_b else b
        if out is None or beta == 0.0:
            if out is None:
                result = a @ b
            else:
                result = np.matmul(a, b, out=out)
            if alpha != 1.0:
                result *= alpha
            return result
        if beta != 1.0:
            out *= beta
        # a block of rows at a time: a product the size of out (fc6's weight gradient: 151 MB)
        # would be a temporary as large, for one add
        if out.ndim != 2 or a.ndim != 2:
            out += (a @ b) * alpha if alpha != 1.0 else a @ b
            return out
        rows = max(1, ACCUMULATE_BLOCK_BYTES // max(1, out.shape[1] * out.itemsize))
        for lo in range(0, out.shape[0], rows):
            block = a[lo:lo + rows] @ b
            if alpha != 1.0:
                block *= alpha
            out[lo:lo + rows] += block
        return out

    def sumsq(self, x):
        x = x.ravel()
        return float(np.dot(x, x))

    # -- vision ----------------------------------------------------------------------------
    def conv_plan(self, geom, batch=None):
        """A plan for a ConvGeometry: forward(x, w, bias, y),
        backward(x, dy, w, dx=None, dw=None, dbias=None) and prepare(x), over the whole batch.
        With the batch size known, the cost model's cheapest plan (conv_algorithm)."""
        split = batch and self.split_threads > 1 and batch >= self.split_threads
        algorithm = conv_algorithm(geom, batch, self.split_threads if split else 1) \
            if batch else "im2col"
        if split:
            from .split import SplitConvPlan
            weights = None
            if algorithm == "fft":
                # the weight spectrum is the same for every part: one, shared
                from .fftconv import WeightSpectrum
                weights = WeightSpectrum()
            return SplitConvPlan(geom, lambda n: self._conv_plan(geom, algorithm, 1, n,
                                                                 weights=weights),
                                 self.split_threads, shared=weights)
        return self._conv_plan(geom, algorithm, batch=batch)

    def _conv_plan(self, geom, algorithm, fft_workers=None, batch=None, weights=None):
        if algorithm == "pointwise":
            from .pointwise import PointwiseConvPlan
            return PointwiseConvPlan(geom, self.dtype)
        if algorithm == "winograd":
            from .winograd import WinogradConvPlan
            return WinogradConvPlan(geom, self.dtype)
        if algorithm == "direct":
            from .direct import DirectConvPlan
            return DirectConvPlan(geom, self.dtype, data_by_gemm=bool(batch) and
                                  geom.channels > IMAGE_CHANNELS and
                                  direct_data_by_gemm(geom, batch))
        if algorithm == "fft":
            from .fftconv import FFTConvPlan
            plan = FFTConvPlan(geom, self.dtype, weights=weights)
            if fft_workers:
                plan.workers = fft_workers
            return plan
        from .conv import ConvPlan, lays_out_by_image
        per_image = geom.col_rows * geom.out_count * np.dtype(self.dtype).itemsize
        if batch and not geom.is_pointwise and not lays_out_by_image(geom):
            # columns in the thread's scratch, a chunk at a time, made again for backward
            from .split import ChunkedConvPlan
            return ChunkedConvPlan(geom,
                                   lambda k, columns: ConvPlan(geom, self.dtype, shared=True),
                                   max(1, SHARED_COLUMN_BYTES // per_image))
        if batch and not geom.is_pointwise and batch * per_image > IM2COL_CHUNK_BYTES:
            # columns of the whole batch would be hundreds of MB: a chunk at a time
            from .split import ChunkedConvPlan
            return ChunkedConvPlan(geom,
                                   lambda k, columns: ConvPlan(geom, self.dtype, columns),
                                   max(1, IM2COL_CHUNK_BYTES // per_image))
        return ConvPlan(geom, self.dtype)

    def im2col(self, x, geom):
        """Caffe's Im2col layout: (N, C, *in) -> (N, C*taps, *out), rows ordered (c, taps)."""
        from .conv import im2col
        n = x.shape[0]
        col = im2col(x, geom)
        return np.ascontiguousarray(
            col.reshape(geom.col_rows, n, geom.out_count).transpose(1, 0, 2)).reshape(
                (n, geom.col_rows) + geom.out_shape)

    def col2im(self, col, geom):
        """The adjoint of im2col: (N, C*taps, *out) -> (N, C, *in), overlapping taps summed."""
        from .conv import col2im
        n = col.shape[0]
        cm = np.ascontiguousarray(
            col.reshape(n, geom.col_rows, geom.out_count).transpose(1, 0, 2)).reshape(
                geom.col_rows, n * geom.out_count)
        return col2im(cm, geom, n)

    def pool_plan(self, geom):
        """A PoolPlan for a PoolGeometry: max/ave/stochastic forward and backward."""
        from .pool import PoolPlan
        if self.split_threads > 1:
            from .split import SplitPoolPlan
            return SplitPoolPlan(geom, lambda: PoolPlan(geom, self.dtype), self.split_threads)
        return PoolPlan(geom, self.dtype)

    def lrn_forward(self, x, size, alpha, beta, k, across_channels, out=None, state=None):
        """(top, state) of Caffe's LRN on (N, C, H, W); state goes to lrn_backward. ``out``
        receives top; the buffers of an earlier ``state`` of the same shape are reused."""
        from .lrn import lrn_forward
        return lrn_forward(x, size, alpha, beta, k, across_channels, out=out, state=state)

    def lrn_backward(self, x, top, state, dy, size, alpha, beta, across_channels, out=None):
        """d bottom of lrn_forward, written into ``out`` when given."""
        from .lrn import lrn_backward
        return lrn_backward(x, top, state, dy, size, alpha, beta, across_channels, out=out)

    # -- light work: the named ops layers call, so one layer runs on every backend ---------
    # (the CUDA backend has the same names over its kernels; see backend/ops.py)
    def upload(self, host, out):
        """out <- host, values of the same count (a batch into its blob)."""
        out[...] = host if host.shape == out.shape else host.reshape(out.shape)
        return out

    def fill(self, out, value):
        out[...] = value
        return out

    def copy(self, src, out):
        """out <- src, values of the same count (a part per thread where large: the net's
        fold of split gradients copies whole blobs)."""
        self._over_flat_parts(_assign, out, src if src.shape == out.shape
                              else src.reshape(out.shape))
        return out

    def axpby(self, alpha, x, beta, y):
        """y = alpha x + beta y."""
        if alpha == 1.0 and beta == 1.0:
            self._over_flat_parts(_add_into, y, x)       # the fold of split gradients
            return y
        if beta != 1.0:
            y *= beta
        y += x if alpha == 1.0 else alpha * x
        return y

    def scale(self, alpha, x, out=None):
        if out is None:
            x *= alpha
            return x
        np.multiply(x, alpha, out=out)
        return out

    def sum(self, x):
        return float(np.sum(x, dtype=np.float64))

    def add_bias(self, y, bias):
        """y (outer, channels, inner) += bias (channels)."""
        if y.shape[2] == 1:
            rows = y.reshape(y.shape[:2])
            rows += bias
        else:
            y += bias.reshape(1, -1, 1)
        return y

    def add_bias_grad(self, dy, dbias):
        """dbias (channels) += dy (outer, channels, inner) summed over outer and inner."""
        if dy.shape[2] == 1:
            dbias += dy.reshape(dy.shape[:2]).sum(axis=0)
        else:
            dbias += dy.sum(axis=(0, 2), dtype=np.float64).astype(np.float32)
        return dbias

    def _over_flat_parts(self, fn, *arrays, split=None):
        """fn(*parts) on flat parts of same-size contiguous arrays, one per thread where the
        arrays are large enough for the parts to pay (``split`` values, ELEMENTWISE_SPLIT
        unless given: a pass over memory uses one core's share of the bandwidth), else
        fn(*arrays) once."""
        n = arrays[0].size
        split = ELEMENTWISE_SPLIT if split is None else split
        if self.split_threads <= 1 or n < split or \
                not all(a.flags.c_contiguous for a in arrays):
            fn(*arrays)
            return
        flat = [a.reshape(-1) for a in arrays]
        over_parts(lambda i, lo, hi: fn(*(a[lo:hi] for a in flat)), n, self.split_threads)

    def _native_parts(self, x, split=None):
        """How many parts a compiled elementwise pass over x runs in."""
        return self.split_threads if x.size >= (split or NATIVE_SPLIT) else 1

    def relu_forward(self, x, y, slope):
        # the compiled pass where it can run: numpy's maximum goes a value at a time
        if native.lib is not None and native.takes(x, y):
            native.relu_forward(x, y, slope, self._native_parts(x, RELU_FORWARD_SPLIT))
            return

        def run(x, y):
            # Caffe's arithmetic with any slope: 0 * min(-inf, 0) makes -inf's output NaN
            with np.errstate(invalid="ignore"):
                y[...] = np.maximum(x, 0) + np.float32(slope) * np.minimum(x, 0)
        self._over_flat_parts(run, x, y)

    def relu_backward(self, x, dy, dx, slope):
        if native.lib is not None and native.takes(x, dy, dx):
            native.relu_backward(x, dy, dx, slope, self._native_parts(x))
            return

        def run(x, dy, dx):
            positive = x > 0
            if slope:
                dx[...] = dy * np.where(positive, 1.0, slope).astype(dy.dtype)
            else:
                np.multiply(dy, positive, out=dx)     # no temporary, one pass
        self._over_flat_parts(run, x, dy, dx)

    def neuron_forward(self, kind, x, y, *params):
        """y = the neuron map ``kind`` of x (neuron.py); returns what its backward also
        reads besides x and y (swish: the sigmoid), else None."""
        from .neuron import FORWARD
        return FORWARD[kind](x, y, *params)

    def neuron_backward(self, kind, dy, *arrays_and_params):
        """dx of the neuron map ``kind``: (dy, inputs..., dx, params...)."""
        from .neuron import BACKWARD, BACKWARD_INPUTS
        count = BACKWARD_INPUTS.get(kind, 1) + 1
        arrays, params = arrays_and_params[:count], arrays_and_params[count:]
        BACKWARD[kind](dy, *arrays, *params)
        return arrays[-1]

    def axis_copy(self, part, whole, axis, offset, to_whole):
        """Concat/Slice: the part at ``offset`` along ``axis`` of whole; to_whole copies
        part -> whole, else whole -> part. Along a later axis than the first, a large copy
        runs a slice of the first axis (the batch) per thread: a copy uses one core's share
        of the bandwidth (GoogLeNet's inception outputs: 9.5 GB/s of 20)."""
        index = (slice(None),) * axis + (slice(offset, offset + part.shape[axis]),)

        def run(i, lo, hi):
            if to_whole:
                whole[lo:hi][index] = part[lo:hi]
            else:
                part[lo:hi] = whole[lo:hi][index]
        if axis >= 1 and self.split_threads > 1 and part.size >= ELEMENTWISE_SPLIT and \
                part.shape[0] >= self.split_threads:
            over_parts(run, part.shape[0], self.split_threads)
        elif to_whole:
            whole[index] = part
        else:
            part[...] = whole[index]

    def eltwise_forward(self, op, xs, coeffs, y):
        """Eltwise PROD / SUM (with coefficients) / MAX of the arrays ``xs`` into y; returns
        MAX's argmax (int32: which input won), else None."""
        if op == "prod":
            out = xs[0] * xs[1]
            for x in xs[2:]:
                out *= x
        elif op == "sum":
            out = coeffs[0] * xs[0]
            for c, x in zip(coeffs[1:], xs[1:]):
                out += c * x
        else:
            # ties between the first two go to input 1, later ones keep the earlier winner
            first = xs[0] > xs[1]
            out = np.where(first, xs[0], xs[1])
            argmax = np.where(first, 0, 1).astype(np.int32)
            for i, x in enumerate(xs[2:], 2):
                better = x > out
                out = np.where(better, x, out)
                argmax[better] = i
            y[...] = out
            return argmax
        y[...] = out
        return None

    def eltwise_backward(self, op, i, xs, y, dy, dx, coeffs, argmax, stable_prod_grad):
        """dx of input ``i`` of eltwise_forward."""
        if op == "prod":
            if stable_prod_grad:
                others = None
                for j, x in enumerate(xs):
                    if j != i:
                        others = x.copy() if others is None else others * x
            else:
                others = y / xs[i]
            dx[...] = others * dy
        elif op == "sum":
            dx[...] = coeffs[i] * dy
        else:
            dx[...] = dy * (argmax == i)

    def crop_copy(self, big, small, offsets, to_small):
        """Crop: small <- the window of big at ``offsets`` (to_small), or that window <-
        small (the rest of big untouched)."""
        index = tuple(slice(o, o + s) for o, s in zip(offsets, small.shape))
        if to_small:
            small[...] = big[index]
        else:
            big[index] = small

    def tile_forward(self, x, y):
        """y (outer, tiles, inner) = x (outer, 1, inner) repeated."""
        y[...] = x

    def tile_backward(self, dy, dx):
        """dx (outer, 1, inner) = dy (outer, tiles, inner) summed over the tiles."""
        dx[...] = dy.sum(axis=1).reshape(dx.shape)

    # -- Embed: rows of a table by index --------------------------------------------------
    def embed_forward(self, indices, index_values, weight, y):
        """y (count, N) = weight[indices]; ``indices`` are the checked host integers (the
        device reads ``index_values``, the bottom's own array)."""
        y[...] = weight[indices]

    def embed_backward(self, indices, index_values, dy, weight_diff):
        """weight_diff[indices] += dy, repeated indices summed."""
        np.add.at(weight_diff, indices, dy)

    # -- Scale and Bias over (outer, dim, inner) ------------------------------------------
    def scale_forward(self, x, scale, bias, y):
        """y = x scale[d] (+ bias[d])."""
        out = x * scale.reshape(1, -1, 1)
        if bias is not None:
            out += bias.reshape(1, -1, 1)
        y[...] = out

    def scale_backward(self, x, scale, dy, dx):
        """dx = dy scale[d]."""
        dx[...] = dy * scale.reshape(1, -1, 1)

    def broadcast_grad(self, dy, grad, accumulate, x=None):
        """grad (dim) (+)= dy (times x) summed over outer and inner, in float64."""
        total = (dy if x is None else dy * x).sum(axis=(0, 2), dtype=np.float64)
        if accumulate:
            grad += total.reshape(grad.shape)
        else:
            grad[...] = total.reshape(grad.shape)

    # -- BatchNorm over (num, channels, spatial) -------------------------------------------
    def batchnorm_batch(self, x, eps, out):
        """out = x normalised by its own per-channel statistics; returns (std, mean,
        variance), the statistics in float64."""
        mean = x.mean(axis=(0, 2), dtype=np.float64)
        centred = x - mean.reshape(1, -1, 1).astype(x.dtype)
        variance = np.square(centred).mean(axis=(0, 2), dtype=np.float64)
        std = np.sqrt(np.asarray(variance, dtype=np.float64) + eps).astype(x.dtype)
        np.divide(centred, std.reshape(1, -1, 1), out=out)
        return std, mean, variance

    def batchnorm_global(self, x, mean_sum, variance_sum, factor, eps, out):
        """out = x normalised by stored statistics (sums times ``factor``); returns std."""
        mean = mean_sum * factor
        variance = variance_sum * factor
        centred = x - mean.reshape(1, -1, 1)
        std = np.sqrt(np.asarray(variance, dtype=np.float64) + eps).astype(x.dtype)
        np.divide(centred, std.reshape(1, -1, 1), out=out)
        return std

    def batchnorm_backward(self, dy, y, std, global_stats, dx):
        std = std.reshape(1, -1, 1)
        if global_stats:
            dx[...] = dy / std
        else:
            # mean and variance depend on x: dx = (dy - mean(dy) - y mean(dy y)) / std
            mean_dy = dy.mean(axis=(0, 2), keepdims=True)
            mean_dy_y = (dy * y).mean(axis=(0, 2), keepdims=True)
            dx[...] = (dy - mean_dy - y * mean_dy_y) / std

    def running_average(self, stat, fraction, value, scale=1.0):
        """stat = stat fraction + scale value (BatchNorm's running sums)."""
        stat[...] = stat * fraction + (value if scale == 1.0 else scale * value)

    def dropout_forward(self, x, y, key, ratio, scale):
        dropout.apply(x, y, key, ratio, scale, self._native_parts(x))
        return key

    def dropout_backward(self, key, dy, dx, ratio, scale):
        dropout.apply(dy, dx, key, ratio, scale, self._native_parts(dy))

    def softmax_forward(self, x, y):
        """y = softmax of x (outer, channels, inner) along channels, shifted by the max."""
        if native.softmax and native.takes(x, y):
            # one compiled pass for numpy's dozen; slices of outer side by side where it pays
            n = x.shape[0]
            if self.split_threads <= 1 or x.size < ELEMENTWISE_SPLIT or n < 2:
                return native.softmax_forward(x, y)
            over_parts(lambda i, lo, hi: native.softmax_forward(x[lo:hi], y[lo:hi]), n,
                       self.split_threads)
            return y
        e = np.exp(x - x.max(axis=1, keepdims=True))
        e /= e.sum(axis=1, keepdims=True)
        y[...] = e
        return y

    def softmax_backward(self, y, dy, dx):
        dx[...] = (dy - (dy * y).sum(axis=1, keepdims=True)) * y
        return dx

    @staticmethod
    def _label_positions(labels, shape, ignore_label):
        """(labels as ints, valid mask, labels safe to index with, any out of range)."""
        outer, channels, inner = shape
        labels = labels.reshape(outer, inner).astype(np.int64)
        valid = np.ones(labels.shape, dtype=bool) if ignore_label is None else \
            labels != ignore_label
        bad = valid & ((labels < 0) | (labels >= channels))
        return labels, valid, np.where(valid, labels, 0), bool(bad.any())

    def softmax_loss_forward(self, prob, labels, ignore_label):
        """(summed -log p(label), count not ignored); NaN for a label out of range."""
        if native.softmax and native.takes(prob, labels):
            return native.softmax_loss_forward(prob, labels, ignore_label)
        _, valid, safe, bad = self._label_positions(labels, prob.shape, ignore_label)
        if bad:
            return float("nan"), float(valid.sum())
        p_true = np.take_along_axis(prob, safe[:, None, :], axis=1)[:, 0, :]
        # the ignored are left out, not multiplied by 0: a NaN there is not the loss's
        log_p = np.log(np.maximum(p_true[valid], FLT_MIN)).astype(np.float64)
        return -float(log_p.sum()), float(valid.sum())

    def softmax_loss_backward(self, prob, labels, ignore_label, scale, dx):
        """dx = scale (prob - onehot(label)), zero where the label is ignored."""
        if native.softmax and native.takes(prob, labels, dx):
            return native.softmax_loss_backward(prob, labels, ignore_label, scale, dx)
        _, valid, safe, _ = self._label_positions(labels, prob.shape, ignore_label)
        grad = prob.copy()
        grad -= np.arange(prob.shape[1])[None, :, None] == safe[:, None, :]
        grad *= valid[:, None, :]
        grad *= scale
        dx[...] = grad
        return dx

    def accuracy(self, scores, labels, top_k, ignore_label, per_class=False):
        """(hits, counted[, per-class accuracies]) of top-k over (outer, channels, inner)."""
        _, valid, safe, bad = self._label_positions(labels, scores.shape, ignore_label)
        if bad:
            return (float("nan"), float(valid.sum())) + ((None,) if per_class else ())
        true_score = np.take_along_axis(scores, safe[:, None, :], axis=1)
        # the true class itself is among the ">=" ones, so a hit needs at most top_k of them
        hit = ((scores >= true_score).sum(axis=1) <= top_k) & valid
        result = (float(hit.sum()), float(valid.sum()))
        if per_class:
            seen = np.bincount(safe[valid], minlength=scores.shape[1])
            correct = np.bincount(safe[hit], minlength=scores.shape[1])
            result += (np.where(seen > 0, correct / np.maximum(seen, 1), 0.0),)
        return result
