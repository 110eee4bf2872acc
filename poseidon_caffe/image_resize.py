"""pycaffe's resize_image, number for number, without scikit-image.

pycaffe resizes with scikit-image's ``transform.resize`` (order 1 unless asked, mode
'constant'), on the image scaled to [0, 1] first, for images of one or three channels; any
other channel count goes through ``scipy.ndimage.zoom`` as it is. scikit-image's resize is
itself scipy.ndimage: when an axis shrinks, a Gaussian filter of sigma (factor - 1) / 2 on it
(anti-aliasing, on by default for a float image), then ``ndimage.zoom`` by the inverse factors
with ``grid_mode=True`` and the 'grid-constant' mode (cval 0), the result clipped to the input's
range. This module makes the same calls, in the same float32, so a Classifier's crops, a
Detector's windows and Transformer.preprocess give pycaffe's numbers to float rounding with
or without scikit-image installed (tests/test_image_resize.py compares against it where it
is).
"""
import numpy as np
from scipy import ndimage

MODE = "grid-constant"            # scikit-image's 'constant' as scipy >= 1.6 names it


def skimage_resize(image, output_shape, order=1):
    """scikit-image's ``resize(image, output_shape, order, mode='constant')`` for a float
    image: anti-aliased when an axis shrinks, clipped to the input's range."""
    image = np.asarray(image)
    output_shape = tuple(int(d) for d in output_shape) + image.shape[len(output_shape):]
    factors = np.divide(image.shape, output_shape)
    low, high = image.min(), image.max()
    if any(o < i for o, i in zip(output_shape, image.shape)):
        image = ndimage.gaussian_filter(image, np.maximum(0, (factors - 1) / 2), cval=0,
                                        mode=MODE)
    out = ndimage.zoom(image, [1 / f for f in factors], order=order, mode=MODE, cval=0,
                       grid_mode=True)
    return np.clip(out, low, high, out=out)


def resize_image(im, new_dims, interp_order=1):
    """pycaffe's caffe.io.resize_image: an H x W x K image to new_dims (height, width)."""
    im = np.asarray(im)
    if im.shape[-1] in (1, 3):
        im_min, im_max = im.min(), im.max()
        if not im_max > im_min:             # a constant image: no division by zero
            return np.full((int(new_dims[0]), int(new_dims[1]), im.shape[-1]), im_min,
                           dtype=np.float32)
        im_std = (im - im_min) / (im_max - im_min)
        resized = skimage_resize(im_std, new_dims, interp_order) * (im_max - im_min) + im_min
    else:
        # pycaffe: "ndimage interpolates anything but more slowly"
        scale = tuple(np.array(new_dims, dtype=float) / np.array(im.shape[:2]))
        resized = ndimage.zoom(im, scale + (1,), order=interp_order)
    return resized.astype(np.float32)
