"""HDF5Data (batches from the HDF5 files a source list names) and HDF5Output (every batch of
two bottoms appended to one HDF5 file). h5py is needed only when such a layer is built."""
import os
import weakref

import numpy as np

from ... import data as data_pkg
from ... import log
from ...data import db as dbmod
from ..base import Layer, TRAIN
from ..registry import register
from .prefetching import _child_rng


def _h5py(where):
    try:
        import h5py
    except ImportError:
        raise dbmod.DataError("%s needs h5py, which is not installed: pip install "
                              "'poseidon-caffe[hdf5]' (or pip install h5py)" % where) from None
    return h5py


@register("HDF5Data")
class HDF5DataLayer(Layer):
    device_ready = True            # batches are written on the host and copied in once
    """Batches from the HDF5 files a source list names; one dataset per top, read whole per
    file, rows in order (or shuffled per file, files in shuffled order, with ``shuffle``)."""
    exact_bottoms = 0
    min_tops = 1

    def setup(self, bottom, top):
        p = self.param.hdf5_data_param
        self.where = "HDF5Data layer %r" % self.name
        self.h5py = _h5py(self.where)
        if p.batch_size <= 0:
            raise self.error("hdf5_data_param.batch_size must be positive")
        if not os.path.isfile(p.source):
            raise self.error("HDF5 source list %s does not exist" % p.source)
        with open(p.source) as f:
            self.files = [line.strip() for line in f if line.strip()]
        if not self.files:
            raise self.error("HDF5 source list %s names no files" % p.source)
        log.info("Number of HDF5 files: %d", len(self.files))
        self.top_names = list(self.param.top)
        while len(self.top_names) < len(top):
            self.top_names.append("top%d" % len(self.top_names))
        self.rng = _child_rng()
        rank, size, _ = data_pkg.get_worker()
        self.rank, self.size = (rank, size) if self.phase == TRAIN else (0, 1)
        self.file_order = list(range(len(self.files)))
        if p.shuffle:
            self.file_order = list(self.rng.permutation(len(self.files)))
        self.file_pos = 0
        self.offset = 0
        self._load_file(self.file_order[0])
        self._shapes = [(p.batch_size,) + arr.shape[1:] for arr in self.arrays]

    def _load_file(self, index):
        path = self.files[index]
        if not os.path.isfile(path):
            raise self.error("HDF5 file %s (listed in %s) does not exist"
                             % (path, self.param.hdf5_data_param.source))
        arrays = []
        try:
            with self.h5py.File(path, "r") as f:
                for name in self.top_names:
                    if name not in f:
                        raise self.error("HDF5 file %s has no dataset %r (one per top)"
                                         % (path, name))
                    arrays.append(np.asarray(f[name], dtype=np.float32))
        except OSError as exc:
            raise self.error("cannot read HDF5 file %s: %s" % (path, exc)) from None
        rows = {arr.shape[0] if arr.ndim else 0 for arr in arrays}
        if len(rows) != 1 or 0 in rows:
            raise self.error("datasets of HDF5 file %s must share a first dimension > 0; "
                             "found %s" % (path, [a.shape for a in arrays]))
        self.arrays = arrays
        self.rows = np.arange(rows.pop())
        if self.param.hdf5_data_param.shuffle:
            self.rng.shuffle(self.rows)
        self.row_pos = 0
        log.info("Successfully loaded %d rows from %s", len(self.rows), path)

    def _next_file(self):
        self.file_pos += 1
        if self.file_pos >= len(self.file_order):
            self.file_pos = 0
            if self.param.hdf5_data_param.shuffle:
                self.file_order = list(self.rng.permutation(len(self.files)))
        if len(self.files) > 1 or self.param.hdf5_data_param.shuffle:
            self._load_file(self.file_order[self.file_pos])
        else:
            self.row_pos = 0

    def reshape(self, bottom, top):
        for blob, shape in zip(top, self._shapes):
            blob.reshape(shape)

    def get_resume_state(self):
        return {"file_order": [int(i) for i in self.file_order], "file_pos": int(self.file_pos),
                "rows": self.rows.tolist(), "row_pos": int(self.row_pos), "offset": int(self.offset),
                "rng": self.rng.bit_generator.state}

    def set_resume_state(self, state):
        self.file_order = [int(i) for i in state["file_order"]]
        self.file_pos = int(state["file_pos"])
        self._load_file(self.file_order[self.file_pos])
        self.rows = np.asarray(state["rows"], dtype=np.int64)
        self.row_pos, self.offset = int(state["row_pos"]), int(state["offset"])
        self.rng.bit_generator.state = state["rng"]

    def forward(self, bottom, top):
        batch = self.param.hdf5_data_param.batch_size
        filled = 0
        while filled < batch:
            # rows this worker keeps among the rest of the current file
            remaining = self.rows[self.row_pos:]
            offsets = self.offset + np.arange(len(remaining))
            mine = np.nonzero(offsets % self.size == self.rank)[0][:batch - filled]
            consumed = (mine[-1] + 1) if len(mine) == batch - filled else len(remaining)
            for blob, arr in zip(top, self.arrays):
                blob.data[filled:filled + len(mine)] = arr[remaining[mine]]
            filled += len(mine)
            self.row_pos += consumed
            self.offset += consumed
            if self.row_pos >= len(self.rows):
                self._next_file()


@register("HDF5Output")
class HDF5OutputLayer(Layer):
    """Appends every batch of its two bottoms to datasets 'data' and 'label' of file_name
    (Caffe's file holds one batch only; this one keeps every batch). No backward (it has
    no tops; Caffe's does nothing either)."""
    device_ready = True
    exact_bottoms = 2
    exact_tops = 0

    def setup(self, bottom, top):
        where = "HDF5Output layer %r" % self.name
        h5py = _h5py(where)
        self.path = self.param.hdf5_output_param.file_name
        if not self.path:
            raise self.error("hdf5_output_param.file_name is not set")
        try:
            self.file = h5py.File(self.path, "w")
        except OSError as exc:
            raise self.error("cannot create HDF5 file %s: %s" % (self.path, exc)) from None
        self._finalizer = weakref.finalize(self, self.file.close)
        self.datasets = None

    def reshape(self, bottom, top):
        if bottom[0].shape[0] != bottom[1].shape[0]:
            raise self.error("data and label bottoms must have the same num: %s vs %s"
                             % (bottom[0].shape, bottom[1].shape))

    def forward(self, bottom, top):
        # Caffe writes num x channels x height x width (missing axes as 1), e.g. labels of
        # shape (N,) as N x 1 x 1 x 1, so readers of its files find four axes
        # on a device the bottoms are read back (Caffe's Forward_gpu copies them to the host)
        # without making the host their head
        arrays = [np.asarray(self.backend.to_host(b.dev_data), dtype=np.float32)
                  for b in bottom]
        arrays = [a.reshape(a.shape + (1,) * (4 - a.ndim)) if a.ndim < 4 else a for a in arrays]
        if self.datasets is None:
            self.datasets = [self.file.create_dataset(name, shape=(0,) + a.shape[1:],
                                                      maxshape=(None,) + a.shape[1:],
                                                      dtype="f4")
                             for name, a in zip(("data", "label"), arrays)]
        for ds, arr in zip(self.datasets, arrays):
            if ds.shape[1:] != arr.shape[1:]:
                raise self.error("bottom shape changed from %s to %s; HDF5 output needs one "
                                 "shape per file" % (ds.shape[1:], arr.shape[1:]))
            start = ds.shape[0]
            ds.resize(start + arr.shape[0], axis=0)
            ds[start:] = arr
        self.file.flush()

    def close(self):
        self._finalizer()
