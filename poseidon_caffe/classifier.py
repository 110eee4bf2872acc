"""pycaffe's caffe.Classifier: a TEST net that classifies whole images.

Images (H x W x K float arrays in [0, 1], as caffe.io.load_image gives) are resized to
``image_dims``, cropped to the net's input size (the centre crop, or ten crops: four corners,
centre and their mirrors, whose predictions are averaged), preprocessed by a Transformer on
the net's first input and run through the net.
"""
import numpy as np

from . import imageio
from .imageio import Transformer, resize_image
from .net import TEST, Net, NetError

__all__ = ["Classifier", "configure_transformer"]


def configure_transformer(net, model_file, mean, input_scale, raw_scale, channel_swap):
    """A Transformer for the net's first input: image axes to C x H x W plus the given steps."""
    if not net.inputs:
        raise NetError("%s: the net has no input blob to feed images to" % (model_file,))
    in_ = net.inputs[0]
    shape = tuple(net.blobs[in_].shape)
    if len(shape) != 4:
        raise NetError("%s: input %r must be N x C x H x W for images, got shape %s"
                       % (model_file, in_, shape))
    transformer = Transformer({in_: shape})
    transformer.set_transpose(in_, (2, 0, 1))
    if mean is not None:
        transformer.set_mean(in_, mean)
    if input_scale is not None:
        transformer.set_input_scale(in_, input_scale)
    if raw_scale is not None:
        transformer.set_raw_scale(in_, raw_scale)
    if channel_swap is not None:
        transformer.set_channel_swap(in_, channel_swap)
    return transformer


class Classifier(Net):
    """Net specialised for image class prediction by centre cropping or oversampling.

    image_dims: (height, width) images are resized to before cropping; by default the net's
    input size (the whole image is the crop).  mean, input_scale, raw_scale, channel_swap:
    the Transformer's preprocessing of the first input.
    """

    def __init__(self, model_file, pretrained_file, image_dims=None, mean=None,
                 input_scale=None, raw_scale=None, channel_swap=None):
        Net.__init__(self, model_file, TEST, weights=pretrained_file)
        self.transformer = configure_transformer(self, model_file, mean, input_scale,
                                                 raw_scale, channel_swap)
        self.crop_dims = np.array(self.blobs[self.inputs[0]].shape[2:])
        if image_dims is None or len(image_dims) == 0:
            image_dims = self.crop_dims
        image_dims = np.array(image_dims, dtype=int)
        if image_dims.shape != (2,) or np.any(image_dims < 1):
            raise ValueError("image_dims must be (height, width), got %s" % (image_dims,))
        self.image_dims = image_dims

    def _resized(self, inputs):
        if len(inputs) == 0:
            raise ValueError("predict needs at least one image")
        channels = np.asarray(inputs[0]).shape[2] if np.ndim(inputs[0]) == 3 else None
        resized = np.zeros((len(inputs), self.image_dims[0], self.image_dims[1],
                            channels or 0), dtype=np.float32)
        for ix, image in enumerate(inputs):
            image = np.asarray(image)
            if image.ndim != 3 or image.shape[2] != channels:
                raise ValueError("image %d must be H x W x %s like the first image, got shape %s"
                                 % (ix, channels, image.shape))
            resized[ix] = resize_image(image, self.image_dims)
        return resized

    def _center_crop(self, images):
        center = self.image_dims / 2.0
        half = self.crop_dims / 2.0
        top, left = (center - half).astype(int)
        bottom, right = (center + half).astype(int)
        return images[:, top:bottom, left:right, :]

    def predict(self, inputs, oversample=True):
        """Class probabilities, one row per image (N x classes).

        inputs: iterable of H x W x K images.  oversample: average the predictions over the
        ten crops (True) or use the centre crop only (False).
        """
        images = self._resized(list(inputs))
        if oversample and np.any(self.image_dims < self.crop_dims):
            raise ValueError("oversample needs image_dims %s at least the net's input size %s"
                             % (tuple(self.image_dims), tuple(self.crop_dims)))
        crops = imageio.oversample(images, self.crop_dims) if oversample else self._center_crop(images)
        in_ = self.inputs[0]
        caffe_in = np.zeros((crops.shape[0], crops.shape[3]) + crops.shape[1:3], np.float32)
        for ix, crop in enumerate(crops):
            caffe_in[ix] = self.transformer.preprocess(in_, crop)
        predictions = self.forward_all(**{in_: caffe_in})[self.outputs[0]]
        if oversample:
            predictions = predictions.reshape((len(predictions) // 10, 10, -1)).mean(axis=1)
        return predictions

