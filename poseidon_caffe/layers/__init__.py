"""Caffe's layers, one module per family; importing this package registers them all."""
from .registry import register, layer_type_list, layer_class, create_layer, check_types  # noqa: F401
from .base import Layer, NeuronLayer, LossLayer, LayerError  # noqa: F401
from . import (vision, neuron, linear, normalization, common, loss, inputs,  # noqa: F401,E402
               recurrent, python_layer, data_layers)
