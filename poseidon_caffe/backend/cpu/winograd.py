"""3x3 stride-1 convolution by Winograd's minimal filtering F(4x4, 3x3), as wide GEMMs.

Each 4x4 block of outputs is computed from the 6x6 block of input under it: with V = B' d B
(the input tile transformed), U = G g G' (the kernel transformed) and Y = A' (U * V) A, the 36
elementwise products replace 144 multiply-adds of the direct form. Summed over the input
channels, the products at each of the 36 positions are one GEMM, (M, C) x (C, tiles), with
every tile of a chunk of images side by side in its columns, so the GEMMs run wide and the
multiply count is 4x lower than im2col's. The kernel's transform is a small GEMM with the 36x9
Kronecker product of the 1-D matrices. Where the compiled kernels are built, the tiles'
transforms are kernels/winograd.c's (each channel's windows gathered and transformed by the two
6x6 products in registers, the products scattered back into the map with the bias); numpy's
path copies into tiles and multiplies by the 36x36 (input) and 16x36 (output) Kronecker
products, 3x the multiply-adds and a pass over memory of their own.

    backward-data    a forward of dy with the flipped, in/out-swapped kernel (pad 2 - pad)
    backward-filter  dU = sum over tiles (A dY_tile A') V_tile', then dW = G' dU G

Nothing is kept between calls: the input transform is remade in backward, and the work arrays
are the calling thread's scratch (threads.scratch), shared by every layer and sized for a chunk
of images, so a net of many layers holds one set of them; so are the transformed kernel and
its gradient, sized for the largest layer.

Interpolation points 0, 1, -1, 1/2, -2 (and infinity) gave the smallest float32 error of the
sets tried (about 2e-6 of the output's scale, some 5x direct summation's).
"""
from fractions import Fraction

import numpy as np
from numpy.lib.stride_tricks import as_strided

from . import native, threads

TILE = 4                                  # outputs per tile side
KERNEL = 3
POINTS = (0, 1, -1, Fraction(1, 2), -2)   # finite interpolation points; infinity is the last
# bytes of the largest work array of one chunk, unless that leaves a chunk's 36 GEMMs fewer
# than MIN_TILES columns: measured best between L2 and the shared L3 (at 8 MB, two threads'
# chunks ran GoogLeNet's 28x28 layers and VGG's 64x64 and 32x32 ones 1.2-1.5x slower), and
# layers of many channels on small maps (VGG's 8x8 of 512, AlexNet's 13x13 of 384) keep
# their GEMMs wide
CHUNK_BYTES = 4 * 1024 * 1024
MIN_TILES = 128


def _poly_mul(p, q):
    out = [Fraction(0)] * (len(p) + len(q) - 1)
    for i, x in enumerate(p):
        for j, y in enumerate(q):
            out[i + j] += x * y
    return out


def winograd_matrices(m=TILE, r=KERNEL, points=POINTS):
    """(AT (m, a), G (a, r), BT (a, a)) of F(m, r), a = m + r - 1, exact (Toom-Cook over the
    a - 1 finite points and infinity): y = AT [(G g) * (BT d)] is the correlation
    y[i] = sum_k d[i + k] g[k]."""
    a = m + r - 1
    pts = [Fraction(p) for p in points[:a - 1]]
    if len(pts) != a - 1:
        raise ValueError("F(%d, %d) needs %d finite points" % (m, r, a - 1))
    at = [[p ** i for p in pts] + [Fraction(int(i == m - 1))] for i in range(m)]
    g = []
    for j, pj in enumerate(pts):
        den = Fraction(1)
        for pl in pts[:j] + pts[j + 1:]:
            den *= pj - pl
        g.append([pj ** k / den for k in range(r)])
    g.append([Fraction(int(k == r - 1)) for k in range(r)])
    bt = []
    for j in range(a):
        poly = [Fraction(1)]
        for pl in (pts[:j] + pts[j + 1:] if j < a - 1 else pts):
            poly = _poly_mul(poly, [-pl, Fraction(1)])
        bt.append(poly + [Fraction(0)] * (a - len(poly)))
    as_array = lambda rows: np.array([[float(v) for v in row] for row in rows])  # noqa: E731
    return as_array(at), as_array(g), as_array(bt)


_MATRICES = {}


def _kron_matrices(dtype):
    """The 2-D transforms as matrices on row-major flattened tiles: AT (m*m, a*a),
    G (a*a, 9), BT (a*a, a*a), and the transposes backward-filter uses."""
    key = np.dtype(dtype)
    if key not in _MATRICES:
        at, g, bt = winograd_matrices()
        kron = [np.kron(x, x) for x in (at, g, bt)]
        _MATRICES[key] = tuple(np.ascontiguousarray(x, dtype=dtype) for x in
                               kron + [kron[0].T, kron[1].T])
    return _MATRICES[key]


_SIDES = []


def _side_matrices():
    """(B', A, A') of F(4x4, 3x3) as float32, for the compiled transforms (winograd.c): the
    input's windows take B' on both sides, the output gradient's tiles A (6x4), the products A'
    (4x6)."""
    if not _SIDES:
        at, _, bt = winograd_matrices()
        _SIDES.extend(np.ascontiguousarray(m, dtype=np.float32) for m in (bt, at.T, at))
    return _SIDES


def serves(geom):
    """Whether this plan computes the geometry: 2-D, 3x3, stride 1, no dilation, pad <= 2."""
    return (geom.nd == 2 and geom.kernel == (KERNEL, KERNEL) and geom.stride == (1, 1)
            and geom.dilation == (1, 1) and all(p <= KERNEL - 1 for p in geom.pad))


def compiled():
    """Whether the compiled transforms (kernels/winograd.c) are there to run."""
    return native.lib is not None


def _native(*arrays):
    """Whether the compiled transforms take these arrays."""
    return compiled() and native.takes(*arrays)


def _pieces(out, tiles, m):
    """[(tile lo, tile hi, rows per tile)]: the whole tiles of an axis of ``out`` outputs, and
    the last, partial one."""
    whole = out // m
    pieces = [(0, whole, m)] if whole else []
    if whole < tiles:
        pieces.append((whole, tiles, out - whole * m))
    return pieces


class WinogradConvPlan:
    """A ConvPlan with the same calls (forward / backward / prepare), by F(4x4, 3x3)."""

    def __init__(self, geom, dtype=np.float32):
        if not serves(geom):
            raise ValueError("Winograd F(4x4, 3x3) needs a 2-D 3x3 stride-1 undilated "
                             "convolution with pad <= 2, got %r" % (geom,))
        self.geom = geom
        self.dtype = dtype
        self.m = TILE
        self.a = TILE + KERNEL - 1
        self.tiles = tuple(-(-o // self.m) for o in geom.out_shape)
        self.tile_count = self.tiles[0] * self.tiles[1]
        # the padded input the tiles read: every tile's 6x6 window inside it
        self.padded = tuple(t * self.m + KERNEL - 1 for t in self.tiles)
        self._flipped = None

    # -- sizes ---------------------------------------------------------------------------------
    def chunk(self, n):
        """Images per chunk: the largest work array (36 positions of the wider side's
        channels for every tile) near CHUNK_BYTES, or the images of MIN_TILES tiles where
        that is more, at least one image."""
        g = self.geom
        per_image = self.a * self.a * max(g.channels, g.num_output) * self.tile_count * 4
        wide = -(-MIN_TILES // self.tile_count)
        return max(1, min(n, max(CHUNK_BYTES // per_image, wide)))

    def workspace_bytes(self, n):
        """Nothing of this plan's own: its work arrays are the thread's scratch."""
        return 0

    def shared_workspace_bytes(self, n):
        """The chunk's work arrays, in the thread's scratch that every layer shares."""
        g = self.geom
        k = self.chunk(n)
        cells = (self.a * self.a * k * self.tile_count * (2 * g.channels + 2 * g.num_output)
                 + k * g.channels * self.padded[0] * self.padded[1])
        return cells * np.dtype(self.dtype).itemsize

    # -- transforms ----------------------------------------------------------------------------
    def _kernel(self, w):
        """U (36, G, M/G, C/G): the transformed kernel."""
        g = self.geom
        gk = _kron_matrices(self.dtype)[1]
        mg, cg = g.num_output // g.group, g.channels // g.group
        flat = w.reshape(g.num_output * cg, KERNEL * KERNEL).T
        u = self._weights_array()
        np.matmul(gk, flat, out=u.reshape(self.a * self.a, -1))
        return u

    def _weights_array(self):
        """An array for the transformed kernel or its gradient (36, G, M/G, C/G): the thread's
        scratch. Whole, they are 4x the weights (38 MB for 512 -> 512 channels), which glibc
        would map afresh and page-fault in at every call, three times an iteration; and the
        largest of them is live at the net's peak anyway (a backward's)."""
        g = self.geom
        shape = (self.a * self.a, g.group, g.num_output // g.group, g.channels // g.group)
        return threads.scratch("winograd_u", shape, self.dtype)

    def _input_tiles(self, x, lo, hi):
        """V (36, C, k*tiles): the transformed 6x6 tiles of images [lo, hi) of x."""
        g = self.geom
        k = hi - lo
        a, m = self.a, self.m
        (ph, pw), (h, w) = g.pad, g.in_shape
        th, tw = self.tiles
        v = threads.scratch("winograd_v", (a * a, g.channels, k * self.tile_count), self.dtype)
        if _native(x[lo:hi], v):
            return native.winograd_in(x[lo:hi], v, _side_matrices()[0], a, m, g.pad,
                                      self.tiles)
        d = threads.scratch("gathered_input", (a, a, g.channels, k, th, tw), self.dtype)
        self._gather_tiles(x[lo:hi], d)
        np.matmul(_kron_matrices(self.dtype)[2], d.reshape(a * a, -1),
                  out=v.reshape(a * a, -1))
        return v

    def _gather_tiles(self, x, d):
        """d (a, a, C, k, th, tw) = the windows of x by numpy: x into a zero-bordered copy,
        then one strided copy."""
        g = self.geom
        k = x.shape[0]
        m = self.m
        (ph, pw), (h, w) = g.pad, g.in_shape
        hp, wp = self.padded
        xp = threads.scratch("padded_input", (k, g.channels, hp, wp), self.dtype)
        # zero only the border, then the interior is the input
        xp[:, :, :ph] = 0
        xp[:, :, ph + h:] = 0
        xp[:, :, ph:ph + h, :pw] = 0
        xp[:, :, ph:ph + h, pw + w:] = 0
        xp[:, :, ph:ph + h, pw:pw + w] = x
        s = xp.strides
        np.copyto(d, as_strided(xp, shape=d.shape, writeable=False,
                                strides=(s[2], s[3], s[1], s[0], s[2] * m, s[3] * m)))

    def _output_gradient_tiles(self, dy, lo, hi):
        """Z (36, M, k*tiles) = A dY A' of each 4x4 tile of images [lo, hi) of dy (zero past
        the outputs): the output gradient at the 36 positions."""
        g = self.geom
        k, m, a2 = hi - lo, self.m, self.a * self.a
        th, tw = self.tiles
        z = threads.scratch("winograd_y", (a2, g.num_output, k * self.tile_count), self.dtype)
        if _native(dy[lo:hi], z):
            return native.winograd_in(dy[lo:hi], z, _side_matrices()[1], m, m, (0, 0),
                                      self.tiles)
        t = threads.scratch("winograd_dyt", (m, m, g.num_output, k, th, tw), self.dtype)
        self._each_piece(dy[lo:hi], t, into_tiles=True)
        np.matmul(_kron_matrices(self.dtype)[3], t.reshape(m * m, -1), out=z.reshape(a2, -1))
        return z

    def _each_piece(self, image, tiles, into_tiles, bias=None):
        """Copies between ``image`` (k, M, oh, ow) and ``tiles`` (m, m, M, k, th, tw), piece by
        piece (whole tiles, then the partial last row and column of tiles): into the tiles
        (zero where a partial tile passes the outputs), or out of them (plus ``bias``)."""
        m = self.m
        (oh, ow), (th, tw) = self.geom.out_shape, self.tiles
        k, channels = image.shape[:2]
        for r0, r1, rows in _pieces(oh, th, m):
            for c0, c1, cols in _pieces(ow, tw, m):
                region = image[:, :, r0 * m:r0 * m + (r1 - r0) * rows,
                               c0 * m:c0 * m + (c1 - c0) * cols]
                region = region.reshape(k, channels, r1 - r0, rows, c1 - c0, cols)
                # (m, m, M, k, th, tw) -> (k, M, th, m, tw, m)
                part = tiles[:rows, :cols, :, :, r0:r1, c0:c1].transpose(3, 2, 4, 0, 5, 1)
                if into_tiles:
                    np.copyto(part, region)
                    if rows < m:
                        tiles[rows:, :, :, :, r0:r1, c0:c1] = 0
                    if cols < m:
                        tiles[:, cols:, :, :, r0:r1, c0:c1] = 0
                elif bias is None:
                    np.copyto(region, part)
                else:
                    np.add(part, bias.reshape(1, -1, 1, 1, 1, 1), out=region)

    # -- the plan's calls ----------------------------------------------------------------------
    def prepare(self, x):
        """Nothing to keep: backward remakes the input transform from x."""

    def forward(self, x, w, bias, y):
        g = self.geom
        a2, m = self.a * self.a, self.m
        at = _kron_matrices(self.dtype)[0]
        u = self._kernel(w)
        n = x.shape[0]
        k = self.chunk(n)
        mg, cg = g.num_output // g.group, g.channels // g.group
        for lo in range(0, n, k):
            hi = min(n, lo + k)
            cols = (hi - lo) * self.tile_count
            v = self._input_tiles(x, lo, hi)
            prod = threads.scratch("winograd_y", (a2, g.group, mg, cols), self.dtype)
            np.matmul(u, v.reshape(a2, g.group, cg, cols), out=prod)
            if _native(y[lo:hi], prod, *([] if bias is None else [bias])):
                native.winograd_out(prod, _side_matrices()[2], bias, y[lo:hi], m, self.tiles)
                continue
            out = threads.scratch("winograd_o", (m, m, g.num_output, hi - lo) + self.tiles,
                                  self.dtype)
            np.matmul(at, prod.reshape(a2, -1), out=out.reshape(m * m, -1))
            self._each_piece(y[lo:hi], out, into_tiles=False, bias=bias)
        return y

    def backward(self, x, dy, w, dx=None, dw=None, dbias=None):
        g = self.geom
        if dbias is not None:
            dbias += dy.sum(axis=(0, 2, 3))
        if dw is not None:
            self._filter_gradient(x, dy, dw)
        if dx is not None:
            self._flipped_plan().forward(dy, self._flipped_kernel(w), None, dx)

    def _filter_gradient(self, x, dy, dw):
        g = self.geom
        a2 = self.a * self.a
        g_t = _kron_matrices(self.dtype)[4]
        mg, cg = g.num_output // g.group, g.channels // g.group
        n = dy.shape[0]
        k = self.chunk(n)
        # dU is 4x the kernel (38 MB for 512 -> 512 channels): the first chunk's product is
        # written into it, later ones added
        du = self._weights_array()
        for lo in range(0, n, k):
            hi = min(n, lo + k)
            cols = (hi - lo) * self.tile_count
            z = self._output_gradient_tiles(dy, lo, hi).reshape(a2, g.group, mg, cols)
            v = self._input_tiles(x, lo, hi).reshape(a2, g.group, cg, cols)
            if lo == 0:
                np.matmul(z, v.transpose(0, 1, 3, 2), out=du)
            else:
                du += np.matmul(z, v.transpose(0, 1, 3, 2))
        grad = g_t @ du.reshape(a2, -1)                      # (9, M * C/G)
        dw += grad.T.reshape(dw.shape)

    # -- backward-data: a forward convolution of dy ---------------------------------------------
    def _flipped_plan(self):
        if self._flipped is None:
            from ..geometry import ConvGeometry
            g = self.geom
            pad = tuple(KERNEL - 1 - p for p in g.pad)
            self._flipped = WinogradConvPlan(
                ConvGeometry(g.num_output, g.channels, g.out_shape, g.kernel, g.stride, pad,
                             g.dilation, g.group), self.dtype)
        return self._flipped

    def _flipped_kernel(self, w):
        """(M, C/G, 3, 3) -> (C, M/G, 3, 3) per group, flipped on both spatial axes."""
        g = self.geom
        gr = g.group
        wf = w.reshape((gr, g.num_output // gr, g.channels // gr) + g.kernel).swapaxes(1, 2)
        return np.ascontiguousarray(wf[..., ::-1, ::-1]).reshape(
            (g.channels, g.num_output // gr) + g.kernel)
