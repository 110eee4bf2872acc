"""Caffe's TransformationParameter, each effect checked against values computed here; and the
OpenCV-style resize against hand-worked pixels."""
import numpy as np
import pytest
from google.protobuf import text_format

from poseidon_caffe.data.images import resize
from poseidon_caffe.data.transform import DataTransformer
from poseidon_caffe.io import write_blobproto
from poseidon_caffe.proto import caffe_pb2

TRAIN, TEST = caffe_pb2.TRAIN, caffe_pb2.TEST


def transformer(text, phase):
    param = text_format.Parse(text, caffe_pb2.TransformationParameter())
    return DataTransformer(param, phase, "Data layer 't'")


@pytest.fixture
def batch():
    rng = np.random.default_rng(11)
    return rng.integers(0, 256, size=(6, 3, 7, 8)).astype(np.uint8)


def write_mean(path, mean):
    blob = caffe_pb2.BlobProto()
    blob.num, blob.channels, blob.height, blob.width = (1,) + mean.shape
    blob.data.extend(mean.ravel().tolist())
    write_blobproto(blob, str(path))
    return str(path)


def test_scale_only(batch):
    out = transformer("scale: 0.00390625", TEST).transform(batch)
    assert out.dtype == np.float32
    np.testing.assert_array_equal(out, batch.astype(np.float32) * np.float32(0.00390625))


def test_centre_crop_at_test(batch):
    out = transformer("crop_size: 4", TEST).transform(batch)
    # (7 - 4) // 2 = 1 rows, (8 - 4) // 2 = 2 columns off the top-left corner
    np.testing.assert_array_equal(out, batch[:, :, 1:5, 2:6])


def test_random_crop_at_train_is_a_window_of_each_image(batch):
    t = transformer("crop_size: 4", TRAIN)
    rng = np.random.default_rng(0)
    seen = set()
    for _ in range(5):
        out = t.transform(batch, rng)
        for image, crop in zip(batch, out):
            matches = [(h, w) for h in range(4) for w in range(5)
                       if np.array_equal(image[:, h:h + 4, w:w + 4], crop)]
            assert matches, "a crop that is no window of its image"
            seen.update(matches)
    assert len(seen) > 5          # the offsets vary


def test_mirror_flips_some_images_and_not_others(batch):
    t = transformer("mirror: true", TRAIN)
    out = t.transform(batch, np.random.default_rng(1))
    flipped = [np.array_equal(o, b[:, :, ::-1]) for o, b in zip(out, batch)]
    kept = [np.array_equal(o, b) for o, b in zip(out, batch)]
    assert all(f or k for f, k in zip(flipped, kept))
    assert any(flipped) and any(kept)


def test_mean_file_is_cropped_like_the_data_then_scaled(tmp_path, batch):
    mean = np.random.default_rng(2).uniform(0, 255, size=(3, 7, 8)).astype(np.float32)
    path = write_mean(tmp_path / "mean.binaryproto", mean)
    out = transformer('crop_size: 5 scale: 0.5 mean_file: "%s"' % path, TEST).transform(batch)
    # centre offsets (1, 1); each pixel is (value - mean at the same source pixel) * scale
    expected = np.empty((6, 3, 5, 5), dtype=np.float32)
    for n in range(6):
        for c in range(3):
            for h in range(5):
                for w in range(5):
                    expected[n, c, h, w] = (np.float32(batch[n, c, 1 + h, 1 + w])
                                            - mean[c, 1 + h, 1 + w]) * np.float32(0.5)
    np.testing.assert_allclose(out, expected, rtol=0, atol=1e-5)


def test_mean_file_with_random_crop_and_mirror(tmp_path, batch):
    mean = np.random.default_rng(4).uniform(0, 255, size=(3, 7, 8)).astype(np.float32)
    path = write_mean(tmp_path / "mean.binaryproto", mean)
    t = transformer('crop_size: 4 mirror: true mean_file: "%s"' % path, TRAIN)
    out = t.transform(batch, np.random.default_rng(9))
    centred = batch.astype(np.float32) - mean
    for image, crop in zip(centred, out):
        candidates = [image[:, h:h + 4, w:w + 4] for h in range(4) for w in range(5)]
        candidates += [c[:, :, ::-1] for c in candidates]
        assert any(np.allclose(c, crop, atol=1e-4) for c in candidates)


def test_mean_values_per_channel_and_single(batch):
    out = transformer("mean_value: 10 mean_value: 20 mean_value: 30", TEST).transform(batch)
    expected = batch.astype(np.float32) - np.array([10, 20, 30], np.float32)[None, :, None, None]
    np.testing.assert_array_equal(out, expected)
    out1 = transformer("mean_value: 100 scale: 2", TEST).transform(batch)
    np.testing.assert_array_equal(out1, (batch.astype(np.float32) - 100) * 2)


def test_wrong_number_of_mean_values_is_an_error(batch):
    with pytest.raises(ValueError, match="mean_value"):
        transformer("mean_value: 1 mean_value: 2", TEST).transform(batch)


def test_mean_file_of_wrong_shape_names_the_file(tmp_path, batch):
    path = write_mean(tmp_path / "small_mean.binaryproto", np.zeros((3, 5, 5), np.float32))
    with pytest.raises(ValueError, match=r"small_mean\.binaryproto.*3x5x5.*3x7x8"):
        transformer('mean_file: "%s"' % path, TEST).transform(batch)


def test_mean_file_and_values_together_is_an_error(tmp_path):
    path = write_mean(tmp_path / "m.binaryproto", np.zeros((3, 7, 8), np.float32))
    with pytest.raises(ValueError, match="both mean_file and mean_value"):
        transformer('mean_file: "%s" mean_value: 3' % path, TEST)


def test_crop_larger_than_image_is_an_error(batch):
    with pytest.raises(ValueError, match="crop_size 9"):
        transformer("crop_size: 9", TEST).transform(batch)


def test_resize_matches_hand_worked_bilinear_values():
    row = np.array([[0, 255]], np.uint8)[:, :, None]
    # centres aligned: x_src = (x + 0.5) / 2 - 0.5 -> clamp(-0.25)=0, 0.25, 0.75, clamp(1.25)=1
    np.testing.assert_array_equal(resize(row, 1, 4)[0, :, 0], [0, 64, 191, 255])
    block = (np.arange(16, dtype=np.uint8) * 10).reshape(4, 4, 1)
    # halving: every output pixel is the mean of a 2x2 block
    np.testing.assert_array_equal(resize(block, 2, 2)[:, :, 0], [[25, 45], [105, 125]])
    batch = np.stack([block, 255 - block])
    assert resize(batch, 2, 2).shape == (2, 2, 2, 1)
