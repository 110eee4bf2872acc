"""The net: ``Net`` (``from poseidon_caffe.net import Net``) and the steps it is built from.

One module per idea: ``filtering`` (which layers a phase, level and stages keep), ``splits``
(Split layers where one top feeds several bottoms), ``split_folding`` (their outputs' gradients
added in as each consumer finishes, in shared buffers), ``diff_sharing`` (blobs whose gradients
are never needed at once share buffers, for trainers), ``wiring`` (blobs, set-up, loss weights,
parameter sharing), ``backward_plan`` (which layers need backward), ``execution`` (forward and
backward, the engine's hooks), ``debug`` (Caffe's debug_info lines), ``weights`` (copy, share,
save), ``footprint`` (memory before allocation), ``pycaffe`` (pycaffe's conveniences) and
``build`` (the ``Net`` class, which puts them together as Caffe's Net::Init does).
"""
from .build import TEST, TRAIN, Net
from .errors import NetError, NetMemoryError, is_project_error, layer_failure, \
    raise_if_out_of_memory
from .filtering import filter_net, state_meets_rule
from .pycaffe import LAYER_CALLBACK_KINDS, batch_part
from .splits import insert_splits, split_blob_name, split_layer_name

__all__ = ["Net", "NetError", "NetMemoryError", "TRAIN", "TEST", "LAYER_CALLBACK_KINDS",
           "state_meets_rule", "filter_net", "insert_splits", "split_layer_name",
           "split_blob_name"]
