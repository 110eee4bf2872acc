"""type: "Python" layers: a user module written here, imported from sys.path as pycaffe does."""
import sys
import textwrap

import numpy as np
import pytest

from gradcheck import blob_from, check_gradient, make_layer
from poseidon_caffe.blob import Blob
from poseidon_caffe.layers import LayerError
from poseidon_caffe.proto import caffe_pb2

USER_MODULE = '''
import json
import numpy as np
from poseidon_caffe.layers import Layer


class ScaleByParam(Layer):
    """top = w * bottom, with a learnable per-column w; param_str is JSON."""

    def setup(self, bottom, top):
        self.config = json.loads(self.param_str)
        self.seen_phase = self.phase
        if len(bottom) != 1:
            raise Exception("needs one bottom")
        if not len(self.blobs):
            self.blobs.add_blob(bottom[0].data.shape[1])
            self.blobs[0].data[...] = self.config["init"]

    def reshape(self, bottom, top):
        top[0].reshape(*bottom[0].data.shape)

    def forward(self, bottom, top):
        top[0].data[...] = bottom[0].data * self.blobs[0].data

    def backward(self, top, propagate_down, bottom):
        self.blobs[0].diff[...] += (top[0].diff * bottom[0].data).sum(axis=0)
        if propagate_down[0]:
            bottom[0].diff[...] = top[0].diff * self.blobs[0].data


class NotALayer(object):
    pass
'''


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    name = "user_layers_%d" % id(tmp_path)
    (tmp_path / (name + ".py")).write_text(textwrap.dedent(USER_MODULE))
    monkeypatch.syspath_prepend(str(tmp_path))
    yield name
    sys.modules.pop(name, None)


def python_layer(module, layer="ScaleByParam", param_str='{"init": 2.0}', phase="TRAIN"):
    return make_layer('name: "py" type: "Python" phase: %s python_param { module: "%s" '
                      'layer: "%s" param_str: \'%s\' share_in_parallel: true }'
                      % (phase, module, layer, param_str))


def test_python_layer_runs_user_code(user_module):
    layer = python_layer(user_module, phase="TEST")
    assert layer.type == "Python"
    assert layer.param_str == '{"init": 2.0}'
    x = blob_from([[1, 2, 3], [4, 5, 6]])
    top = [Blob()]
    layer.setup([x], top)
    layer.reshape([x], top)
    layer.forward([x], top)
    assert layer.seen_phase == caffe_pb2.TEST
    assert len(layer.blobs) == 1 and layer.blobs[0].shape == (3,)
    assert layer.param_propagate_down == [True]
    np.testing.assert_array_equal(top[0].data, 2 * x.data)


def test_python_layer_gradient(user_module):
    layer = python_layer(user_module, param_str='{"init": 0.5}')
    rs = np.random.RandomState(0)
    check_gradient(layer, [blob_from(rs.randn(3, 4))], [Blob()])
    assert layer.has_backward()


def test_python_layer_missing_module_names_the_layer():
    with pytest.raises(LayerError, match="'py'.*no_such_module_xyz"):
        python_layer("no_such_module_xyz")


def test_python_layer_missing_class(user_module):
    with pytest.raises(LayerError, match="has no python_param.layer 'Missing'"):
        python_layer(user_module, layer="Missing")


def test_python_layer_class_must_be_a_layer(user_module):
    with pytest.raises(LayerError, match="must be a class deriving"):
        python_layer(user_module, layer="NotALayer")


def test_python_layer_needs_module_and_layer():
    param = caffe_pb2.LayerParameter(name="py", type="Python")
    from poseidon_caffe.layers import create_layer
    with pytest.raises(LayerError, match="'module' and 'layer'"):
        create_layer(param)


def test_python_layer_errors_keep_their_type_through_net_building(user_module, tmp_path):
    # pycaffe hands a Python layer's own exception to the caller unchanged; the project adds a
    # note naming the layer but keeps the type a user's script catches
    import poseidon_caffe as caffe
    (tmp_path / (user_module + "_raising.py")).write_text(textwrap.dedent('''
        from poseidon_caffe.layers import Layer


        class Raises(Layer):
            def setup(self, bottom, top):
                raise RuntimeError("refused by the user's layer")

            def reshape(self, bottom, top):
                pass
        '''))
    net_file = tmp_path / "net.prototxt"
    net_file.write_text('name: "n" layer { name: "boom" type: "Python" top: "x" '
                        'python_param { module: "%s_raising" layer: "Raises" } }' % user_module)
    with pytest.raises(RuntimeError, match="refused by the user's layer") as raised:
        caffe.Net(str(net_file), caffe.TEST)
    assert not isinstance(raised.value, ValueError)
    if hasattr(raised.value, "__notes__"):
        assert raised.value.__notes__ == ["in setup of Python layer 'boom'"]
    sys.modules.pop(user_module + "_raising", None)
