"""caffe.Classifier and caffe.Detector against preprocessing and a softmax worked out in the test.

The net is Input 1x3x8x8 -> InnerProduct 3 -> Softmax whose class c scores GAIN times the mean
of input channel c, so the predicted class is the dominant colour by construction; the
expected probabilities are computed here with numpy from the same weights.
"""
import numpy as np
import pytest
from PIL import Image

import poseidon_caffe as caffe

GAIN = 4.0
MEAN = np.array([0.1, 0.2, 0.3], dtype=np.float32) * 255     # net (BGR) channel order
SWAP = (2, 1, 0)

DEPLOY = """
name: "tiny"
layer { name: "data" type: "Input" top: "data"
        input_param { shape { dim: 1 dim: 3 dim: 8 dim: 8 } } }
layer { name: "score" type: "InnerProduct" bottom: "data" top: "score"
        inner_product_param { num_output: 3 } }
layer { name: "prob" type: "Softmax" bottom: "score" top: "prob" }
"""


def _weights():
    weight = np.zeros((3, 3 * 64), dtype=np.float32)
    for c in range(3):
        weight[c, c * 64:(c + 1) * 64] = GAIN / 64
    bias = np.array([0.0, 0.01, -0.01], dtype=np.float32)
    return weight, bias


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny")
    deploy = root / "deploy.prototxt"
    deploy.write_text(DEPLOY)
    net = caffe.Net(str(deploy), caffe.TEST)
    weight, bias = _weights()
    net.params["score"][0].data[...] = weight
    net.params["score"][1].data[...] = bias
    weights = root / "tiny.caffemodel"
    net.save(str(weights))
    return str(deploy), str(weights)


def _to_net_input(crop_hwc, swap=SWAP):
    """The preprocessing written out: HWC -> CHW, channel swap, x255, -mean, /255."""
    chw = np.asarray(crop_hwc, dtype=np.float64).transpose(2, 0, 1)[list(swap)]
    return (chw * 255 - MEAN[:, None, None]) / 255


def _softmax_of(crop_hwc, swap=SWAP):
    weight, bias = _weights()
    logits = weight.astype(np.float64) @ _to_net_input(crop_hwc, swap).ravel() + bias
    e = np.exp(logits - logits.max())
    return e / e.sum()


def _images():
    uniform_green = np.empty((10, 10, 3), np.float32)
    uniform_green[...] = (0.2, 0.9, 0.1)
    red_block = np.empty((10, 10, 3), np.float32)
    red_block[...] = (0.1, 0.2, 0.6)                       # blue surround
    red_block[2:8, 1:8] = (0.95, 0.1, 0.05)                # off-centre red block
    return [uniform_green, red_block]


def _classifier(model):
    deploy, weights = model
    return caffe.Classifier(deploy, weights, image_dims=(12, 12), mean=MEAN,
                            input_scale=1 / 255.0, raw_scale=255, channel_swap=SWAP)


def test_classifier_centre_crop(model):
    clf = _classifier(model)
    images = _images()
    probs = clf.predict(images, oversample=False)
    assert probs.shape == (2, 3)
    for image, got in zip(images, probs):
        resized = caffe.io.resize_image(image, (12, 12))
        expected = _softmax_of(resized[2:10, 2:10])          # centre 8 x 8 of 12 x 12
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)
    # image green -> BGR channel 1; red -> BGR channel 2
    assert probs.argmax(axis=1).tolist() == [1, 2]


def test_classifier_oversample_averages_ten_crops(model):
    clf = _classifier(model)
    images = _images()
    probs = clf.predict(images)
    resized = np.stack([caffe.io.resize_image(im, (12, 12)) for im in images])
    crops = caffe.io.oversample(resized, (8, 8))
    assert crops.shape == (20, 8, 8, 3)
    per_crop = np.array([_softmax_of(c) for c in crops])
    expected = per_crop.reshape(2, 10, 3).mean(axis=1)
    np.testing.assert_allclose(probs, expected, rtol=1e-5, atol=1e-6)
    assert probs.argmax(axis=1).tolist() == [1, 2]
    # the red block's crops disagree, so the average is not any single crop nor the centre
    spread = per_crop[10:, 2].max() - per_crop[10:, 2].min()
    assert spread > 0.05
    centre = clf.predict(images, oversample=False)
    assert abs(probs[1, 2] - centre[1, 2]) > 0.01
    # the same answer the net gives on the crops fed to it directly
    direct = caffe.Net(model[0], model[1], caffe.TEST)
    net_in = np.stack([_to_net_input(c) for c in crops]).astype(np.float32)
    out = direct.forward_all(data=net_in)["prob"]
    np.testing.assert_allclose(probs, out.reshape(2, 10, 3).mean(axis=1), rtol=1e-5, atol=1e-6)


def test_classifier_defaults_to_net_input_size(model):
    deploy, weights = model
    clf = caffe.Classifier(deploy, weights)
    np.testing.assert_array_equal(clf.image_dims, (8, 8))
    image = np.random.default_rng(3).random((8, 8, 3)).astype(np.float32)
    got = clf.predict([image], oversample=False)[0]
    logits = _weights()[0].astype(np.float64) @ image.transpose(2, 0, 1).ravel() + _weights()[1]
    expected = np.exp(logits - logits.max())
    np.testing.assert_allclose(got, expected / expected.sum(), rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="at least one image"):
        clf.predict([])
    with pytest.raises(ValueError, match="image 1"):
        clf.predict([image, image[:, :, :1]])


def _scene():
    rng = np.random.default_rng(7)
    pixels = (rng.random((20, 24, 3)) * 60).astype(np.uint8)    # dark noise
    pixels[2:12, 3:11, 0] = 230                                 # red patch
    pixels[10:20, 12:24, 1] = 220                               # green patch
    return pixels


def _detector(model, context_pad=None, swap=SWAP):
    deploy, weights = model
    return caffe.Detector(deploy, weights, mean=MEAN, input_scale=1 / 255.0, raw_scale=255,
                          channel_swap=swap, context_pad=context_pad)


def test_detector_windows_match_hand_crops(model, tmp_path):
    path = str(tmp_path / "scene.png")
    Image.fromarray(_scene()).save(path)
    image = np.asarray(Image.open(path), dtype=np.float32) / 255
    windows = np.array([[2, 3, 12, 11], [10, 12, 20, 24]])
    detections = _detector(model).detect_windows([(path, windows)])
    assert len(detections) == 2
    for det, (ymin, xmin, ymax, xmax) in zip(detections, windows):
        assert det["filename"] == path
        np.testing.assert_array_equal(det["window"], (ymin, xmin, ymax, xmax))
        crop = caffe.io.resize_image(image[ymin:ymax, xmin:xmax], (8, 8))
        np.testing.assert_allclose(det["prediction"], _softmax_of(crop), rtol=1e-5, atol=1e-6)
    # red patch -> BGR channel 2, green patch -> channel 1
    assert [int(d["prediction"].argmax()) for d in detections] == [2, 1]


def test_detector_context_pad_at_borders(model, tmp_path):
    # a swap that is not its own inverse: input channels (G, B, R) of image (R, G, B)
    rotate = (1, 2, 0)
    det = _detector(model, context_pad=2, swap=rotate)
    image = np.random.default_rng(11).random((20, 20, 3)).astype(np.float32)
    crop_mean = np.array([MEAN[2], MEAN[0], MEAN[1]]) / 255   # image R, G, B, unscaled
    np.testing.assert_allclose(det.crop_mean.reshape(-1, 3)[0], crop_mean, rtol=1e-6)
    assert det.crop_dims.tolist() == [8, 8, 3]

    # window [0, 0, 9, 9] (edges inclusive: 10 px): scale 8 / (8 - 4) = 2 about centre (5, 5)
    # gives box (-5, -5, 15, 15), 21 px tall -> 8/21 input px per image px; the 5 px beyond
    # the top/left edge take round(5 * 8/21) = 2 input px, the clipped box (0, 0, 15, 15)
    # round(16 * 8/21) = 6 px.
    crop = det.crop(image, np.array([0, 0, 9, 9]))
    assert crop.shape == (8, 8, 3)
    np.testing.assert_allclose(crop[:2], np.broadcast_to(crop_mean, (2, 8, 3)), rtol=1e-6)
    np.testing.assert_allclose(crop[:, :2], np.broadcast_to(crop_mean, (8, 2, 3)), rtol=1e-6)
    np.testing.assert_allclose(crop[2:, 2:], caffe.io.resize_image(image[0:15, 0:15], (6, 6)),
                               rtol=1e-6)

    # window [10, 10, 20, 20] (11 px): box round(15.5 -/+ 11) = (4, 4, 26, 26), 23 px; no pad
    # before, clipped to (4, 4, 20, 20): round(17 * 8/23) = 6 px, the rest is mean.
    crop = det.crop(image, np.array([10, 10, 20, 20]))
    np.testing.assert_allclose(crop[:6, :6], caffe.io.resize_image(image[4:20, 4:20], (6, 6)),
                               rtol=1e-6)
    np.testing.assert_allclose(crop[6:], np.broadcast_to(crop_mean, (2, 8, 3)), rtol=1e-6)
    np.testing.assert_allclose(crop[:, 6:], np.broadcast_to(crop_mean, (8, 2, 3)), rtol=1e-6)

    # interior window [6, 6, 13, 13] (8 px): box (2, 2, 18, 18), 17 px -> all 8 px from image
    crop = det.crop(image, np.array([6, 6, 13, 13]))
    np.testing.assert_allclose(crop, caffe.io.resize_image(image[2:18, 2:18], (8, 8)),
                               rtol=1e-6)

    # detect_windows uses the padded crop
    path = str(tmp_path / "noise.png")
    Image.fromarray((image * 255).round().astype(np.uint8)).save(path)
    saved = np.asarray(Image.open(path), dtype=np.float32) / 255
    expected_crop = np.empty((8, 8, 3), np.float32)
    expected_crop[...] = crop_mean
    expected_crop[2:, 2:] = caffe.io.resize_image(saved[0:15, 0:15], (6, 6))
    (found,) = det.detect_windows([(path, np.array([[0, 0, 9, 9]]))])
    np.testing.assert_allclose(found["prediction"], _softmax_of(expected_crop, rotate),
                               rtol=1e-5, atol=1e-6)

    # without padding the same window is the plain slice; configure_crop switches it
    det.configure_crop(None)
    np.testing.assert_array_equal(det.crop(image, np.array([0, 0, 9, 9])), image[0:9, 0:9])
    with pytest.raises(ValueError, match="outside"):
        det.crop(image, np.array([5, 5, 25, 10]))
    with pytest.raises(ValueError, match="context_pad"):
        det.configure_crop(4)
