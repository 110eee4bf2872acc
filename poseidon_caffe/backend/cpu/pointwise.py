"""1x1 stride-1 unpadded convolution as GEMMs that keep nothing between calls.

Such a convolution is y[n] = W x[n] for each image, (M, C) x (C, H*W). Three ways, chosen by
the map size and what the CPU has:

- kernels (AVX-512 and the compiled kernels, maps up to KERNELS_MAX positions): the batch's
  columns as one run, 48 at a time packed in cache across images (kernels/image_gemm.c), for
  the forward, the backward-data (W' dy) and the filter gradient (its depth the batch's
  positions); no copy of the batch and no GEMM of a few dozen columns.
- images (maps of PER_IMAGE_MIN positions and more): one GEMM per image on the (N, C, H*W)
  arrays as they lie, no copy in or out; the filter gradient sums dy[n] x[n]' over a few
  images at a time.
- columns (smaller maps, where a per-image GEMM of a few dozen columns runs slowly): a chunk
  of images is transposed to (C, images*H*W) in the thread's scratch so that one GEMM covers
  the chunk, and the result is transposed back (the input's copy is remade in backward rather
  than kept).

With groups, each group is the same on its slice of channels.
"""
import numpy as np

from . import native, threads

# positions per map from which per-image GEMMs are as fast as the transposed chunks (measured
# on GoogLeNet's maps: ahead at 28x28, behind at 14x14 and 7x7)
PER_IMAGE_MIN = 400
# positions per map up to which the compiled kernels run (56x56; on maps of thousands of
# positions more, OpenBLAS's per-image filter gradient is ahead: its depth is one long run)
KERNELS_MAX = 4096
# bytes of the largest work array of one chunk (transposed input or output, or the per-image
# filter gradients)
CHUNK_BYTES = 4 * 1024 * 1024


def serves(geom):
    return geom.is_pointwise


class PointwiseConvPlan:
    """A ConvPlan with the same calls (forward / backward / prepare) for 1x1 convolutions."""

    def __init__(self, geom, dtype=np.float32):
        if not geom.is_pointwise:
            raise ValueError("a pointwise plan needs a 1x1 stride-1 unpadded convolution, got "
                             "%r" % (geom,))
        self.geom = geom
        self.dtype = dtype
        # the compiled kernels (when they can run), else the GEMMs in ``layout``
        self.kernels = native.image_gemm and geom.out_count <= KERNELS_MAX
        self.layout = "images" if geom.out_count >= PER_IMAGE_MIN else "columns"
        g = geom
        self.mg, self.cg = g.num_output // g.group, g.channels // g.group

    # -- sizes ---------------------------------------------------------------------------------
    def _chunk(self, n):
        g = self.geom
        if self.layout == "images":     # per-image filter gradients, (M, C/G) each
            per = g.num_output * self.cg * 4
        else:                  # the transposed input or output of an image
            per = max(g.channels, g.num_output) * g.out_count * 4
        return max(1, min(n, CHUNK_BYTES // per))

    def workspace_bytes(self, n):
        """Nothing of this plan's own: its work arrays are the thread's scratch."""
        return 0

    def shared_workspace_bytes(self, n):
        """A chunk's work arrays, in the thread's scratch that every layer shares."""
        g = self.geom
        if self.kernels and native.lib is not None:
            return 0
        k = self._chunk(n)
        if self.layout == "images":
            cells = k * g.num_output * self.cg
        else:
            cells = k * g.out_count * (g.channels + g.num_output)
        return cells * np.dtype(self.dtype).itemsize

    # -- views ---------------------------------------------------------------------------------
    def _images(self, a, channels):
        """(N, C, *space) -> (N, G, C/G, positions)."""
        g = self.geom
        return a.reshape(a.shape[0], g.group, channels // g.group, g.out_count)

    def _weights(self, w):
        g = self.geom
        return w.reshape(g.group, self.mg, self.cg)

    def _to_columns(self, a, channels, lo, hi, name):
        """Images [lo, hi) of ``a`` as (G, C/G, k*positions), in the thread's scratch."""
        g = self.geom
        k = hi - lo
        cols = threads.scratch(name, (g.group, channels // g.group, k, g.out_count), self.dtype)
        np.copyto(cols, self._images(a[lo:hi], channels).transpose(1, 2, 0, 3))
        return cols.reshape(g.group, channels // g.group, k * g.out_count)

    def _from_columns(self, cols, a, channels, lo, hi, bias=None):
        g = self.geom
        k = hi - lo
        src = cols.reshape(g.group, channels // g.group, k, g.out_count).transpose(2, 0, 1, 3)
        dst = self._images(a[lo:hi], channels)
        if bias is None:
            np.copyto(dst, src)
        else:
            np.add(src, bias.reshape(1, g.group, -1, 1), out=dst)

    # -- the plan's calls ----------------------------------------------------------------------
    def prepare(self, x):
        """Nothing to keep: backward-filter reads x itself."""

    def forward(self, x, w, bias, y):
        g = self.geom
        if self._by_kernels(x, w, y, bias):
            for group in range(g.group):
                native.gemm_images(self._group_weights(w, group), x, self._group(group, g.channels),
                                   y, self._group(group, g.num_output),
                                   None if bias is None else bias[group * self.mg:], g.out_count)
            return y
        wg = self._weights(w)
        if self.layout == "images":
            yv = self._images(y, g.num_output)
            np.matmul(wg, self._images(x, g.channels), out=yv)
            if bias is not None:
                yv += bias.reshape(1, g.group, -1, 1)
            return y
        n = x.shape[0]
        k = self._chunk(n)
        for lo in range(0, n, k):
            hi = min(n, lo + k)
            xc = self._to_columns(x, g.channels, lo, hi, "pointwise_x")
            yc = threads.scratch("pointwise_y", (g.group, self.mg, xc.shape[2]), self.dtype)
            np.matmul(wg, xc, out=yc)
            self._from_columns(yc, y, g.num_output, lo, hi, bias)
        return y

    def backward(self, x, dy, w, dx=None, dw=None, dbias=None):
        g = self.geom
        if dbias is not None:
            dbias += self._images(dy, g.num_output).sum(axis=(0, 3)).reshape(-1)
        if dw is None and dx is None:
            return
        if self._by_kernels(x, dy, w, dx, dw):
            self._backward_by_kernels(x, dy, w, dx, dw)
            return
        if self.layout == "images":
            self._backward_per_image(x, dy, w, dx, dw)
            return
        n = dy.shape[0]
        k = self._chunk(n)
        wt = self._weights(w).transpose(0, 2, 1)
        dwg = None if dw is None else dw.reshape(g.group, self.mg, self.cg)
        for lo in range(0, n, k):
            hi = min(n, lo + k)
            dyc = self._to_columns(dy, g.num_output, lo, hi, "pointwise_y")
            if dwg is not None:
                xc = self._to_columns(x, g.channels, lo, hi, "pointwise_x")
                dwg += np.matmul(dyc, xc.transpose(0, 2, 1))
            if dx is not None:
                dxc = threads.scratch("pointwise_x", (g.group, self.cg, dyc.shape[2]),
                                      self.dtype)
                np.matmul(wt, dyc, out=dxc)
                self._from_columns(dxc, dx, g.channels, lo, hi)

    def _by_kernels(self, *arrays):
        """Whether this call runs the compiled kernels: chosen, the library loaded (not
        POSEIDON_NATIVE=0) and every array given C-contiguous float32; else ``layout``'s
        GEMMs run."""
        return self.kernels and native.lib is not None and native.image_gemm and \
            native.takes(*(a for a in arrays if a is not None))

    def _group(self, group, channels):
        """The offset (floats) of a group's first channel in an image of ``channels``."""
        return group * (channels // self.geom.group) * self.geom.out_count

    def _group_weights(self, w, group):
        """Group ``group``'s (M/G, C/G) weights, a view."""
        return w.reshape(self.geom.group, self.mg, self.cg)[group]

    def _backward_by_kernels(self, x, dy, w, dx, dw):
        g = self.geom
        for group in range(g.group):
            wg = self._group_weights(w, group)
            dyg = self._group(group, g.num_output)
            if dw is not None:
                native.gemm_images_filter(dy, dyg, x, self._group(group, g.channels),
                                          dw.reshape(g.group, self.mg, self.cg)[group],
                                          g.out_count)
            if dx is not None:
                native.gemm_images(wg.T, dy, dyg, dx, self._group(group, g.channels), None,
                                   g.out_count)

    def _backward_per_image(self, x, dy, w, dx, dw):
        g = self.geom
        dyv = self._images(dy, g.num_output)
        if dw is not None:
            xv = self._images(x, g.channels)
            n = dy.shape[0]
            k = self._chunk(n)
            dwg = dw.reshape(g.group, self.mg, self.cg)
            for lo in range(0, n, k):
                hi = min(n, lo + k)
                part = threads.scratch("pointwise_dw", (hi - lo, g.group, self.mg, self.cg),
                                       self.dtype)
                np.matmul(dyv[lo:hi], xv[lo:hi].transpose(0, 1, 3, 2), out=part)
                dwg += part.sum(axis=0)
        if dx is not None:
            np.matmul(self._weights(w).transpose(0, 2, 1), dyv, out=self._images(dx, g.channels))
