"""pycaffe's resize_image (image_resize.py) against scikit-image's resize, which pycaffe calls,
where scikit-image is installed; and against values worked out by hand where it is not
needed: a constant image, a 2 x 2 doubled with the grid mode, a shrink's anti-aliasing."""
import numpy as np
import pytest

from poseidon_caffe.image_resize import resize_image, skimage_resize
from poseidon_caffe.imageio import Transformer

RNG = np.random.default_rng(5)


def pycaffe_resize_image(im, new_dims, interp_order=1):
    """pycaffe's caffe.io.resize_image, as BVLC wrote it, over scikit-image."""
    from scipy.ndimage import zoom
    from skimage.transform import resize
    if im.shape[-1] == 1 or im.shape[-1] == 3:
        im_min, im_max = im.min(), im.max()
        if im_max > im_min:
            im_std = (im - im_min) / (im_max - im_min)
            resized_std = resize(im_std, new_dims, order=interp_order, mode="constant")
            resized_im = resized_std * (im_max - im_min) + im_min
        else:
            ret = np.empty((new_dims[0], new_dims[1], im.shape[-1]), dtype=np.float32)
            ret.fill(im_min)
            return ret
    else:
        scale = tuple(np.array(new_dims, dtype=float) / np.array(im.shape[:2]))
        resized_im = zoom(im, scale + (1,), order=interp_order)
    return resized_im.astype(np.float32)


@pytest.mark.parametrize("shape,new_dims,order", [
    ((256, 256, 3), (227, 227), 1),             # a mean image to AlexNet's input: shrink
    ((32, 48, 3), (96, 64), 1),                 # grow one axis, shrink none
    ((60, 40, 1), (25, 70), 1),                 # shrink one axis, grow the other
    ((20, 30, 3), (45, 12), 3),                 # bicubic
    ((16, 16, 3), (8, 8), 0),                   # nearest
    ((12, 10, 5), (24, 7), 1),                  # five channels: ndimage.zoom as it is
])
def test_resize_image_is_pycaffes(shape, new_dims, order):
    pytest.importorskip("skimage")
    im = (RNG.uniform(0, 255, shape)).astype(np.float32)
    ours = resize_image(im, new_dims, order)
    theirs = pycaffe_resize_image(im, new_dims, order)
    assert ours.dtype == np.float32 and ours.shape == theirs.shape
    np.testing.assert_allclose(ours, theirs, rtol=1e-6, atol=1e-4)


def test_a_constant_image_stays_constant():
    out = resize_image(np.full((7, 9, 3), 104.0, np.float32), (4, 5))
    assert out.shape == (4, 5, 3) and out.dtype == np.float32 and (out == 104.0).all()


def test_doubling_follows_the_grid_and_the_zero_outside():
    # grid mode: output pixel i's centre is (i + 0.5) / 2 - 0.5 input pixels (-0.25, 0.25,
    # 0.75, 1.25); beyond the edges the constant 0 is blended in (scikit-image's mode
    # 'constant'); linear weights, separable along the two axes
    im = np.array([[0.0, 1.0], [1.0, 0.0]], np.float32)
    out = skimage_resize(im, (4, 4))
    weights = np.array([[0.75, 0], [0.75, 0.25], [0.25, 0.75], [0, 0.75]])
    np.testing.assert_allclose(out, weights @ im @ weights.T, atol=1e-6)


def test_a_shrink_is_smoothed_first():
    # a one-pixel checkerboard halved: anti-aliasing (sigma 0.5) leaves a nearly flat image,
    # where sampling alone would keep the pattern at full contrast
    im = (np.indices((16, 16)).sum(0) % 2).astype(np.float32)
    out = skimage_resize(im, (8, 8))
    inner = out[2:-2, 2:-2]
    assert inner.max() - inner.min() < 0.05 and abs(inner.mean() - 0.5) < 0.05


def test_set_mean_resizes_a_mean_image_of_another_size():
    t = Transformer({"data": (1, 3, 227, 227)})
    mean = (RNG.uniform(90, 130, (3, 256, 256))).astype(np.float32)
    t.set_mean("data", mean)
    low, high = mean.min(), mean.max()
    expected = resize_image(((mean - low) / (high - low)).transpose(1, 2, 0),
                            (227, 227)).transpose(2, 0, 1) * (high - low) + low
    assert t.mean["data"].shape == (3, 227, 227)
    np.testing.assert_allclose(t.mean["data"], expected, rtol=1e-6)
    with pytest.raises(ValueError, match="mean shape"):
        t.set_mean("data", mean[:1])                      # the channels must agree
