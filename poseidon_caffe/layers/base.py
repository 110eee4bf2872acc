"""The Layer contract: Caffe's setup / reshape / forward / backward, written once per layer.

Layers receive lists of Blob objects. ``forward`` writes top data; ``backward`` *writes* bottom
diffs (never accumulates into them) and *adds* into parameter diffs, exactly as in Caffe, so that
the net can accumulate gradients over iter_size and shared parameters.
"""
import math

from ..backend import get_backend
from ..blob import Blob
from ..proto import caffe_pb2

TRAIN = caffe_pb2.TRAIN
TEST = caffe_pb2.TEST


class LayerError(ValueError):
    """A problem with one layer's configuration or inputs; the message names the layer."""


class Layer:
    type = None
    # Blob-count constraints, Caffe's ExactNumBottomBlobs() and friends; None = unchecked.
    exact_bottoms = None
    min_bottoms = None
    max_bottoms = None
    exact_tops = None
    min_tops = None
    max_tops = None
    equal_bottom_top = False
    # Number of tops the layer makes by itself when the prototxt names fewer (AutoTopBlobs).
    auto_tops = False
    # Whether the layer runs on a device backend: it touches blob arrays only through the
    # dev_* accessors and the backend's ops (or, as data layers, writes host batches only).
    device_ready = False

    def __init__(self, layer_param, phase=None):
        self.param = layer_param
        self.name = layer_param.name
        self.phase = layer_param.phase if phase is None else phase
        self.backend = get_backend()
        self.xp = self.backend.xp
        # parameters that came with the LayerParameter (a net built from a model's params)
        self.blobs = [self._blob_from_proto(bp) for bp in layer_param.blobs]
        self.param_propagate_down = [True] * len(self.blobs)

    def _blob_from_proto(self, blob_proto):
        from ..io import blobproto_to_array
        arr = blobproto_to_array(blob_proto)
        blob = Blob(arr.shape)
        blob.data[...] = arr
        return blob

    def check_loaded_blobs(self, shapes, names=None, legacy_padding_only=False,
                           count_text="expected {want} parameter blob(s), the model gives {got}",
                           shape_text="parameter blob {which} has shape {got}, expected {want}"):
        """Check the blobs that came with the LayerParameter against the shapes setup computed.

        A blob stored in another shape with the same values (a legacy model's 4-d storage, as
        (1, 1, N, K)) takes the computed shape; with ``legacy_padding_only`` only leading 1s
        are accepted, else any shape of the same count. Errors name a blob by its entry in
        ``names``, else its index; the texts' fields are {want}, {got}, {names}, {which}.
        """
        if len(self.blobs) != len(shapes):
            raise self.error(count_text.format(want=len(shapes), got=len(self.blobs),
                                               names=", ".join(names or ())))
        for i, (blob, shape) in enumerate(zip(self.blobs, shapes)):
            shape = tuple(shape)
            if blob.shape == shape:
                continue
            if legacy_padding_only:
                lead = blob.num_axes - len(shape)
                legacy = lead >= 0 and blob.shape[lead:] == shape and \
                    all(s == 1 for s in blob.shape[:lead])
            else:
                legacy = blob.count == math.prod(shape)
            if not legacy:
                raise self.error(shape_text.format(which=names[i] if names else i,
                                                   got=blob.shape, want=shape))
            blob.reshape(shape)

    # -- the four calls ----------------------------------------------------------------------
    def setup(self, bottom, top):
        """One-time setup from the parameters and the first bottom shapes (LayerSetUp)."""

    def reshape(self, bottom, top):
        raise LayerError("layer %r of type %s defines no reshape" % (self.name, self.type))

    def forward(self, bottom, top):
        raise LayerError("layer %r of type %s defines no forward" % (self.name, self.type))

    def backward(self, top, propagate_down, bottom):
        """Layers without a gradient leave bottoms alone; the net never asks them to propagate."""

    # -- what the net asks -------------------------------------------------------------------
    def default_loss_weight(self, top_index):
        """Loss weight of a top the prototxt gives none for (loss layers: 1 on top 0)."""
        return 0.0

    def allow_force_backward(self, bottom_index):
        return True

    # bottoms whose gradient backward never writes (a shape reference): the net asks for
    # none, so no split adds one and the producer reads Caffe's zeros
    gradient_free_bottoms = ()

    # bottoms whose diff backward adds its gradient into instead of writing it, set by the
    # net before each backward (net/split_folding.py) for the bottoms of ``adds_to_bottoms``
    adding_bottoms = frozenset()

    def adds_to_bottoms(self):
        """The bottoms whose gradient backward can add into their diff when asked (through
        ``adding_bottoms``) for less than making it apart and adding it: none here."""
        return ()

    def has_backward(self):
        return type(self).backward is not Layer.backward

    def check_blob_counts(self, bottom, top):
        def fail(what, want, got):
            raise LayerError("%s layer %r takes %s %s blob(s), but %d were given"
                             % (self.type, self.name, want, what, got))
        nb, nt = len(bottom), len(top)
        if self.exact_bottoms is not None and nb != self.exact_bottoms:
            fail("bottom", "exactly %d" % self.exact_bottoms, nb)
        if self.min_bottoms is not None and nb < self.min_bottoms:
            fail("bottom", "at least %d" % self.min_bottoms, nb)
        if self.max_bottoms is not None and nb > self.max_bottoms:
            fail("bottom", "at most %d" % self.max_bottoms, nb)
        if self.exact_tops is not None and nt != self.exact_tops:
            fail("top", "exactly %d" % self.exact_tops, nt)
        if self.min_tops is not None and nt < self.min_tops:
            fail("top", "at least %d" % self.min_tops, nt)
        if self.max_tops is not None and nt > self.max_tops:
            fail("top", "at most %d" % self.max_tops, nt)
        if self.equal_bottom_top and nb != nt:
            raise LayerError("%s layer %r needs as many tops as bottoms (%d bottoms, %d tops)"
                             % (self.type, self.name, nb, nt))

    def error(self, message):
        """A LayerError that names this layer and its type."""
        return LayerError("%s layer %r: %s" % (self.type, self.name, message))

    def __repr__(self):
        return "<%s layer %r>" % (self.type, self.name)


class NeuronLayer(Layer):
    """One bottom, one top of the same shape; may run in place."""
    exact_bottoms = 1
    exact_tops = 1

    def reshape(self, bottom, top):
        top[0].reshape(bottom[0].shape)


class LossLayer(Layer):
    """Two or more bottoms (predictions, labels, ...) and a scalar loss top, weight 1 by default."""
    exact_bottoms = 2
    exact_tops = 1

    def default_loss_weight(self, top_index):
        return 1.0 if top_index == 0 else 0.0

    def allow_force_backward(self, bottom_index):
        return bottom_index != 1       # never a gradient toward the labels

    def reshape(self, bottom, top):
        if bottom[0].shape[0] != bottom[1].shape[0]:
            raise self.error("the data and label bottoms must have the same num: %s vs %s"
                             % (bottom[0].shape, bottom[1].shape))
        top[0].reshape(())
