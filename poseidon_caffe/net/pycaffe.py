"""pycaffe's conveniences: the named views (blobs, params, inputs, outputs ...), forward and
backward taking and returning arrays by name, batch-by-batch runs over any number of inputs,
per-layer callbacks, HDF5 weights and the underscore internals pycaffe's own code reads."""
from collections import OrderedDict

import numpy as np

from .errors import NetError

LAYER_CALLBACK_KINDS = ("before_forward", "after_forward", "before_backward", "after_backward")


def batch_part(value, valid):
    """The first ``valid`` items of a batch output; a scalar (a loss) is kept once per batch."""
    return value[None].copy() if value.ndim == 0 else value[:valid].copy()


class PycaffeView:
    """Part of ``Net``: what pycaffe's Net offers beyond the training loop's needs."""

    @property
    def blobs(self):
        return OrderedDict((n, b) for n, b in zip(self.blob_names, self._blobs))

    @property
    def blob_loss_weights(self):
        return OrderedDict(zip(self.blob_names, self.blob_loss_weight_list))

    @property
    def params(self):
        return OrderedDict((name, layer.blobs) for name, layer in zip(self.layer_names,
                                                                       self.layers)
                           if layer.blobs)

    @property
    def layer_dict(self):
        return OrderedDict(zip(self.layer_names, self.layers))

    @property
    def inputs(self):
        return [self.blob_names[i] for i in self.input_blob_indices]

    @property
    def outputs(self):
        return [self.blob_names[i] for i in self.output_blob_indices]

    @property
    def top_names(self):
        return OrderedDict((n, [self.blob_names[b] for b in ids])
                           for n, ids in zip(self.layer_names, self.top_ids))

    @property
    def bottom_names(self):
        return OrderedDict((n, [self.blob_names[b] for b in ids])
                           for n, ids in zip(self.layer_names, self.bottom_ids))

    def _layer_index(self, name, what):
        try:
            return self.layer_names.index(name)
        except ValueError:
            raise NetError("%s layer %r is not in net %r" % (what, name, self.name)) from None

    def forward(self, blobs=None, start=None, end=None, **kwargs):
        """pycaffe's Net.forward: set inputs from keyword arrays, run, return the outputs."""
        if blobs is None:
            blobs = []
        start_ind = 0 if start is None else self._layer_index(start, "start")
        if end is not None:
            end_ind = self._layer_index(end, "end")
            outputs = set(self.top_names[end] + list(blobs))
        else:
            end_ind = len(self.layers) - 1
            outputs = set(self.outputs + list(blobs))
        if kwargs:
            if set(kwargs) != set(self.inputs):
                raise NetError("Input blob arguments do not match net inputs: given %s, the net "
                               "takes %s" % (sorted(kwargs), self.inputs))
            for name, array in kwargs.items():
                array = np.asarray(array)
                blob = self.blobs[name]
                if array.shape[:1] != blob.shape[:1]:
                    raise NetError("Input %r is not batch sized: got shape %s, blob is %s"
                                   % (name, array.shape, blob.shape))
                blob.data[...] = array
        self.forward_from_to(start_ind, end_ind)
        named = self.blobs
        return {out: named[out].data for out in outputs}

    def backward(self, diffs=None, start=None, end=None, **kwargs):
        """pycaffe's Net.backward: seed output diffs from keyword arrays, run, return the input
        diffs (and any blobs named in ``diffs``)."""
        if diffs is None:
            diffs = []
        start_ind = len(self.layers) - 1 if start is None else self._layer_index(start, "start")
        if end is not None:
            end_ind = self._layer_index(end, "end")
            outputs = set(self.bottom_names[end] + list(diffs))
        else:
            end_ind = 0
            outputs = set(self.inputs + list(diffs))
        if kwargs:
            if set(kwargs) != set(self.outputs):
                raise NetError("Top diff arguments do not match net outputs: given %s, the net "
                               "has %s" % (sorted(kwargs), self.outputs))
            for name, array in kwargs.items():
                array = np.asarray(array)
                blob = self.blobs[name]
                if array.shape[:1] != blob.shape[:1]:
                    raise NetError("Diff %r is not batch sized: got shape %s, blob is %s"
                                   % (name, array.shape, blob.shape))
                blob.diff[...] = array
        self.backward_from_to(start_ind, end_ind,
                              seeded={self.blob_name_to_index[name] for name in kwargs})
        named = self.blobs
        return {out: named[out].diff for out in outputs}

    def _batches(self, arrays):
        num = len(next(iter(arrays.values()))) if arrays else 0
        batch = self._blobs[self.input_blob_indices[0]].shape[0] if self.input_blob_indices \
            else 1
        for b in range(0, num, batch):
            chunk = {}
            for name, array in arrays.items():
                part = np.asarray(array[b:b + batch])
                if len(part) < batch:
                    pad = np.zeros((batch - len(part),) + part.shape[1:], part.dtype)
                    part = np.concatenate([part, pad])
                chunk[name] = part
            yield chunk, min(batch, num - b)

    def forward_all(self, blobs=None, **kwargs):
        """Run forward over inputs of any length, batch by batch; outputs concatenated."""
        collected = {out: [] for out in set(self.outputs + list(blobs or []))}
        for chunk, valid in self._batches(kwargs):
            outs = self.forward(blobs=blobs, **chunk)
            for name, value in outs.items():
                collected[name].append(batch_part(value, valid))
        if not kwargs:
            outs = self.forward(blobs=blobs)
            return {n: v.copy() for n, v in outs.items()}
        return {n: np.concatenate(v) for n, v in collected.items()}

    def forward_backward_all(self, blobs=None, diffs=None, **kwargs):
        forward_in = {k: v for k, v in kwargs.items() if k in self.inputs}
        backward_in = {k: v for k, v in kwargs.items() if k in self.outputs}
        all_outs = {out: [] for out in set(self.outputs + list(blobs or []))}
        all_diffs = {d: [] for d in set(self.inputs + list(diffs or []))}
        back_batches = list(self._batches(backward_in)) if backward_in else None
        for index, (chunk, valid) in enumerate(self._batches(forward_in)):
            outs = self.forward(blobs=blobs, **chunk)
            bchunk = back_batches[index][0] if back_batches else {}
            grads = self.backward(diffs=diffs, **bchunk)
            for name, value in outs.items():
                all_outs[name].append(batch_part(value, valid))
            for name, value in grads.items():
                all_diffs[name].append(batch_part(value, valid))
        return ({n: np.concatenate(v) for n, v in all_outs.items()},
                {n: np.concatenate(v) for n, v in all_diffs.items()})

    def set_input_arrays(self, data, labels):
        """pycaffe's set_input_arrays: feed a MemoryData first layer."""
        layer = self.layers[0]
        if layer.type != "MemoryData":
            raise NetError("set_input_arrays needs the net's first layer to be MemoryData, not %s"
                           % layer.type)
        layer.set_input_arrays(data, labels)

    # -- pycaffe conveniences: callbacks, HDF5 weights, and the underscore internals ---------
    # (the names pycaffe's own Python code and BVLC's python/caffe/test suite reach for)
    def _add_layer_callback(self, kind, fn):
        if not callable(fn):
            raise TypeError("Net.%s takes a callable fn(layer_index), not %s"
                            % (kind, type(fn).__name__))
        self._layer_callbacks[kind].append(fn)

    def before_forward(self, fn):
        """Call ``fn(layer_index)`` before each layer computes forward."""
        self._add_layer_callback("before_forward", fn)

    def after_forward(self, fn):
        """Call ``fn(layer_index)`` after each layer computes forward."""
        self._add_layer_callback("after_forward", fn)

    def before_backward(self, fn):
        """Call ``fn(layer_index)`` before each layer of a backward range (needed or not)."""
        self._add_layer_callback("before_backward", fn)

    def after_backward(self, fn):
        """Call ``fn(layer_index)`` after each layer of a backward range; an ``NCCL`` object
        given here reduces that layer's gradients (layer-wise reduce)."""
        self._add_layer_callback("after_backward", fn)

    def save_hdf5(self, path):
        """Write the weights as Caffe's HDF5 model (groups data/<layer>/<param index>)."""
        from .. import net_hdf5
        net_hdf5.save(self, path)

    def load_hdf5(self, path):
        """Copy weights by layer name from a Caffe HDF5 model file."""
        from .. import net_hdf5
        net_hdf5.load(self, path)

    @property
    def _layer_names(self):
        return list(self.layer_names)

    @property
    def _blob_names(self):
        return list(self.blob_names)

    @property
    def _inputs(self):
        return list(self.input_blob_indices)

    @property
    def _outputs(self):
        return list(self.output_blob_indices)

    @property
    def _blob_loss_weights(self):
        return self.blob_loss_weight_list

    def _bottom_ids(self, layer_index):
        return list(self.bottom_ids[layer_index])

    def _top_ids(self, layer_index):
        return list(self.top_ids[layer_index])

    def _forward(self, start, end):
        """Forward over layers start..end (indices, both included); returns the loss."""
        return self.forward_from_to(int(start), int(end))

    def _backward(self, start, end):
        """Backward over layers start down to end (indices, both included)."""
        self.backward_from_to(int(start), int(end))

    def _set_input_arrays(self, data, labels):
        """Feed a MemoryData first layer: data N x C x H x W, labels N x 1 x 1 x 1, both
        float32 and C-contiguous (the arrays are kept by reference, not copied)."""
        if isinstance(labels, np.ndarray) and labels.ndim != 4:
            raise NetError("labels array must be 4-d (N x 1 x 1 x 1); its shape is %s "
                           "(Net.set_input_arrays also takes N labels)" % (labels.shape,))
        self.set_input_arrays(data, labels)
