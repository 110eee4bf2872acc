import numpy as np
import pytest

from poseidon_caffe import rng
from poseidon_caffe.blob import Blob
from poseidon_caffe.fillers import FillerError, fill
from poseidon_caffe.proto import caffe_pb2

FP = caffe_pb2.FillerParameter


def filled(shape, **fields):
    blob = Blob(shape)
    fill(blob, FP(**fields))
    return blob.data.astype(np.float64)


@pytest.fixture(autouse=True)
def seeded():
    rng.set_random_seed(1234)


def test_default_is_constant_zero():
    blob = Blob((3, 4))
    blob.data[...] = 7
    fill(blob, FP())
    assert np.all(blob.data == 0)


def test_constant_value():
    assert np.all(filled((2, 3, 4), type="constant", value=-1.5) == -1.5)


def test_uniform_range_and_mean():
    data = filled((200, 100), type="uniform", min=-2.0, max=3.0)
    assert data.min() >= -2.0 and data.max() <= 3.0
    assert data.min() < -1.9 and data.max() > 2.9
    assert abs(data.mean() - 0.5) < 0.05
    # variance of U(a, b) is (b - a)^2 / 12
    assert abs(data.var() - 25.0 / 12) < 0.1


def test_gaussian_mean_and_std():
    data = filled((200, 100), type="gaussian", mean=1.0, std=0.5)
    assert abs(data.mean() - 1.0) < 0.02
    assert abs(data.std() - 0.5) < 0.02


def test_gaussian_sparse_keeps_sparse_over_num_outputs():
    # 50 outputs, sparse 5: each weight survives with probability 5 / 50 = 0.1
    data = filled((50, 400), type="gaussian", std=1.0, sparse=5)
    kept = np.count_nonzero(data) / data.size
    assert abs(kept - 0.1) < 0.01
    # each input column keeps about `sparse` weights on average
    assert abs(np.count_nonzero(data, axis=0).mean() - 5) < 0.2
    nonzero = data[data != 0]
    assert abs(nonzero.std() - 1.0) < 0.05


def test_gaussian_sparse_zero_clears_everything():
    assert np.all(filled((4, 5), type="gaussian", sparse=0) == 0)


def test_positive_unitball_rows_sum_to_one():
    data = filled((6, 3, 2, 2), type="positive_unitball")
    rows = data.reshape(6, -1)
    assert np.all(rows >= 0)
    np.testing.assert_allclose(rows.sum(axis=1), 1.0, rtol=1e-5)
    # not the trivial uniform solution
    assert rows.std() > 0.01


@pytest.mark.parametrize("norm,n", [("FAN_IN", 3 * 5 * 5), ("FAN_OUT", 20 * 5 * 5),
                                    ("AVERAGE", (75 + 500) / 2.0)])
def test_xavier_bounds(norm, n):
    # shape (20, 3, 5, 5): fan_in = count / 20 = 75, fan_out = count / 3 = 500
    data = filled((20, 3, 5, 5), type="xavier", variance_norm=getattr(FP, norm))
    bound = np.sqrt(3.0 / n)
    assert np.abs(data).max() <= bound * (1 + 1e-6)
    assert np.abs(data).max() > 0.95 * bound
    # U(-a, a) has std a / sqrt(3) = 1 / sqrt(n)
    assert abs(data.std() * np.sqrt(n) - 1.0) < 0.05


@pytest.mark.parametrize("norm,n", [("FAN_IN", 64 * 9), ("FAN_OUT", 32 * 9),
                                    ("AVERAGE", (64 * 9 + 32 * 9) / 2.0)])
def test_msra_std(norm, n):
    data = filled((32, 64, 3, 3), type="msra", variance_norm=getattr(FP, norm))
    assert abs(data.mean()) < 0.005
    assert abs(data.std() / np.sqrt(2.0 / n) - 1.0) < 0.03


def test_xavier_on_a_one_axis_blob_uses_count_for_fan_out():
    data = filled((10000,), type="xavier", variance_norm=FP.FAN_OUT)
    assert np.abs(data).max() <= np.sqrt(3.0 / 10000) * (1 + 1e-6)


@pytest.mark.parametrize("size", [2, 3, 4, 5, 6])
def test_bilinear_matches_the_upsampling_kernel(size):
    data = filled((2, 3, size, size), type="bilinear")
    f = int(np.ceil(size / 2.0))
    c = (2 * f - 1 - f % 2) / (2.0 * f)
    for y in range(size):
        for x in range(size):
            want = (1 - abs(x / f - c)) * (1 - abs(y / f - c))
            assert data[1, 2, y, x] == pytest.approx(want, abs=1e-6)
    assert np.all(data == data[0, 0])


def test_bilinear_kernel_4_for_factor_2_by_hand():
    # factor 2 upsampling: kernel 4, centre 1.5 / 2 -> weights 0.25, 0.75, 0.75, 0.25 per axis
    data = filled((1, 1, 4, 4), type="bilinear")
    ramp = np.array([0.25, 0.75, 0.75, 0.25])
    np.testing.assert_allclose(data[0, 0], np.outer(ramp, ramp), atol=1e-7)


def test_bilinear_rejects_non_square_or_non_4d():
    with pytest.raises(FillerError, match="bilinear"):
        filled((1, 1, 3, 4), type="bilinear")
    with pytest.raises(FillerError, match="bilinear"):
        filled((4, 4), type="bilinear")


def test_sparse_rejected_by_non_gaussian_fillers():
    with pytest.raises(FillerError, match="sparse"):
        filled((3, 3), type="xavier", sparse=2)


def test_unknown_type_is_named():
    with pytest.raises(FillerError, match="'gausian'"):
        filled((3, 3), type="gausian")


def test_seed_makes_fills_repeatable():
    rng.set_random_seed(7)
    a = filled((5, 5), type="gaussian")
    rng.set_random_seed(7)
    b = filled((5, 5), type="gaussian")
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, filled((5, 5), type="gaussian"))
