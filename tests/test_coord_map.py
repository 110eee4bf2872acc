"""poseidon_caffe.coord_map: maps worked out by hand from Caffe's output-size rules, and a Crop
made by ``crop()`` that lines a real forward pass up with its input pixel for pixel."""
import numpy as np
import pytest

from poseidon_caffe import coord_map as cm
from poseidon_caffe.net import TEST, Net
from poseidon_caffe.net_spec import NetSpec, layers as L, params as P


def test_single_layers_map_centres_of_their_windows():
    n = NetSpec()
    n.data = L.Input(shape=dict(dim=[1, 1, 32, 32]))
    # output y sees inputs s*y - p .. s*y - p + k - 1, centred on s*y - p + (k-1)/2
    n.conv = L.Convolution(n.data, num_output=1, kernel_size=5, stride=2, pad=1)
    axis, a, b = cm.coord_map(n.conv.fn)
    assert axis == 1 and a == 0.5 and b == (1 - 2) / 2        # y = (x + p - (k-1)/2) / s
    # dilation 2 widens a 3-tap kernel to 5 pixels
    n.dil = L.Convolution(n.data, num_output=1, kernel_size=3, dilation=2)
    assert cm.coord_map(n.dil.fn)[1:] == (1, -2)
    # deconvolution: input x spreads over s*x - p .. s*x - p + k - 1
    n.up = L.Deconvolution(n.data, convolution_param=dict(num_output=1, kernel_size=4,
                                                          stride=2, pad=1))
    assert cm.coord_map(n.up.fn) == (1, 2, 0.5)
    n.pool = L.Pooling(n.data, pool=P.Pooling.MAX, kernel_size=3, stride=3)
    assert cm.coord_map(n.pool.fn)[1:] == (1 / 3, -1 / 3)
    n.relu = L.ReLU(n.conv)
    assert cm.coord_map(n.relu.fn) == (None, 1, 0)
    n.crop = L.Crop(n.conv, n.data, crop_param=dict(axis=2, offset=[3, 4]))
    axis, a, b = cm.coord_map(n.crop.fn)
    assert axis == 1 and a == 1 and list(b) == [-3, -4]


def test_legacy_height_width_fields_map_each_axis():
    n = NetSpec()
    n.data = L.Input(shape=dict(dim=[1, 1, 32, 32]))
    n.conv = L.Convolution(n.data, num_output=1, kernel_h=3, kernel_w=5, stride_h=1,
                           stride_w=2, pad_h=0, pad_w=2)
    _, a, b = cm.coord_map(n.conv.fn)
    assert list(a) == [1, 0.5] and list(b) == [-1, 0]


def test_compose_inverse_and_axis_mismatch():
    f = (1, 2.0, 3.0)
    g = (1, 0.5, -1.0)
    axis, a, b = cm.compose(f, g)          # f(g(x)) = 2 * (0.5 x - 1) + 3
    assert (axis, a, b) == (1, 1.0, 1.0)
    axis, a, b = cm.compose(f, cm.inverse(f))
    assert (a, b) == (1.0, 0.0)
    assert cm.compose((None, 1, 0), g) == g
    with pytest.raises(cm.AxisMismatchException):
        cm.compose((1, 1, 0), (2, 1, 0))


def test_layers_without_a_map_stop_the_walk():
    n = NetSpec()
    n.data = L.Input(shape=dict(dim=[1, 1, 8, 8]))
    n.ip = L.InnerProduct(n.data, num_output=3)
    n.gpool = L.Pooling(n.data, pool=P.Pooling.AVE, global_pooling=True)
    with pytest.raises(cm.UndefinedMapException):
        cm.coord_map(n.ip.fn)
    with pytest.raises(cm.UndefinedMapException):
        cm.coord_map(n.gpool.fn)
    with pytest.raises(RuntimeError, match="connected by spatial layers"):
        cm.coord_map_from_to(n.ip, n.data)


def _impulse_net(conv_pad):
    """data -> conv (5x5, one tap at the centre) -> max pool (1x1, stride 2) -> deconv (3x3,
    stride 2, pad 1, one tap at the centre) -> crop to data."""
    n = NetSpec()
    # odd sizes keep every 1x1 pooling window inside the image
    n.data = L.Input(shape=dict(dim=[1, 1, 25, 25]))
    n.conv = L.Convolution(n.data, num_output=1, kernel_size=5, pad=conv_pad, bias_term=False)
    n.pool = L.Pooling(n.conv, pool=P.Pooling.MAX, kernel_size=1, stride=2)
    n.up = L.Deconvolution(n.pool, convolution_param=dict(num_output=1, kernel_size=3,
                                                          stride=2, pad=1, bias_term=False))
    n.relu = L.ReLU(n.up)
    n.out = cm.crop(n.relu, n.data)
    return n


@pytest.mark.parametrize("conv_pad", [6, 8])
def test_crop_aligns_a_real_forward_pass_with_its_input(conv_pad):
    # By hand: conv[y] = data[y - pad + 2]; pool[i] = conv[2i]; up[2i] = pool[i], odd up = 0.
    # So up[z] = data[z - pad + 2] for even z: the crop offset is pad - 2, and the cropped
    # output equals data wherever (z - pad + 2) is even: on even rows and columns (even pad).
    n = _impulse_net(conv_pad)
    axis, a, b = cm.coord_map_from_to(n.relu, n.data)
    assert axis == 1 and np.all(a == 1) and np.all(b == -(conv_pad - 2))
    net = Net(n.to_proto(), TEST)
    crop_layer = net.param.layer[-1]
    assert crop_layer.type == "Crop"
    assert crop_layer.crop_param.axis == 2
    assert list(crop_layer.crop_param.offset) == [conv_pad - 2]
    centre = np.zeros((1, 1, 5, 5), np.float32)
    centre[0, 0, 2, 2] = 1
    net.params["conv"][0].data[...] = centre
    tap = np.zeros((1, 1, 3, 3), np.float32)
    tap[0, 0, 1, 1] = 1
    net.params["up"][0].data[...] = tap
    image = np.random.default_rng(0).uniform(0.5, 1.5, (1, 1, 25, 25)).astype(np.float32)
    net.blobs["data"].data[...] = image
    net.forward_prefilled()
    out = net.blobs["out"].data
    assert out.shape == image.shape
    # (the convolution may run through an FFT: equal up to float rounding)
    np.testing.assert_allclose(out[..., ::2, ::2], image[..., ::2, ::2], rtol=1e-5, atol=1e-5)
    assert np.abs(out[..., 1::2, :]).max() < 1e-5 and np.abs(out[..., :, 1::2]).max() < 1e-5


def test_crop_refuses_what_cannot_be_aligned():
    n = NetSpec()
    n.data = L.Input(shape=dict(dim=[1, 1, 24, 24]))
    n.pool = L.Pooling(n.data, pool=P.Pooling.MAX, kernel_size=3, stride=3)
    n.up = L.Deconvolution(n.pool, num_output=1, kernel_size=4, stride=2)
    with pytest.raises(AssertionError, match="scale mismatch"):
        cm.crop(n.up, n.data)
    n.small = L.Convolution(n.data, num_output=1, kernel_size=5)       # shrinks: b = +2
    with pytest.raises(AssertionError, match="negative offset"):
        cm.crop(n.small, n.data)
    n.half = L.Deconvolution(n.data, num_output=1, kernel_size=2, stride=1)   # b = -0.5
    with pytest.raises(cm.CropException, match="noninteger"):
        cm.crop(n.half, n.data)
