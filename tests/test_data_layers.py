"""ImageData, HDF5Data, HDF5Output and WindowData layers on files written here."""
import builtins

import numpy as np
import pytest
from google.protobuf import text_format
from PIL import Image

import poseidon_caffe.layers  # noqa: F401
from poseidon_caffe import data as data_pkg
from poseidon_caffe.blob import Blob
from poseidon_caffe.data.images import resize
from poseidon_caffe.layers import create_layer
from poseidon_caffe.proto import caffe_pb2

try:
    import h5py
except ImportError:          # the hdf5 extra is optional; only the HDF5 tests need it
    h5py = None
needs_h5py = pytest.mark.skipif(h5py is None, reason="h5py (the hdf5 extra) is not installed")


def build(text, tops=2, bottoms=(), phase=caffe_pb2.TRAIN):
    layer = create_layer(text_format.Parse(text, caffe_pb2.LayerParameter()), phase)
    top = [Blob() for _ in range(tops)]
    layer.setup(list(bottoms), top)
    layer.reshape(list(bottoms), top)
    return layer, top


@pytest.fixture
def listed_images(tmp_path):
    rng = np.random.default_rng(4)
    rgbs = []
    for i in range(5):
        rgb = rng.integers(0, 256, size=(8, 6, 3)).astype(np.uint8)
        Image.fromarray(rgb).save(tmp_path / ("p%d.png" % i))
        rgbs.append(rgb)
    listfile = tmp_path / "train.txt"
    listfile.write_text("".join("p%d.png %d\n" % (i, 10 * i) for i in range(5)))
    return str(tmp_path), str(listfile), rgbs


def test_image_data_reads_the_list_in_order_with_wraparound(listed_images):
    root, listfile, rgbs = listed_images
    layer, top = build('name: "img" type: "ImageData" top: "data" top: "label" '
                       'image_data_param { source: "%s" root_folder: "%s" batch_size: 3 } '
                       'data_param { prefetch: 2 }' % (listfile, root))
    for step in range(3):
        layer.forward([], top)
        idx = [(3 * step + j) % 5 for j in range(3)]
        np.testing.assert_array_equal(top[1].data, [10 * i for i in idx])
        want = np.stack([rgbs[i][:, :, ::-1].transpose(2, 0, 1) for i in idx])
        np.testing.assert_array_equal(top[0].data, want)
    layer.close()


def test_image_data_resize_and_gray(listed_images):
    root, listfile, rgbs = listed_images
    layer, top = build('name: "img" type: "ImageData" top: "data" top: "label" '
                       'image_data_param { source: "%s" root_folder: "%s/" batch_size: 2 '
                       'new_height: 4 new_width: 3 is_color: false } data_param { prefetch: 0 }'
                       % (listfile, root))
    layer.forward([], top)
    assert top[0].shape == (2, 1, 4, 3)
    gray = np.asarray(Image.fromarray(rgbs[0]).convert("L"))
    np.testing.assert_array_equal(top[0].data[0, 0], resize(gray[:, :, None], 4, 3)[:, :, 0])
    layer.close()


def test_image_data_shuffle_visits_every_image_each_epoch(listed_images):
    root, listfile, rgbs = listed_images
    layer, top = build('name: "img" type: "ImageData" top: "data" top: "label" '
                       'image_data_param { source: "%s" root_folder: "%s" batch_size: 5 '
                       'shuffle: true } data_param { prefetch: 0 }' % (listfile, root))
    orders = []
    for _ in range(4):
        layer.forward([], top)
        assert sorted(top[1].data) == [0, 10, 20, 30, 40]
        orders.append(tuple(top[1].data))
    assert len(set(orders)) > 1
    layer.close()


def test_image_list_naming_a_missing_image_names_the_file(listed_images, tmp_path):
    root, listfile, rgbs = listed_images
    with open(listfile, "a") as f:
        f.write("missing_cat.jpg 3\n")
    layer, top = build('name: "img" type: "ImageData" top: "data" top: "label" '
                       'image_data_param { source: "%s" root_folder: "%s" batch_size: 3 }'
                       % (listfile, root))
    layer.forward([], top)
    with pytest.raises(ValueError, match=r"missing_cat\.jpg.*train\.txt"):
        layer.forward([], top)
    layer.close()
    with pytest.raises(ValueError, match=r"nolist\.txt"):
        build('name: "img" type: "ImageData" top: "data" top: "label" '
              'image_data_param { source: "%s/nolist.txt" batch_size: 3 }' % tmp_path)


@pytest.fixture
def hdf5_files(tmp_path):
    rng = np.random.default_rng(6)
    paths, datas, labels = [], [], []
    for k, rows in enumerate((5, 3)):
        data = rng.standard_normal((rows, 2, 3)).astype(np.float32)
        label = np.arange(rows, dtype=np.float32) + 100 * k
        path = tmp_path / ("part%d.h5" % k)
        with h5py.File(path, "w") as f:
            f["data"] = data
            f["label"] = label
        paths.append(str(path))
        datas.append(data)
        labels.append(label)
    listfile = tmp_path / "h5list.txt"
    listfile.write_text("\n".join(paths) + "\n")
    return str(listfile), np.concatenate(datas), np.concatenate(labels)


@needs_h5py
def test_hdf5_data_reads_rows_across_files_and_wraps(hdf5_files):
    listfile, data, label = hdf5_files
    layer, top = build('name: "h" type: "HDF5Data" top: "data" top: "label" '
                       'hdf5_data_param { source: "%s" batch_size: 3 }' % listfile)
    assert top[0].shape == (3, 2, 3)
    for step in range(4):
        layer.forward([], top)
        idx = [(3 * step + j) % 8 for j in range(3)]
        np.testing.assert_array_equal(top[0].data, data[idx])
        np.testing.assert_array_equal(top[1].data, label[idx])


@needs_h5py
def test_hdf5_data_sharding_interleaves_to_the_big_batch(hdf5_files):
    listfile, data, label = hdf5_files
    text = ('name: "h" type: "HDF5Data" top: "data" top: "label" '
            'hdf5_data_param { source: "%s" batch_size: %d }')
    try:
        got = []
        for rank in range(2):
            data_pkg.set_worker(rank, 2)
            layer, top = build(text % (listfile, 2))
            layer.forward([], top)
            layer.forward([], top)
            got.append(top[1].data.copy())
    finally:
        data_pkg.set_worker(0, 1)
    layer, top = build(text % (listfile, 4))
    layer.forward([], top)
    layer.forward([], top)
    joined = np.empty(4)
    joined[0::2], joined[1::2] = got[0], got[1]
    np.testing.assert_array_equal(joined, top[1].data)


@needs_h5py
def test_hdf5_missing_dataset_names_file_and_dataset(hdf5_files):
    listfile, data, label = hdf5_files
    with pytest.raises(ValueError, match=r"part0\.h5.*'weights'"):
        build('name: "h" type: "HDF5Data" top: "data" top: "weights" '
              'hdf5_data_param { source: "%s" batch_size: 2 }' % listfile)


@needs_h5py
def test_hdf5_output_appends_each_batch(tmp_path):
    out = tmp_path / "out.h5"
    a = Blob((2, 3))
    a.data[...] = np.arange(6).reshape(2, 3)
    b = Blob((2,))
    b.data[...] = [7, 8]
    layer, _ = build('name: "o" type: "HDF5Output" bottom: "a" bottom: "b" '
                     'hdf5_output_param { file_name: "%s" }' % out, tops=0, bottoms=(a, b))
    layer.forward([a, b], [])
    a.data[...] += 10
    layer.forward([a, b], [])
    layer.close()
    with h5py.File(out, "r") as f:
        # four axes, as Caffe writes them: N x 3 x 1 x 1 and N x 1 x 1 x 1
        np.testing.assert_array_equal(f["data"][:, :, 0, 0],
                                      np.concatenate([np.arange(6).reshape(2, 3),
                                                      np.arange(6).reshape(2, 3) + 10]))
        np.testing.assert_array_equal(f["label"][:, 0, 0, 0], [7, 8, 7, 8])


def test_hdf5_layers_name_h5py_when_it_is_missing(monkeypatch, tmp_path):
    real_import = builtins.__import__

    def no_h5py(name, *args, **kwargs):
        if name == "h5py":
            raise ImportError("No module named 'h5py'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_h5py)
    with pytest.raises(ValueError, match=r"HDF5Data.*h5py"):
        build('name: "h" type: "HDF5Data" top: "data" '
              'hdf5_data_param { source: "%s/x.txt" batch_size: 2 }' % tmp_path, tops=1)


def test_window_data_warps_windows_and_balances_classes(tmp_path):
    rng = np.random.default_rng(12)
    rgb = rng.integers(0, 256, size=(20, 30, 3)).astype(np.uint8)
    Image.fromarray(rgb).save(tmp_path / "scene.png")
    windows = tmp_path / "windows.txt"
    # one image; a foreground window (class 2, overlap 0.9) and a background one (overlap 0.1)
    windows.write_text("# 0\n%s\n3\n20\n30\n2\n2 0.9 4 2 11 9\n5 0.1 20 10 27 17\n"
                       % (tmp_path / "scene.png"))
    layer, top = build('name: "w" type: "WindowData" top: "data" top: "label" '
                       'transform_param { crop_size: 4 } '
                       'window_data_param { source: "%s" batch_size: 8 fg_threshold: 0.5 '
                       'bg_threshold: 0.5 fg_fraction: 0.25 context_pad: 0 crop_mode: "warp" } '
                       'data_param { prefetch: 0 }' % windows)
    layer.forward([], top)
    assert top[0].shape == (8, 3, 4, 4)
    # 8 * 0.25 = 2 foreground windows (label 2) after 6 background ones (label 0), as Caffe
    # fills its batch
    np.testing.assert_array_equal(top[1].data, [0, 0, 0, 0, 0, 0, 2, 2])
    bgr = rgb[:, :, ::-1]
    fg = resize(np.ascontiguousarray(bgr[2:10, 4:12]), 4, 4).transpose(2, 0, 1)
    bg = resize(np.ascontiguousarray(bgr[10:18, 20:28]), 4, 4).transpose(2, 0, 1)
    np.testing.assert_array_equal(top[0].data[7], fg)
    np.testing.assert_array_equal(top[0].data[0], bg)
    layer.close()


@needs_h5py
def test_image_data_and_hdf5_resume_where_they_stopped(listed_images, hdf5_files):
    import json
    root, listfile, rgbs = listed_images
    h5list, data, label = hdf5_files
    texts = ['name: "img" type: "ImageData" top: "data" top: "label" image_data_param { '
             'source: "%s" root_folder: "%s" batch_size: 3 shuffle: true } '
             'data_param { prefetch: 2 }' % (listfile, root),
             'name: "h" type: "HDF5Data" top: "data" top: "label" '
             'hdf5_data_param { source: "%s" batch_size: 3 shuffle: true }' % h5list]
    for text in texts:
        layer, top = build(text)
        for _ in range(3):
            layer.forward([], top)
        state = json.loads(json.dumps(layer.get_resume_state()))
        want = []
        for _ in range(3):
            layer.forward([], top)
            want.append(top[1].data.copy())
        getattr(layer, "close", lambda: None)()
        other, top2 = build(text)
        other.set_resume_state(state)
        for labels in want:
            other.forward([], top2)
            np.testing.assert_array_equal(top2[1].data, labels)
        getattr(other, "close", lambda: None)()


def test_window_data_context_padding_clips_at_the_image_border(tmp_path):
    rng = np.random.default_rng(13)
    rgb = rng.integers(0, 256, size=(20, 30, 3)).astype(np.uint8)
    Image.fromarray(rgb).save(tmp_path / "scene.png")
    windows = tmp_path / "windows.txt"
    windows.write_text("# 0\n%s\n3\n20\n30\n1\n1 0.8 4 2 11 9\n" % (tmp_path / "scene.png"))
    layer, top = build('name: "w" type: "WindowData" top: "data" top: "label" '
                       'transform_param { crop_size: 4 } '
                       'window_data_param { source: "%s" batch_size: 2 fg_threshold: 0.5 '
                       'bg_threshold: 0.5 fg_fraction: 1 context_pad: 1 } '
                       'data_param { prefetch: 0 }' % windows)
    layer.forward([], top)
    # Worked by hand: the 8x8 box centred at (8, 6) grows by crop / (crop - 2 pad) = 2 to
    # x 0..16, y -2..14 (17x17); clipped to y 0..14 it is 17 wide, 15 high, and warps to
    # round(17 * 4/17) = 4 by round(15 * 4/17) = 4 pixels at offset round(2 * 4/17) = 0.
    want = resize(np.ascontiguousarray(rgb[0:15, 0:17, ::-1]), 4, 4).transpose(2, 0, 1)
    np.testing.assert_array_equal(top[0].data[0], want)
    np.testing.assert_array_equal(top[1].data, [1, 1])
    layer.close()
