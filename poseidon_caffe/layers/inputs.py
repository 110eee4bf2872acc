"""Layer family: inputs that need no dataset: Input, DummyData and MemoryData."""
import numpy as np

from .base import Layer
from .registry import register
from .. import log


def _shape_of(blob_shape):
    return tuple(int(d) for d in blob_shape.dim)


@register("Input")
class InputLayer(Layer):
    device_ready = True
    """Tops whose data the caller writes (net.blobs[...].data[...] = ...); shapes from
    input_param.shape, given once for all tops or once per top."""
    exact_bottoms = 0
    min_tops = 1

    def setup(self, bottom, top):
        shapes = self.param.input_param.shape
        if len(shapes) not in (0, 1, len(top)):
            raise self.error("Must specify 'shape' once, once per top blob, or not at all: "
                             "%d tops vs. %d shapes" % (len(top), len(shapes)))
        for i, blob in enumerate(top):
            if shapes:
                blob.reshape(_shape_of(shapes[0 if len(shapes) == 1 else i]))

    def reshape(self, bottom, top):
        """The caller owns the shapes; nothing follows from bottoms."""

    def forward(self, bottom, top):
        """The data is already in the tops."""


@register("DummyData")
class DummyDataLayer(Layer):
    device_ready = True            # filled on the host, copied in when a layer reads
    """Tops filled by fillers: constant ones once at setup, the others again on every forward."""
    exact_bottoms = 0
    min_tops = 1

    def setup(self, bottom, top):
        from ..fillers import fill, constant_filler
        self._fill = fill
        p = self.param.dummy_data_param
        n = len(top)
        if len(p.data_filler) not in (0, 1, n):
            raise self.error("Number of data fillers must be 0, 1 or equal to the number of "
                             "tops: %d tops vs. %d fillers" % (n, len(p.data_filler)))
        if len(p.data_filler) == 0:
            fillers = [constant_filler(0.0)] * n
        elif len(p.data_filler) == 1:
            fillers = [p.data_filler[0]] * n
        else:
            fillers = list(p.data_filler)
        self.fillers = fillers
        self.refill = [f.type != "constant" for f in fillers]
        for blob, shape in zip(top, self._shapes(n)):
            blob.reshape(shape)
        for i, blob in enumerate(top):
            if not self.refill[i]:
                fill(blob, self.fillers[i])

    def _shapes(self, n):
        p = self.param.dummy_data_param
        legacy = (len(p.num), len(p.channels), len(p.height), len(p.width))
        if any(legacy):
            if len(p.shape):
                raise self.error("Both shape and legacy fields (num, channels, height, width) "
                                 "were specified")
            for name, size in zip(("num", "channels", "height", "width"), legacy):
                if size not in (1, n):
                    raise self.error("Must specify '%s' once, or once per top blob (%d); "
                                     "specified %d" % (name, n, size))
            pick = lambda field, i: int(field[0 if len(field) == 1 else i])  # noqa: E731
            return [(pick(p.num, i), pick(p.channels, i), pick(p.height, i), pick(p.width, i))
                    for i in range(n)]
        if len(p.shape) not in (1, n):
            raise self.error("Must specify 'shape' once, or once per top blob (%d); "
                             "specified %d" % (n, len(p.shape)))
        return [_shape_of(p.shape[0 if len(p.shape) == 1 else i]) for i in range(n)]

    def reshape(self, bottom, top):
        """Shapes are fixed by the parameters at setup."""

    def forward(self, bottom, top):
        for i, blob in enumerate(top):
            if self.refill[i]:
                self._fill(blob, self.fillers[i])


@register("MemoryData")
class MemoryDataLayer(Layer):
    """Batches from arrays handed over by ``set_input_arrays`` (pycaffe's net.set_input_arrays):
    data N x C x H x W and labels N, served batch_size at a time, wrapping at the end.
    As in Caffe, arrays given this way are not transformed (a transform_param is warned about)."""
    device_ready = True
    exact_bottoms = 0
    exact_tops = 2

    def setup(self, bottom, top):
        p = self.param.memory_data_param
        self.batch_size = int(p.batch_size)
        self.item_shape = (int(p.channels), int(p.height), int(p.width))
        if self.batch_size * int(np.prod(self.item_shape)) <= 0:
            raise self.error("batch_size, channels, height, and width must be specified and "
                             "positive in memory_data_param")
        self._data = None
        self._labels = None
        self._pos = 0
        top[0].reshape((self.batch_size,) + self.item_shape)
        top[1].reshape((self.batch_size,))

    def set_input_arrays(self, data, labels):
        """Keep references to ``data`` (N x C x H x W float32, C-contiguous) and ``labels``
        (N, or N x 1 x 1 x 1 float32); N must be a multiple of batch_size."""
        if isinstance(labels, np.ndarray) and labels.ndim == 1:
            labels = np.ascontiguousarray(labels[:, None, None, None])
        self._check_array(data, "data array", self.item_shape)
        self._check_array(labels, "labels array", (1, 1, 1))
        if data.shape[0] != labels.shape[0]:
            raise self.error("data and labels must have the same first dimension (%d vs %d)"
                             % (data.shape[0], labels.shape[0]))
        if data.shape[0] % self.batch_size != 0:
            raise self.error("first dimensions of input arrays must be a multiple of batch "
                             "size (%d items, batch_size %d)" % (data.shape[0], self.batch_size))
        if self.param.HasField("transform_param"):
            log.warning("%s layer %r does not transform array data given by set_input_arrays",
                        self.type, self.name)
        self._data = data
        self._labels = labels.reshape(-1)
        self._pos = 0

    def _check_array(self, arr, what, chw):
        if not isinstance(arr, np.ndarray):
            raise self.error("%s must be a numpy array, not %s" % (what, type(arr).__name__))
        if not arr.flags["C_CONTIGUOUS"]:
            raise self.error("%s must be C contiguous" % what)
        if arr.ndim != 4:
            raise self.error("%s must be 4-d; its shape is %s" % (what, arr.shape))
        if arr.dtype != np.float32:
            raise self.error("%s must be float32, not %s" % (what, arr.dtype))
        for axis, name in ((1, "channels"), (2, "height"), (3, "width")):
            if arr.shape[axis] != chw[axis - 1]:
                raise self.error("%s has wrong %s: %d, expected %d"
                                 % (what, "number of channels" if axis == 1 else name,
                                    arr.shape[axis], chw[axis - 1]))

    def reshape(self, bottom, top):
        top[0].reshape((self.batch_size,) + self.item_shape)
        if top[1].count != self.batch_size:
            top[1].reshape((self.batch_size,))

    def forward(self, bottom, top):
        if self._data is None:
            raise self.error("needs its data first: call set_input_arrays(data, labels)")
        start, end = self._pos, self._pos + self.batch_size
        top[0].reshape((self.batch_size,) + self.item_shape)
        # Caffe sets up the labels as (N,) but serves them as N x 1 x 1 x 1
        top[1].reshape((self.batch_size, 1, 1, 1))
        self.backend.upload(self._data[start:end], top[0].mutable_dev_data)
        self.backend.upload(self._labels[start:end], top[1].mutable_dev_data)
        self._pos = end % self._data.shape[0]
