"""Blob: an N-d array of data and one of gradients (diff) on a backend, as Caffe's Blob."""
import math

import numpy as np

from .backend import get_backend

MAX_BLOB_AXES = 32
MAX_BLOB_COUNT = 2 ** 63 - 1


class _DiffOf:
    """The "pool" of a blob whose diff is another blob's (Blob.borrow_diff_of)."""

    def __init__(self, blob):
        self.blob = blob

    def take(self, slot, shape):
        return self.blob.diff.reshape(shape)


class Blob:
    """Storage is allocated on first use, not at reshape: a net can shape every blob, add up
    what they will need and refuse a net that cannot fit before any large array exists.

    ``data`` and ``diff`` are host arrays (numpy) that a user may read and write. Layers use
    ``dev_data``/``dev_diff`` to read and ``mutable_dev_data``/``mutable_dev_diff`` to write:
    the backend's own arrays. On the CPU all six are the same numpy arrays; on a device backend
    the blob is a ``SyncedBlob`` (Caffe's SyncedMemory rule, below)."""

    def __new__(cls, shape=(), backend=None, dtype=None):
        if cls is Blob and (backend or get_backend()).on_device:
            cls = SyncedBlob
        return object.__new__(cls)

    def __init__(self, shape=(), backend=None, dtype=None):
        self._backend = backend or get_backend()
        self._dtype = dtype or self._backend.dtype
        self._shape = ()
        self._data = None
        self._diff = None
        # a blob sharing another's data before that data exists takes it on first use
        self._data_source = None
        self._data_shared = False
        self._diff_pool = None         # (DiffPool, slot) when the diff is a pooled view
        # run once before the data is first read (a deferred filler, see fillers.deferred)
        self.before_first_use = None
        self.reshape(shape)

    # -- shape -----------------------------------------------------------------------------
    def reshape(self, *shape):
        if len(shape) == 1 and type(shape[0]) is tuple and shape[0] == self._shape:
            return          # every forward asks again: the checks below cost a layer ~10 calls
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
        # math.prod, not numpy's: a layer reads counts at every reshape, numpy's costs µs
        return math.prod(self._shape)

    def count_axes(self, start, end=None):
        end = self.num_axes if end is None else end
        return math.prod(self._shape[start:end])

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
            if self._diff_pool is not None:
                pool, slot = self._diff_pool
                self._diff = pool.take(slot, self._shape)
            else:
                self._diff = self._backend.zeros(self._shape, self._dtype)
        return self._diff

    @diff.setter
    def diff(self, value):
        self.diff[...] = value

    # the backend's arrays, for layers: on the CPU the host arrays themselves
    dev_data = mutable_dev_data = data
    dev_diff = mutable_dev_diff = diff

    # the host arrays for reading only (a loss read, a snapshot): on a device they are copied
    # back when behind, without making the host the head (Caffe's cpu_data), so nothing is
    # copied up again afterwards; writes to them are not seen
    host_data = data
    host_diff = diff
    data_on_host = True          # whether reading host_data copies nothing

    def zero_diff(self):
        """diff = 0 where it lives (the solver clears parameter gradients each iteration)."""
        self.diff[...] = 0

    def _shared_or_new_data(self):
        source = self._data_source
        if source is None:
            return self._backend.zeros(self._shape, self._dtype)
        if source.count != self.count:
            raise ValueError("blob of shape %s shares the data of a blob that now has shape %s"
                             % (self._shape, source.shape))
        return source.data.reshape(self._shape)

    def borrow_diff(self, pool, slot):
        """Let the diff be a view into ``pool``'s buffer ``slot``, shared with other blobs
        whose diffs are never needed at the same time (see net.diff_sharing)."""
        self._diff_pool = (pool, slot)
        self._diff = None

    def borrow_diff_of(self, other):
        """Let the diff be ``other``'s, in this blob's shape (of the same count): a consumer
        of a folded Split writes or adds its gradient straight into the Split's input (see
        net.split_folding). Called again after ``other`` borrows a diff of its own."""
        self._diff_pool = (_DiffOf(other), None)
        self._diff = None

    @property
    def borrows_diff(self):
        return self._diff_pool is not None

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


class SyncedBlob(Blob):
    """A blob on a device backend: data and diff are each one SyncedMemory (Caffe's rule: the
    memory lives where it was last written -- host, device or both -- and is copied only when
    the other side reads it).

    ``data``/``diff`` give the host array, current, and make the host the head: numpy writes
    cannot be seen, so any host access counts as a possible write (Caffe's mutable_cpu_data),
    and the next device read copies the array up once. A host array kept across a device
    write is stale: read ``blob.data`` again after a forward. ``dev_data``/``dev_diff`` give a
    current device view (Caffe's gpu_data); ``mutable_dev_data``/``mutable_dev_diff`` also make
    the device the head (mutable_gpu_data)."""

    # _data/_diff hold SyncedMemory objects here, shared between blobs that share storage
    def _memory(self, which):
        mem = getattr(self, which)
        if mem is None:
            if which == "_data":
                source = self._data_source
                if source is not None:
                    if source.count != self.count:
                        raise ValueError("blob of shape %s shares the data of a blob that now "
                                         "has shape %s" % (self._shape, source.shape))
                    mem = source._memory("_data")
                else:
                    mem = self._backend.synced_memory(self.count)
                self._data, self._data_source = mem, None
                hook, self.before_first_use = self.before_first_use, None
                if hook is not None:
                    hook()
            else:
                mem = self._diff = self._backend.synced_memory(self.count)
        return mem

    def reshape(self, *shape):
        old_count = self.count
        data, diff, source, shared = self._data, self._diff, self._data_source, \
            self._data_shared
        self._data = self._diff = None
        super().reshape(*shape)
        if self.count == old_count:
            # the memory is flat: a new shape is only a new view of it
            self._data, self._diff, self._data_source, self._data_shared = \
                data, diff, source, shared

    def _host(self, which):
        return self._memory(which).mutable_cpu_data().reshape(self._shape)

    def _device(self, which, mutable):
        mem = self._memory(which)
        ptr = mem.mutable_gpu_data() if mutable else mem.gpu_data()
        return self._backend.view(ptr, self._shape, mem)

    data = property(lambda self: self._host("_data"),
                    lambda self, value: self._host("_data").__setitem__(Ellipsis, value))
    diff = property(lambda self: self._host("_diff"),
                    lambda self, value: self._host("_diff").__setitem__(Ellipsis, value))
    host_data = property(lambda self: self._memory("_data").cpu_data().reshape(self._shape))
    host_diff = property(lambda self: self._memory("_diff").cpu_data().reshape(self._shape))
    dev_data = property(lambda self: self._device("_data", False))
    dev_diff = property(lambda self: self._device("_diff", False))
    mutable_dev_data = property(lambda self: self._device("_data", True))
    mutable_dev_diff = property(lambda self: self._device("_diff", True))

    @property
    def data_on_host(self):
        return self._memory("_data").host_current

    @property
    def synced_data(self):
        """The SyncedMemory of data (its head and copy counts, for tests and tools)."""
        return self._memory("_data")

    @property
    def synced_diff(self):
        return self._memory("_diff")

    def zero_diff(self):
        self._backend.fill(self.mutable_dev_diff, 0.0)

    def share_data(self, other):
        if other.count != self.count:
            raise ValueError("cannot share data of %d values with a blob of %d"
                             % (other.count, self.count))
        if other._data is None:
            self._data, self._data_source = None, other
        else:
            self._data, self._data_source = other._data, None
        self._data_shared = True

    def update(self):
        self._backend.axpby(-1.0, self.dev_diff, 1.0, self.mutable_dev_data)
