"""The base of the prefetching data layers (Data, ImageData, WindowData).

A subclass builds a loader object that makes whole batches (read, decode, transform); the base
runs it through a Prefetcher with data_param.prefetch batches in flight (0: load in forward, no
thread). The thread starts when the first batch is asked for, not at setup: nothing is read
before the nets are known to fit in memory, and ``prefetch_bytes()`` tells the net's memory
check what the batches in flight will take. The loader owns its own random generator, seeded
from the process generator at setup, so a seeded run gives the same batches with or without
prefetch. The thread and the files are released by ``close()``, when the layer is collected,
or at interpreter exit, whichever comes first.

On a device the batches travel as Caffe's do: the prefetch thread pushes each one through a
ring of pinned host and device buffers on its own stream (the backend's ``batch_ring``), and
forward copies it device to device into the tops; the thread never touches the net's blobs.
"""
import weakref

import numpy as np

from ... import data as data_pkg
from ... import log
from ...data.prefetch import Prefetcher
from ...data.transform import DataTransformer
from ...proto import caffe_pb2
from ...rng import get_rng
from ..base import Layer, TRAIN


def _child_rng():
    return np.random.default_rng(int(get_rng().integers(0, 2 ** 63 - 1)))


def _transform_param(layer_param, sub_param):
    """transform_param, with the fields old nets kept in data_param / image_data_param."""
    tp = caffe_pb2.TransformationParameter()
    tp.CopyFrom(layer_param.transform_param)
    for field in ("scale", "mean_file", "crop_size", "mirror"):
        if sub_param.DESCRIPTOR.fields_by_name.get(field) is None:
            continue
        if sub_param.HasField(field) and not tp.HasField(field):
            setattr(tp, field, getattr(sub_param, field))
    return tp




class _Resources:
    """What a data layer must release: its prefetch thread first, then its files."""

    def __init__(self):
        self.prefetcher = None
        self.ring = None
        self.closers = []
        self.closed = False

    def stop_prefetch(self):
        if self.ring is not None:
            self.ring.close()             # wakes a push waiting for a slot
        if self.prefetcher is not None:
            self.prefetcher.stop()
        self.ring = self.prefetcher = None

    def close(self):
        self.closed = True
        self.stop_prefetch()
        for closer in self.closers:
            closer()
        self.closers = []


class PrefetchingDataLayer(Layer):
    device_ready = True
    exact_bottoms = 0
    min_tops = 1
    max_tops = 2

    # subclasses define _make_loader() -> (loader callable -> (data, labels), batch shape)

    def setup(self, bottom, top):
        self._resources = _Resources()
        self._finalizer = weakref.finalize(self, self._resources.close)
        self.output_labels = len(top) > 1
        self.transformer = DataTransformer(
            self._transform_param(), self.phase, "%s layer %r" % (self.type, self.name))
        self._loader, shape = self._make_loader()
        self._shape = shape
        self._consumed_state = self._loader.state()
        log.info("output data size: %s", ",".join(str(s) for s in shape))

    def prefetch_bytes(self):
        """Host bytes of the batches in flight once reading starts: those queued
        (data_param.prefetch), the one being loaded and the one being copied into the tops;
        float32 data and labels."""
        values = int(np.prod(self._shape, dtype=object))
        if self.output_labels:
            values += self._shape[0]
        depth = self.param.data_param.prefetch
        batches = depth + 2 if depth else 1          # without a thread: the one forward loads
        return batches * values * 4

    def _batches(self):
        """The prefetcher, started at the first batch asked for."""
        if self._resources.prefetcher is None:
            if self._resources.closed:
                raise RuntimeError("%s layer %r was closed" % (self.type, self.name))
            self._start_prefetch()
        return self._resources.prefetcher

    def _start_prefetch(self):
        loader = self._loader      # the thread holds the loader, never the layer
        depth = self.param.data_param.prefetch
        leave = None
        if self.backend.on_device:
            ring = self._resources.ring = self.backend.batch_ring(depth)
            labelled = self.output_labels

            def produce():
                data, labels = loader()
                slot = ring.push((data, labels) if labelled else (data,))
                return slot, None, loader.state()
            leave = ring.leave_thread          # the thread made the device current
        else:
            def produce():
                data, labels = loader()
                return data, labels, loader.state()

        self._resources.prefetcher = Prefetcher(produce, depth,
                                                "%s-%s" % (self.type, self.name), leave)

    def _transform_param(self):
        return self.param.transform_param

    @property
    def prefetcher(self):
        """The running prefetcher (None before the first batch is asked for)."""
        return self._resources.prefetcher

    def reshape(self, bottom, top):
        top[0].reshape(self._shape)
        if self.output_labels:
            top[1].reshape((self._shape[0],))

    def forward(self, bottom, top):
        data, labels, self._consumed_state = self._batches().next()
        ring = self._resources.ring
        if ring is not None:
            # the batch is on the device already: one device-to-device copy per top
            shapes = ring.shapes(data)
            tops = top[:len(shapes)]
            for blob, shape in zip(tops, shapes):
                blob.reshape(shape)
            ring.take(data, [blob.mutable_dev_data for blob in tops])
            return
        top[0].reshape(data.shape)
        # one copy of the batch into the backend's memory (on a device, the blob's head)
        self.backend.upload(data, top[0].mutable_dev_data)
        if self.output_labels:
            top[1].reshape(labels.shape)
            self.backend.upload(labels, top[1].mutable_dev_data)

    def skip_batch(self):
        """Advance the record stream by one batch without producing it: the batch the next
        forward would have given is loaded as usual (records read, random draws made) and
        dropped; the tops are left as they are. A sharded test pass calls this for the batches
        other workers test, so each worker's stream stays where one tester's would be."""
        slot, _, self._consumed_state = self._batches().next()
        if self._resources.ring is not None:
            self._resources.ring.release(slot)

    def close(self):
        """Stop the prefetch thread and release the files; the layer is done after this."""
        if hasattr(self, "_finalizer"):
            self._finalizer()

    # the solver keeps these in a snapshot's side file, so a resumed run reads on from the
    # batch after the last one trained on, with the same random crops and mirrors
    def get_resume_state(self):
        return self._consumed_state

    def set_resume_state(self, state):
        self._resources.stop_prefetch()
        self._loader.restore(state)
        self._consumed_state = self._loader.state()

    def _shard(self):
        """(rank, size, partitioned) for this layer: TEST nets read everything, as in Caffe."""
        rank, size, partitioned = data_pkg.get_worker()
        if self.phase != TRAIN or size == 1:
            return 0, 1, False
        return rank, size, partitioned
