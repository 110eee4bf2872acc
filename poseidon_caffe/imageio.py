"""Image helpers with pycaffe's caffe.io names and semantics.

Images are H x W x C float32 arrays in [0, 1], RGB; a net wants C x H x W, often BGR, scaled to
[0, 255] with a mean subtracted.  Transformer records those steps per net input and applies them
(preprocess) or undoes them (deprocess).  Pillow reads the images; they are resized as
pycaffe resizes them (image_resize.py: scikit-image's resize, made with scipy.ndimage).
"""
import numpy as np

from .image_resize import resize_image

__all__ = ["Transformer", "load_image", "resize_image", "oversample"]


def _pillow():
    try:
        from PIL import Image
    except ImportError:
        raise ImportError("image helpers need Pillow: pip install pillow") from None
    return Image


def load_image(filename, color=True):
    """H x W x 3 (color) or H x W x 1 float32 image in [0, 1], RGB; alpha is dropped."""
    Image = _pillow()
    with Image.open(filename) as img:
        img.load()
        if img.mode in ("I;16", "I;16B", "I;16L", "I"):
            pixels = np.asarray(img, dtype=np.float32) / 65535.0
            img_arr = pixels
        else:
            img = img.convert("RGB" if color else "L")
            img_arr = np.asarray(img, dtype=np.float32) / 255.0
    if img_arr.ndim == 2:
        img_arr = img_arr[:, :, np.newaxis]
        if color:
            img_arr = np.tile(img_arr, (1, 1, 3))
    return np.ascontiguousarray(img_arr, dtype=np.float32)


def oversample(images, crop_dims):
    """Ten crops per image (four corners and centre, plus their mirrors): N*10 x h x w x K."""
    images = [np.asarray(im) for im in images]
    im_shape = np.array(images[0].shape)
    crop_h, crop_w = int(crop_dims[0]), int(crop_dims[1])
    center_top = int(im_shape[0] / 2.0 - crop_h / 2.0)
    center_left = int(im_shape[1] / 2.0 - crop_w / 2.0)
    corners = [(0, 0), (0, im_shape[1] - crop_w),
               (im_shape[0] - crop_h, 0), (im_shape[0] - crop_h, im_shape[1] - crop_w),
               (center_top, center_left)]
    crops = np.empty((10 * len(images), crop_h, crop_w, im_shape[-1]), dtype=np.float32)
    ix = 0
    for im in images:
        for top, left in corners:
            crops[ix] = im[top:top + crop_h, left:left + crop_w, :]
            ix += 1
        crops[ix:ix + 5] = crops[ix - 5:ix, :, ::-1, :]
        ix += 5
    return crops


class Transformer:
    """Preprocess images for a net's inputs and undo it.

    ``inputs`` maps input name -> its blob shape (N, C, H, W).  preprocess applies, in order:
    resize to (H, W), transpose, channel swap, raw scale, mean subtraction, input scale.
    """

    def __init__(self, inputs):
        self.inputs = dict(inputs)
        self.transpose = {}
        self.channel_swap = {}
        self.raw_scale = {}
        self.mean = {}
        self.input_scale = {}

    def _check_input(self, in_):
        if in_ not in self.inputs:
            raise KeyError("%s is not one of the net inputs: %s" % (in_, list(self.inputs)))

    def preprocess(self, in_, data):
        """H x W x K image -> the net's C x H x W float32 input."""
        self._check_input(in_)
        caffe_in = np.asarray(data).astype(np.float32, copy=True)
        in_dims = tuple(self.inputs[in_][2:])
        if caffe_in.shape[:2] != in_dims:
            caffe_in = resize_image(caffe_in, in_dims)
        transpose = self.transpose.get(in_)
        channel_swap = self.channel_swap.get(in_)
        raw_scale = self.raw_scale.get(in_)
        mean = self.mean.get(in_)
        input_scale = self.input_scale.get(in_)
        if transpose is not None:
            caffe_in = caffe_in.transpose(transpose)
        if channel_swap is not None:
            caffe_in = caffe_in[list(channel_swap), :, :]
        if raw_scale is not None:
            caffe_in *= raw_scale
        if mean is not None:
            caffe_in -= mean
        if input_scale is not None:
            caffe_in *= input_scale
        return caffe_in

    def deprocess(self, in_, data):
        """The net's input (or a gradient of it) back to an H x W x K image."""
        self._check_input(in_)
        decaf_in = np.array(data, dtype=np.float32).squeeze()
        transpose = self.transpose.get(in_)
        channel_swap = self.channel_swap.get(in_)
        raw_scale = self.raw_scale.get(in_)
        mean = self.mean.get(in_)
        input_scale = self.input_scale.get(in_)
        if input_scale is not None:
            decaf_in /= input_scale
        if mean is not None:
            decaf_in += mean
        if raw_scale is not None:
            decaf_in /= raw_scale
        if channel_swap is not None:
            decaf_in = decaf_in[np.argsort(channel_swap), :, :]
        if transpose is not None:
            decaf_in = decaf_in.transpose(np.argsort(transpose))
        return decaf_in

    def set_transpose(self, in_, order):
        """Axis order taking the image to the input, e.g. (2, 0, 1) for H x W x C -> C x H x W."""
        self._check_input(in_)
        if len(order) != len(self.inputs[in_]) - 1:
            raise ValueError("transpose order %s needs %d axes, as the input %s has"
                             % (tuple(order), len(self.inputs[in_]) - 1, in_))
        self.transpose[in_] = tuple(order)

    def set_channel_swap(self, in_, order):
        """Channel order taking the image to the input, e.g. (2, 1, 0) for RGB -> BGR."""
        self._check_input(in_)
        if len(order) != self.inputs[in_][1]:
            raise ValueError("channel swap %s needs %d channels, as the input %s has"
                             % (tuple(order), self.inputs[in_][1], in_))
        self.channel_swap[in_] = tuple(order)

    def set_raw_scale(self, in_, scale):
        """Multiply by this after the swap, e.g. 255 to go from [0, 1] to [0, 255]."""
        self._check_input(in_)
        self.raw_scale[in_] = scale

    def set_mean(self, in_, mean):
        """Per-channel mean (C,) or a full mean (C x H x W, or H x W for one channel); a full
        mean of another height and width is resized to the input's, as pycaffe does."""
        self._check_input(in_)
        mean = np.asarray(mean, dtype=np.float32)
        if mean.ndim == 1:
            if mean.shape[0] != self.inputs[in_][1]:
                raise ValueError("mean has %d channels but input %s has %d"
                                 % (mean.shape[0], in_, self.inputs[in_][1]))
            mean = mean[:, np.newaxis, np.newaxis]
        else:
            shape = mean.shape if mean.ndim != 2 else (1,) + mean.shape
            if len(shape) != 3:
                raise ValueError("mean must have 1, 2 or 3 axes, got shape %s" % (mean.shape,))
            mean = mean.reshape(shape)
            in_shape = tuple(self.inputs[in_][1:])
            if tuple(shape) != in_shape:
                if shape[0] != in_shape[0]:
                    raise ValueError("mean shape %s does not match input %s shape %s"
                                     % (tuple(shape), in_, in_shape))
                # pycaffe resizes a mean image of another size (ilsvrc_2012_mean.npy's
                # 256 x 256 for a 227 x 227 net): scaled to [0, 1], resized, scaled back
                low, high = mean.min(), mean.max()
                normal = (mean - low) / (high - low) if high > low else mean - low
                mean = resize_image(normal.transpose((1, 2, 0)), in_shape[1:]).transpose(
                    (2, 0, 1)) * (high - low) + low
        self.mean[in_] = mean

    def set_input_scale(self, in_, scale):
        """Multiply by this after mean subtraction (e.g. 0.017 for some nets)."""
        self._check_input(in_)
        self.input_scale[in_] = scale
