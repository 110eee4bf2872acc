"""Data layer over LMDBs written here with the lmdb package, Datum by Datum: exact read-back,
wrap-around, sharding, partitions, and the errors for bad databases."""
import io
import os

import lmdb
import numpy as np
import pytest
from google.protobuf import text_format

import poseidon_caffe.layers  # noqa: F401  (registers the layer types)
from poseidon_caffe import data as data_pkg
from poseidon_caffe.blob import Blob
from poseidon_caffe.tools import datasets as tools
from poseidon_caffe.layers import create_layer
from poseidon_caffe.proto import caffe_pb2
from poseidon_caffe.rng import set_random_seed


def write_lmdb(path, values):
    env = lmdb.open(str(path), map_size=1 << 26)
    with env.begin(write=True) as txn:
        for i, value in enumerate(values):
            txn.put(b"%08d" % i, value)
    env.close()
    return str(path)


def raw_datum(image, label):
    datum = caffe_pb2.Datum()
    datum.channels, datum.height, datum.width = image.shape
    datum.data = image.astype(np.uint8).tobytes()
    datum.label = label
    return datum.SerializeToString()


def float_datum(image, label):
    datum = caffe_pb2.Datum()
    datum.channels, datum.height, datum.width = image.shape
    datum.float_data.extend(image.ravel().tolist())
    datum.label = label
    return datum.SerializeToString()


def png_datum(image_hwc_rgb, label):
    from PIL import Image
    buf = io.BytesIO()
    Image.fromarray(image_hwc_rgb).save(buf, format="PNG")
    datum = caffe_pb2.Datum()
    datum.data = buf.getvalue()
    datum.encoded = True
    datum.label = label
    return datum.SerializeToString()


def data_layer(source, batch, phase=caffe_pb2.TRAIN, extra="", prefetch=0, dp=""):
    text = ('name: "d" type: "Data" top: "data" top: "label" '
            'data_param { source: "%s" batch_size: %d backend: LMDB prefetch: %d %s } %s'
            % (source, batch, prefetch, dp, extra))
    param = text_format.Parse(text, caffe_pb2.LayerParameter())
    layer = create_layer(param, phase)
    top = [Blob(), Blob()]
    layer.setup([], top)
    layer.reshape([], top)
    return layer, top


def batches(layer, top, count):
    out = []
    for _ in range(count):
        layer.forward([], top)
        out.append((top[0].data.copy(), top[1].data.copy()))
    return out


@pytest.fixture(autouse=True)
def single_worker():
    data_pkg.set_worker(0, 1)
    yield
    data_pkg.set_worker(0, 1)


@pytest.fixture
def images():
    rng = np.random.default_rng(3)
    return rng.integers(0, 256, size=(7, 3, 4, 5)).astype(np.uint8)


def test_raw_uint8_records_read_back_exactly_with_wraparound(tmp_path, images):
    src = write_lmdb(tmp_path / "raw", [raw_datum(im, 10 + i) for i, im in enumerate(images)])
    layer, top = data_layer(src, 3)
    assert top[0].shape == (3, 3, 4, 5) and top[1].shape == (3,)
    got = batches(layer, top, 4)          # 12 records from 7: wraps around once
    order = [i % 7 for i in range(12)]
    for b, (x, y) in enumerate(got):
        idx = order[3 * b:3 * b + 3]
        np.testing.assert_array_equal(x, images[idx].astype(np.float32))
        np.testing.assert_array_equal(y, [10 + i for i in idx])
    layer.close()


def test_float_data_records_read_back_exactly(tmp_path):
    values = np.linspace(-3.5, 2.25, 2 * 6).reshape(2, 1, 2, 3).astype(np.float32)
    src = write_lmdb(tmp_path / "flt", [float_datum(v, i) for i, v in enumerate(values)])
    layer, top = data_layer(src, 2)
    (x, y), = batches(layer, top, 1)
    np.testing.assert_array_equal(x, values)
    np.testing.assert_array_equal(y, [0, 1])
    layer.close()


def test_encoded_png_records_decode_to_bgr(tmp_path):
    rng = np.random.default_rng(5)
    rgb = rng.integers(0, 256, size=(2, 6, 4, 3)).astype(np.uint8)
    src = write_lmdb(tmp_path / "png", [png_datum(im, 7 * i) for i, im in enumerate(rgb)])
    layer, top = data_layer(src, 2)
    (x, y), = batches(layer, top, 1)
    # Caffe's decoding: BGR channel order, C x H x W
    expected = rgb[:, :, :, ::-1].transpose(0, 3, 1, 2).astype(np.float32)
    np.testing.assert_array_equal(x, expected)
    np.testing.assert_array_equal(y, [0, 7])
    layer.close()

    gray_layer, gray_top = data_layer(src, 2, extra="transform_param { force_gray: true }")
    (g, _), = batches(gray_layer, gray_top, 1)
    r, gch, b = (rgb[..., k].astype(np.float64) for k in range(3))
    luma = (r * 299 + gch * 587 + b * 114) / 1000.0     # ITU-R 601 weights
    assert g.shape == (2, 1, 6, 4)
    assert np.abs(g[:, 0] - luma).max() <= 1.0
    gray_layer.close()


def test_sharded_readers_together_equal_one_reader_with_p_times_the_batch(tmp_path, images):
    src = write_lmdb(tmp_path / "raw", [raw_datum(im, i) for i, im in enumerate(images)])
    batch, workers, steps = 2, 3, 4
    single, single_top = data_layer(src, batch * workers)
    expected = batches(single, single_top, steps)
    single.close()
    per_worker = []
    for rank in range(workers):
        data_pkg.set_worker(rank, workers)
        layer, top = data_layer(src, batch)
        per_worker.append(batches(layer, top, steps))
        layer.close()
    for step in range(steps):
        # interleave: item j of worker r is item j * P + r of the big batch
        labels = np.empty(batch * workers)
        for rank in range(workers):
            labels[rank::workers] = per_worker[rank][step][1]
        np.testing.assert_array_equal(labels, expected[step][1])
        joined = np.empty_like(expected[step][0])
        for rank in range(workers):
            joined[rank::workers] = per_worker[rank][step][0]
        np.testing.assert_array_equal(joined, expected[step][0])


def test_test_phase_is_not_sharded(tmp_path, images):
    src = write_lmdb(tmp_path / "raw", [raw_datum(im, i) for i, im in enumerate(images)])
    data_pkg.set_worker(1, 2)
    layer, top = data_layer(src, 3, phase=caffe_pb2.TEST)
    (_, y), = batches(layer, top, 1)
    np.testing.assert_array_equal(y, [0, 1, 2])
    layer.close()


def test_partitions_give_each_worker_its_striding_share(tmp_path, images):
    src = write_lmdb(tmp_path / "raw", [raw_datum(im, i) for i, im in enumerate(images)])
    assert tools.make_partitions_main([src, "3"]) == 0
    for rank in range(3):
        assert os.path.isdir(data_pkg.partition_path(src, rank))
    for rank in range(3):
        data_pkg.set_worker(rank, 3)
        striding, top = data_layer(src, 2)
        want = batches(striding, top, 3)
        striding.close()
        data_pkg.set_worker(rank, 3, partitioned=True)
        layer, top = data_layer(src, 2)
        got = batches(layer, top, 3)
        layer.close()
        # partitions hold the same records; they only wrap around at their own end
        n_part = len(range(rank, 7, 3))
        for step in range(3):
            np.testing.assert_array_equal(got[step][1] % 7, [(rank + 3 * ((2 * step + j) % n_part))
                                                             for j in range(2)])
        np.testing.assert_array_equal(got[0][1], want[0][1])


def test_missing_partition_names_it(tmp_path, images):
    src = write_lmdb(tmp_path / "raw", [raw_datum(im, i) for i, im in enumerate(images)])
    data_pkg.set_worker(1, 2, partitioned=True)
    with pytest.raises(ValueError, match="raw_1"):
        data_layer(src, 2)


def test_client_partition_is_read_when_present_strided_over_the_clients_workers(tmp_path,
                                                                               images):
    # Poseidon's default: client c's workers read <source>_c; its 2 local workers take
    # records 0, 2, 4 ... and 1, 3, 5 ... of it
    src = write_lmdb(tmp_path / "raw", [raw_datum(im, i) for i, im in enumerate(images)])
    write_lmdb(tmp_path / "raw_1", [raw_datum(im, 100 + i) for i, im in enumerate(images)])
    for local in range(2):
        data_pkg.set_worker(2 + local, 4, client=(1, local, 2))
        layer, top = data_layer(src, 2)
        (_, y), = batches(layer, top, 1)
        layer.close()
        np.testing.assert_array_equal(y, [100 + local, 102 + local])
    # client 0 has no partition: the shared source, worker r of 4 takes r, r+4, ...
    data_pkg.set_worker(1, 4, client=(0, 1, 2))
    layer, top = data_layer(src, 2)
    (_, y), = batches(layer, top, 1)
    layer.close()
    np.testing.assert_array_equal(y, [1, 5])


def test_shared_file_system_selects_the_shared_database(tmp_path, images):
    src = write_lmdb(tmp_path / "raw", [raw_datum(im, i) for i, im in enumerate(images)])
    write_lmdb(tmp_path / "raw_1", [raw_datum(im, 100 + i) for i, im in enumerate(images)])
    data_pkg.set_worker(1, 2, client=(1, 0, 1))
    layer, top = data_layer(src, 2, dp="shared_file_system: true")
    (_, y), = batches(layer, top, 1)
    layer.close()
    np.testing.assert_array_equal(y, [1, 3])
    layer, top = data_layer(src, 2)
    (_, y), = batches(layer, top, 1)
    layer.close()
    np.testing.assert_array_equal(y, [100, 101])


def test_rand_skip_starts_within_the_skip_range(tmp_path, images):
    src = write_lmdb(tmp_path / "raw", [raw_datum(im, i) for i, im in enumerate(images)])
    starts = set()
    for seed in range(12):
        set_random_seed(seed)
        layer, top = data_layer(src, 2, dp="rand_skip: 5")
        (_, y), = batches(layer, top, 1)
        layer.close()
        assert y[1] == (y[0] + 1) % 7          # still in record order after the skip
        starts.add(int(y[0]))
    assert starts <= set(range(5)) and len(starts) > 1


def test_missing_database_names_the_path(tmp_path):
    missing = str(tmp_path / "nowhere_lmdb")
    with pytest.raises(ValueError, match="nowhere_lmdb.*does not exist"):
        data_layer(missing, 2)


def test_database_of_non_datum_records_names_the_file(tmp_path):
    src = write_lmdb(tmp_path / "junk", [b"\xff\xff\xff\xff not a datum", b"\x07"])
    with pytest.raises(ValueError, match="junk.*not a Caffe Datum"):
        data_layer(src, 1)
    # a record that parses as protobuf but holds the wrong number of pixels
    bad = caffe_pb2.Datum(channels=3, height=2, width=2, data=b"\x00" * 5).SerializeToString()
    src2 = write_lmdb(tmp_path / "short", [bad])
    with pytest.raises(ValueError, match="short.*not a Caffe Datum"):
        data_layer(src2, 1)


def test_two_layers_on_one_database_share_it_until_the_last_closes(tmp_path, images):
    src = write_lmdb(tmp_path / "raw", [raw_datum(im, i) for i, im in enumerate(images)])
    train, train_top = data_layer(src, 2)
    test, test_top = data_layer(src, 3, phase=caffe_pb2.TEST)
    train.close()
    (_, y), = batches(test, test_top, 1)
    np.testing.assert_array_equal(y, [0, 1, 2])
    env = test.database.env
    test.close()
    with pytest.raises(lmdb.Error):
        env.stat()
