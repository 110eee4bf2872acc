"""Points where the data layers and tools must behave as Caffe 1.0's do, each checked against
values worked out in the test: batches of mixed image sizes under a crop, WindowData's batch
layout and thresholds, convert_imageset's channels and resize flags, HDF5Output's axes."""
import io

import lmdb
import numpy as np
import pytest
from google.protobuf import text_format
from PIL import Image

import poseidon_caffe.layers  # noqa: F401  (registers the layer types)
from poseidon_caffe.blob import Blob
from poseidon_caffe.tools import datasets as tools
from poseidon_caffe.data.images import resize
from poseidon_caffe.layers import create_layer
from poseidon_caffe.proto import caffe_pb2
from poseidon_caffe.rng import set_random_seed

try:
    import h5py
except ImportError:          # the hdf5 extra is optional
    h5py = None


def build(text, tops=2, bottoms=(), phase=caffe_pb2.TRAIN):
    layer = create_layer(text_format.Parse(text, caffe_pb2.LayerParameter()), phase)
    top = [Blob() for _ in range(tops)]
    layer.setup(list(bottoms), top)
    layer.reshape(list(bottoms), top)
    return layer, top


def read_db(path):
    env = lmdb.open(path, readonly=True, lock=False)
    with env.begin() as txn:
        items = [(k.decode(), caffe_pb2.Datum.FromString(v)) for k, v in txn.cursor()]
    env.close()
    return items


def test_data_batch_of_mixed_sizes_is_centre_cropped_image_by_image(tmp_path):
    # Caffe transforms each record into its slot; a crop makes records of any size >= crop fit
    rng = np.random.default_rng(1)
    small = rng.integers(0, 256, size=(3, 6, 6)).astype(np.uint8)
    large = rng.integers(0, 256, size=(3, 8, 11)).astype(np.uint8)
    env = lmdb.open(str(tmp_path / "db"), map_size=1 << 24)
    with env.begin(write=True) as txn:
        for i, image in enumerate((small, large)):
            datum = caffe_pb2.Datum(channels=3, height=image.shape[1], width=image.shape[2],
                                    data=image.tobytes(), label=i)
            txn.put(b"%08d" % i, datum.SerializeToString())
    env.close()
    layer, top = build('name: "d" type: "Data" top: "data" top: "label" '
                       'transform_param { crop_size: 4 scale: 0.5 mean_value: 10 } '
                       'data_param { source: "%s" batch_size: 2 backend: LMDB prefetch: 0 }'
                       % (tmp_path / "db"), phase=caffe_pb2.TEST)
    layer.forward([], top)
    # centre offsets: (6-4)//2 = 1, 1 for the small one; (8-4)//2 = 2, (11-4)//2 = 3 for the other
    want = np.stack([small[:, 1:5, 1:5], large[:, 2:6, 3:7]]).astype(np.float32)
    np.testing.assert_array_equal(top[0].data, (want - 10) * np.float32(0.5))
    np.testing.assert_array_equal(top[1].data, [0, 1])
    layer.close()


def test_data_batch_of_mixed_sizes_without_crop_is_a_clear_error(tmp_path):
    env = lmdb.open(str(tmp_path / "db"), map_size=1 << 24)
    with env.begin(write=True) as txn:
        for i, (h, w) in enumerate(((4, 4), (5, 4))):
            datum = caffe_pb2.Datum(channels=1, height=h, width=w, data=bytes(h * w), label=i)
            txn.put(b"%08d" % i, datum.SerializeToString())
    env.close()
    layer, top = build('name: "d" type: "Data" top: "data" top: "label" '
                       'data_param { source: "%s" batch_size: 2 backend: LMDB prefetch: 0 }'
                       % (tmp_path / "db"))
    with pytest.raises(ValueError, match="differ in shape.*crop_size"):
        layer.forward([], top)
    layer.close()


def _scene(tmp_path, lines):
    rng = np.random.default_rng(7)
    rgb = rng.integers(0, 256, size=(20, 30, 3)).astype(np.uint8)
    Image.fromarray(rgb).save(tmp_path / "scene.png")
    windows = tmp_path / "windows.txt"
    windows.write_text("# 0\n%s\n3\n20\n30\n%d\n%s" % (tmp_path / "scene.png", len(lines),
                                                       "".join(l + "\n" for l in lines)))
    return rgb[:, :, ::-1], windows


def test_window_data_puts_background_first_and_counts_foreground_in_single_precision(
        tmp_path):
    set_random_seed(3)
    bgr, windows = _scene(tmp_path, ["2 0.9 4 2 11 9", "5 0.1 20 10 27 17"])
    layer, top = build('name: "w" type: "WindowData" top: "data" top: "label" '
                       'transform_param { crop_size: 4 } '
                       'window_data_param { source: "%s" batch_size: 40 fg_threshold: 0.5 '
                       'bg_threshold: 0.5 fg_fraction: 0.7 } data_param { prefetch: 0 }'
                       % windows)
    layer.forward([], top)
    # float(40) * float(0.7) rounds to 28.0 in single precision (27.99999952 in double): 28
    # foreground windows, after 12 background ones
    np.testing.assert_array_equal(top[1].data, [0] * 12 + [2] * 28)
    fg = resize(np.ascontiguousarray(bgr[2:10, 4:12]), 4, 4).transpose(2, 0, 1)
    bg = resize(np.ascontiguousarray(bgr[10:18, 20:28]), 4, 4).transpose(2, 0, 1)
    for i in range(40):
        np.testing.assert_array_equal(top[0].data[i], bg if i < 12 else fg)
    layer.close()


@pytest.mark.parametrize("overlap, fg_threshold", [
    ("0.3", "0.3"),      # meets the threshold as Caffe compares them (both floats)
    ("0.55", "0.5"),     # plainly foreground
])
def test_window_data_thresholds_compare_in_single_precision_and_fg_is_never_bg(
        tmp_path, overlap, fg_threshold):
    set_random_seed(5)
    # with bg_threshold 0.6 above the overlap, the window is still foreground only
    bgr, windows = _scene(tmp_path, ["2 %s 4 2 11 9" % overlap, "5 0.1 20 10 27 17"])
    layer, top = build('name: "w" type: "WindowData" top: "data" top: "label" '
                       'transform_param { crop_size: 4 } '
                       'window_data_param { source: "%s" batch_size: 16 fg_threshold: %s '
                       'bg_threshold: 0.6 fg_fraction: 0.25 } data_param { prefetch: 0 }'
                       % (windows, fg_threshold))
    layer.forward([], top)
    np.testing.assert_array_equal(top[1].data, [0] * 12 + [2] * 4)
    bg = resize(np.ascontiguousarray(bgr[10:18, 20:28]), 4, 4).transpose(2, 0, 1)
    for i in range(12):       # every background slot holds the one true background window
        np.testing.assert_array_equal(top[0].data[i], bg)
    layer.close()


@pytest.fixture
def png_folder(tmp_path):
    """Two colour PNGs and one grey PNG of 5x7, and a list file naming them."""
    rng = np.random.default_rng(9)
    root = tmp_path / "png"
    root.mkdir()
    arrays = {}
    for name in ("a.png", "b.png"):
        arrays[name] = rng.integers(0, 256, size=(5, 7, 3)).astype(np.uint8)
        Image.fromarray(arrays[name]).save(root / name)
    arrays["g.png"] = rng.integers(0, 256, size=(5, 7)).astype(np.uint8)
    Image.fromarray(arrays["g.png"]).save(root / "g.png")
    listfile = tmp_path / "list.txt"
    listfile.write_text("a.png 0\nb.png 1\ng.png 2\n")
    return str(root) + "/", str(listfile), arrays


def _decoded_channels(datum):
    return len(Image.open(io.BytesIO(datum.data)).getbands())


def test_encoded_records_hold_the_channels_the_gray_flag_asks_for(tmp_path, png_folder):
    root, listfile, arrays = png_folder
    gray_db, colour_db = str(tmp_path / "gray"), str(tmp_path / "colour")
    assert tools.convert_imageset_main(["-gray", "-encoded", root, listfile, gray_db]) == 0
    for key, datum in read_db(gray_db):
        assert datum.encoded and _decoded_channels(datum) == 1, key
    # colour files re-encoded as grey hold the grey the raw path stores
    raw_gray_db = str(tmp_path / "raw_gray")
    assert tools.convert_imageset_main(["-gray", root, listfile, raw_gray_db]) == 0
    for (key, enc), (_, raw) in zip(read_db(gray_db), read_db(raw_gray_db)):
        decoded = np.asarray(Image.open(io.BytesIO(enc.data)))
        np.testing.assert_array_equal(decoded.ravel(), np.frombuffer(raw.data, np.uint8))
    # without -gray every record is colour, the grey file's included
    assert tools.convert_imageset_main(["-encoded", root, listfile, colour_db]) == 0
    items = dict(read_db(colour_db))
    assert all(_decoded_channels(d) == 3 for d in items.values())
    grey = np.asarray(Image.open(io.BytesIO(items["00000002_g.png"].data)))
    np.testing.assert_array_equal(grey, np.repeat(arrays["g.png"][:, :, None], 3, axis=2))
    # a colour file already as asked is kept byte for byte
    with open(root + "a.png", "rb") as f:
        assert items["00000000_a.png"].data == f.read()


def test_one_resize_flag_alone_leaves_the_images_their_size(tmp_path, png_folder):
    root, listfile, arrays = png_folder
    db = str(tmp_path / "db")
    assert tools.convert_imageset_main(["-resize_width=4", root, listfile, db]) == 0
    for key, datum in read_db(db):
        assert (datum.channels, datum.height, datum.width) == (3, 5, 7), key


@pytest.mark.skipif(h5py is None, reason="h5py (the hdf5 extra) is not installed")
def test_hdf5_output_writes_four_axes_as_caffe_does(tmp_path):
    out = tmp_path / "out.h5"
    a = Blob((2, 3))
    a.data[...] = np.arange(6).reshape(2, 3)
    b = Blob((2,))
    b.data[...] = [7, 8]
    layer, _ = build('name: "o" type: "HDF5Output" bottom: "a" bottom: "b" '
                     'hdf5_output_param { file_name: "%s" }' % out, tops=0, bottoms=(a, b))
    layer.forward([a, b], [])
    layer.close()
    with h5py.File(out, "r") as f:
        assert f["data"].shape == (2, 3, 1, 1)
        assert f["label"].shape == (2, 1, 1, 1)
        np.testing.assert_array_equal(f["data"][:, :, 0, 0], [[0, 1, 2], [3, 4, 5]])
        np.testing.assert_array_equal(f["label"][:, 0, 0, 0], [7, 8])
