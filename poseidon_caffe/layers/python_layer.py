"""``type: "Python"``: a layer written in Python by the user, run as pycaffe runs it.

``python_param { module: "m" layer: "C" param_str: "..." }`` imports ``m`` with a plain import
(``sys.path`` as the process has it, like pycaffe; the prototxt's directory is not added), builds
``m.C(layer_param)`` — ``C`` derives from ``poseidon_caffe.layers.Layer`` as pycaffe's derive from
``caffe.Layer`` — sets ``param_str`` and ``phase`` on it, and hands that object to the net. The
net then calls its ``setup(bottom, top)``, ``reshape``, ``forward`` and
``backward(top, propagate_down, bottom)`` with lists of Blobs, so ``bottom[0].data`` and
``top[0].reshape(...)`` work as in pycaffe, and ``net.layers[i]`` is the user's own object.
"""
import importlib

from .base import Layer, LayerError
from .registry import register
from ..blob import Blob


class BlobVec(list):
    """A layer's learnable blobs, with pycaffe's ``add_blob(*shape)``."""

    def __init__(self, owner, blobs=()):
        super().__init__(blobs)
        self._owner = owner

    def add_blob(self, *shape):
        if len(shape) == 1 and not isinstance(shape[0], int):
            shape = tuple(shape[0])
        blob = Blob(tuple(int(s) for s in shape))
        self.append(blob)
        flags = getattr(self._owner, "param_propagate_down", None)
        if flags is not None and len(flags) < len(self):
            flags.extend([True] * (len(self) - len(flags)))
        return blob


def _fail(layer_param, message):
    return LayerError("Python layer %r: %s" % (layer_param.name, message))


@register("Python")
class PythonLayer(Layer):
    """A factory: constructing it returns the user's layer object, ready for setup."""
    # in GPU mode the user's code reads and writes blob.data/.diff on the host, as in Caffe:
    # each access syncs (blob.py's SyncedBlob)
    device_ready = True

    def __new__(cls, layer_param, phase=None):
        pp = layer_param.python_param
        if not pp.module or not pp.layer:
            raise _fail(layer_param, "python_param needs both 'module' and 'layer' (got module "
                                     "%r, layer %r)" % (pp.module, pp.layer))
        try:
            module = importlib.import_module(pp.module)
        except ImportError as exc:
            raise _fail(layer_param, "cannot import python_param.module %r: %s (the module "
                                     "must be importable from sys.path / PYTHONPATH)"
                        % (pp.module, exc)) from exc
        user_class = getattr(module, pp.layer, None)
        if user_class is None:
            raise _fail(layer_param, "module %r (%s) has no python_param.layer %r"
                        % (pp.module, getattr(module, "__file__", "?"), pp.layer))
        if not (isinstance(user_class, type) and issubclass(user_class, Layer)):
            raise _fail(layer_param, "%s.%s must be a class deriving from "
                                     "poseidon_caffe.layers.Layer" % (pp.module, pp.layer))
        layer = user_class(layer_param)
        layer.type = "Python"
        layer.param_str = pp.param_str
        if phase is not None:
            layer.phase = phase
        layer.blobs = BlobVec(layer, layer.blobs)
        if len(layer.param_propagate_down) < len(layer.blobs):
            layer.param_propagate_down = [True] * len(layer.blobs)
        return layer
