"""Blob: an N-d array of data and one of gradients (diff) on a backend, as Caffe's Blob."""
import math

import numpy as np

from .backend import get_backend

MAX_BLOB_AXES = 32
MAX_BLOB_COUNT = 2 ** 63 - 1


class Blob:
    """Storage is allocated on first use, not at reshape: a net can shape every blob, add up
    what they will need and refuse a net that cannot fit before any large array exists."""

    def __init__(self, shape=(), backend=None, dtype=None):
        self._backend = backend or get_backend()
        self._dtype = dtype or self._backend.dtype
        self._shape = ()
        self._data = None
        self._diff = None
        # a blob sharing another's data before that data exists takes it on first use
        self._data_source = None
        self._data_shared = False
        # run once before the data is first read (a deferred filler, see fillers.deferred)
        self.before_first_use = None
        self.reshape(shape)

    # -- shape -----------------------------------------------------------------------------
    def reshape(self, *shape):
        if len(shape) == 1 and not np.isscalar(shape[0]):
            shape = shape[0]
        shape = tuple(int(s) for s in shape)
        if len(shape) > MAX_BLOB_AXES:
            raise ValueError("blob shape %s has more than %d axes" % (shape, MAX_BLOB_AXES))
        if any(s < 0 for s in shape):
            raise ValueError("blob shape %s has a negative dimension" % (shape,))
        if math.prod(shape) > MAX_BLOB_COUNT:
            # the count would wrap around in int64 arithmetic and look small
            raise ValueError("blob shape %s has %d values, more than an array can index"
                             % (shape, math.prod(shape)))
        if shape == self._shape:
            return
        old_count = self.count
        self._shape = shape
        if self.count == old_count:
            # same storage, new view: keeps sharing (in-place layers, shared params) intact
            if self._data is not None:
                self._data = self._data.reshape(shape)
            if self._diff is not None:
                self._diff = self._diff.reshape(shape)
        else:
            self._data = self._diff = None
            self._data_source = None
            self._data_shared = False

    @property
    def shape(self):
        return self._shape

    @property
    def num_axes(self):
        return len(self._shape)

    @property
    def count(self):
        return int(np.prod(self._shape, dtype=np.int64)) if self._shape else 1

    def count_axes(self, start, end=None):
        end = self.num_axes if end is None else end
        return int(np.prod(self._shape[start:end], dtype=np.int64))

    def canonical_axis_index(self, axis):
        n = self.num_axes
        if not -n <= axis < max(n, 1):
            raise ValueError("axis %d out of range for a %d-axis blob of shape %s"
                             % (axis, n, self._shape))
        return axis + n if axis < 0 else axis

    def _legacy(self, index):
        # Caffe's num/channels/height/width: axes 0..3, missing ones read as 1
        if self.num_axes > 4:
            raise ValueError("legacy accessor used on a blob of shape %s" % (self._shape,))
        padded = self._shape + (1,) * (4 - self.num_axes)
        return padded[index]

    num = property(lambda self: self._legacy(0))
    channels = property(lambda self: self._legacy(1))
    height = property(lambda self: self._legacy(2))
    width = property(lambda self: self._legacy(3))

    def shape_string(self):
        return " ".join(str(s) for s in self._shape) + " (%d)" % self.count

    @property
    def nbytes(self):
        """Bytes of one of data or diff (what each takes once allocated)."""
        return self.count * np.dtype(self._dtype).itemsize

    @property
    def shares_data(self):
        """Whether data is another blob's storage (counts once, under that blob)."""
        return self._data_shared

    # -- storage ---------------------------------------------------------------------------
    @property
    def data(self):
        if self._data is None:
            self._data = self._shared_or_new_data()
            self._data_source = None
            hook, self.before_first_use = self.before_first_use, None
            if hook is not None:
                hook()
        return self._data

    @data.setter
    def data(self, value):
        self.data[...] = value

    @property
    def diff(self):
        if self._diff is None:
            self._diff = self._backend.zeros(self._shape, self._dtype)
        return self._diff

    @diff.setter
    def diff(self, value):
        self.diff[...] = value

    def _shared_or_new_data(self):
        source = self._data_source
        if source is None:
            return self._backend.zeros(self._shape, self._dtype)
        if source.count != self.count:
            raise ValueError("blob of shape %s shares the data of a blob that now has shape %s"
                             % (self._shape, source.shape))
        return source.data.reshape(self._shape)

    @property
    def has_diff(self):
        return self._diff is not None

    @property
    def allocated(self):
        return self._data is not None

    @property
    def backend(self):
        return self._backend

    def share_data(self, other):
        if other.count != self.count:
            raise ValueError("cannot share data of %d values with a blob of %d"
                             % (other.count, self.count))
        if other._data is None:
            self._data, self._data_source = None, other
        else:
            self._data, self._data_source = other._data.reshape(self._shape), None
        self._data_shared = True

    def update(self):
        """data -= diff, the last step of Caffe's solver update."""
        data = self.data
        data -= self.diff

    def __repr__(self):
        return "<Blob %s>" % (self._shape,)
