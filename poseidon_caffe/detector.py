"""pycaffe's caffe.Detector: classify many windows of images in one pass (R-CNN style).

Each window [ymin, xmin, ymax, xmax] is cut out of its image, optionally widened so that
``context_pad`` pixels of the net's input show the surroundings (parts that fall outside the
image are filled with the mean), preprocessed by a Transformer on the net's first input and
classified.  pycaffe's detect_selective_search is not offered: it runs an outside MATLAB
selective-search program to propose windows; propose them elsewhere and call detect_windows.
"""
import numpy as np

from .classifier import configure_transformer
from .imageio import load_image, resize_image
from .net import TEST, Net

__all__ = ["Detector"]


class Detector(Net):
    """Net specialised for windowed detection over a list of crops or proposals.

    mean, input_scale, raw_scale, channel_swap: the Transformer's preprocessing of the first
    input.  context_pad: pixels of the (square) net input given to context around a window.
    """

    def __init__(self, model_file, pretrained_file, mean=None, input_scale=None,
                 raw_scale=None, channel_swap=None, context_pad=None):
        Net.__init__(self, model_file, TEST, weights=pretrained_file)
        self.transformer = configure_transformer(self, model_file, mean, input_scale,
                                                 raw_scale, channel_swap)
        self.configure_crop(context_pad)

    def detect_windows(self, images_windows):
        """images_windows: list of (image filename, windows array of [ymin, xmin, ymax, xmax]).
        Returns one dict per window: 'window', 'prediction' and 'filename'."""
        images_windows = list(images_windows)
        window_inputs = []
        for image_fname, windows in images_windows:
            image = load_image(image_fname).astype(np.float32)
            for window in windows:
                window_inputs.append(self.crop(image, window))
        if not window_inputs:
            raise ValueError("detect_windows needs at least one window")
        in_ = self.inputs[0]
        caffe_in = np.zeros((len(window_inputs), window_inputs[0].shape[2])
                            + tuple(self.blobs[in_].shape[2:]), dtype=np.float32)
        for ix, window_in in enumerate(window_inputs):
            caffe_in[ix] = self.transformer.preprocess(in_, window_in)
        predictions = self.forward_all(**{in_: caffe_in})[self.outputs[0]]
        detections = []
        ix = 0
        for image_fname, windows in images_windows:
            for window in windows:
                detections.append({"window": window, "prediction": predictions[ix],
                                   "filename": image_fname})
                ix += 1
        return detections

    def crop(self, im, window):
        """The window's pixels of an H x W x K image; with context padding, the window widened
        by the context, resized into the net's input size and laid on the mean where it leaves
        the image."""
        window = np.asarray(window)
        if window.shape != (4,):
            raise ValueError("a window is [ymin, xmin, ymax, xmax], got %s" % (window,))
        ymin, xmin, ymax, xmax = (int(v) for v in window)
        im_h, im_w = im.shape[:2]
        if not (0 <= ymin < ymax <= im_h and 0 <= xmin < xmax <= im_w):
            raise ValueError("window %s is empty or outside the %d x %d image"
                             % (window.tolist(), im_h, im_w))
        if not self.context_pad:
            return im[ymin:ymax, xmin:xmax]

        # The window's edges count as inclusive here, as pycaffe measures them.
        crop_size = self.blobs[self.inputs[0]].width      # the input is taken to be square
        scale = crop_size / (1.0 * crop_size - self.context_pad * 2)
        half_h = (ymax - ymin + 1) / 2.0
        half_w = (xmax - xmin + 1) / 2.0
        center = np.array((ymin + half_h, xmin + half_w))
        box = np.round(np.tile(center, 2) + scale * np.array((-half_h, -half_w, half_h, half_w)))
        scale_h = crop_size / (box[2] - box[0] + 1)
        scale_w = crop_size / (box[3] - box[1] + 1)
        # input pixels that stand for the context beyond the image's top / left edge
        pad_y = int(round(max(0.0, -box[0]) * scale_h))
        pad_x = int(round(max(0.0, -box[1]) * scale_w))

        box = np.clip(box, 0.0, [im_h, im_w, im_h, im_w])
        crop_h = int(round((box[2] - box[0] + 1) * scale_h))
        crop_w = int(round((box[3] - box[1] + 1) * scale_w))
        crop_h = min(crop_h, crop_size - pad_y)
        crop_w = min(crop_w, crop_size - pad_x)

        top, left, bottom, right = (int(v) for v in box)
        context_crop = resize_image(im[top:bottom, left:right], (crop_h, crop_w))
        crop = np.ones(self.crop_dims, dtype=np.float32) * self.crop_mean
        crop[pad_y:pad_y + crop_h, pad_x:pad_x + crop_w] = context_crop
        return crop

    def configure_crop(self, context_pad):
        """Set the crop size (the net's input, in image axes) and the context padding; the
        padding fill is the mean taken back to image space (unswapped, unscaled)."""
        in_ = self.inputs[0]
        inverse_transpose = np.argsort(self.transformer.transpose[in_])
        self.crop_dims = np.array(self.blobs[in_].shape[1:])[inverse_transpose]
        if context_pad is not None and not 0 <= 2 * context_pad < self.blobs[in_].width:
            raise ValueError("context_pad %s leaves no room in the %d-pixel input %r"
                             % (context_pad, self.blobs[in_].width, in_))
        self.context_pad = context_pad
        if not self.context_pad:
            return
        mean = self.transformer.mean.get(in_)
        if mean is None:
            self.crop_mean = np.zeros(self.crop_dims, dtype=np.float32)
            return
        crop_mean = mean.copy().transpose(inverse_transpose)
        channel_swap = self.transformer.channel_swap.get(in_)
        if channel_swap is not None:
            # image channel k went to input channel channel_swap.index(k)
            crop_mean = crop_mean[:, :, [list(channel_swap).index(k)
                                         for k in range(crop_mean.shape[2])]]
        raw_scale = self.transformer.raw_scale.get(in_)
        if raw_scale is not None:
            crop_mean = crop_mean / raw_scale
        self.crop_mean = crop_mean.astype(np.float32)
