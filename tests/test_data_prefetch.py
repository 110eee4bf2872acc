"""Prefetch: the same batches with and without the background thread; a clean stop mid-epoch."""
import gc
import threading

import lmdb
import numpy as np
import pytest
from google.protobuf import text_format

import poseidon_caffe.layers  # noqa: F401
from poseidon_caffe.blob import Blob
from poseidon_caffe.data.prefetch import Prefetcher
from poseidon_caffe.layers import create_layer
from poseidon_caffe.proto import caffe_pb2
from poseidon_caffe.rng import set_random_seed


@pytest.fixture
def source(tmp_path):
    rng = np.random.default_rng(8)
    env = lmdb.open(str(tmp_path / "db"), map_size=1 << 26)
    with env.begin(write=True) as txn:
        for i in range(23):
            datum = caffe_pb2.Datum()
            datum.channels, datum.height, datum.width = 3, 9, 9
            datum.data = rng.integers(0, 256, size=243).astype(np.uint8).tobytes()
            datum.label = i
            txn.put(b"%08d" % i, datum.SerializeToString())
    env.close()
    return str(tmp_path / "db")


def make(source, prefetch):
    text = ('name: "d" type: "Data" top: "data" top: "label" '
            'transform_param { crop_size: 5 mirror: true scale: 0.5 } '
            'data_param { source: "%s" batch_size: 4 backend: LMDB prefetch: %d }'
            % (source, prefetch))
    layer = create_layer(text_format.Parse(text, caffe_pb2.LayerParameter()), caffe_pb2.TRAIN)
    top = [Blob(), Blob()]
    layer.setup([], top)
    layer.reshape([], top)
    return layer, top


def prefetch_threads():
    return [t for t in threading.enumerate() if t.name.startswith("Data-")]


def run(source, prefetch, steps, seed=1234):
    set_random_seed(seed)
    layer, top = make(source, prefetch)
    out = []
    for _ in range(steps):
        layer.forward([], top)
        out.append((top[0].data.copy(), top[1].data.copy()))
    layer.close()
    return out


def test_same_batches_with_and_without_prefetch(source):
    plain = run(source, 0, 9)
    fetched = run(source, 3, 9)
    for (x0, y0), (x1, y1) in zip(plain, fetched):
        np.testing.assert_array_equal(y0, y1)
        np.testing.assert_array_equal(x0, x1)
    # the batches do depend on the random draws (crops and mirrors), so the match means something
    other = run(source, 0, 9, seed=99)
    assert any(not np.array_equal(a[0], b[0]) for a, b in zip(plain, other))


def test_close_mid_epoch_leaves_no_thread_and_closes_the_environment(source):
    layer, top = make(source, 4)
    assert layer.prefetcher is None and not prefetch_threads()    # reading starts at forward
    layer.forward([], top)
    assert layer.prefetcher.thread.is_alive()
    env = layer.database.env
    layer.close()
    assert not prefetch_threads()
    assert layer.database.closed
    with pytest.raises(lmdb.Error):
        env.stat()
    layer.close()             # twice is harmless


def test_dropping_the_layer_stops_its_thread(source):
    layer, top = make(source, 2)
    layer.forward([], top)
    database = layer.database
    del layer, top
    gc.collect()
    assert not prefetch_threads()
    assert database.closed


def test_an_error_in_the_loader_reaches_forward():
    calls = []

    def load():
        calls.append(1)
        if len(calls) == 2:
            raise ValueError("record 00000001 is broken")
        return len(calls)

    fetcher = Prefetcher(load, 2, "Data-test")
    assert fetcher.next() == 1
    with pytest.raises(ValueError, match="broken"):
        fetcher.next()
    fetcher.stop()
    assert not prefetch_threads()


def test_resume_state_continues_with_the_same_batches(source):
    import json
    set_random_seed(5)
    layer, top = make(source, 3)
    for _ in range(7):                      # 28 records of 23: past the wrap-around
        layer.forward([], top)
    state = json.loads(json.dumps(layer.get_resume_state()))    # as a snapshot stores it
    want = []
    for _ in range(4):
        layer.forward([], top)
        want.append((top[0].data.copy(), top[1].data.copy()))
    layer.close()

    set_random_seed(77)                     # a different start, then the stored position
    resumed, top2 = make(source, 0)
    resumed.set_resume_state(state)
    for x, y in want:
        resumed.forward([], top2)
        np.testing.assert_array_equal(top2[1].data, y)
        np.testing.assert_array_equal(top2[0].data, x)
    resumed.close()


def test_solver_resumed_from_a_snapshot_trains_on_the_same_batches(source, tmp_path):
    from poseidon_caffe.solver import get_solver
    net = ('name: "tiny" layer { name: "d" type: "Data" top: "data" top: "label" '
           'transform_param { crop_size: 5 mirror: true scale: 0.01 } '
           'data_param { source: "%s" batch_size: 4 backend: LMDB } } '
           'layer { name: "ip" type: "InnerProduct" bottom: "data" top: "ip" '
           'inner_product_param { num_output: 23 weight_filler { type: "xavier" } } } '
           'layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip" bottom: "label" '
           'top: "loss" }' % source)

    def solver():
        param = text_format.Parse(
            'base_lr: 0.1 momentum: 0.9 lr_policy: "fixed" max_iter: 8 snapshot: 4 '
            'random_seed: 3 display: 0 snapshot_prefix: "%s"' % (tmp_path / "tiny"),
            caffe_pb2.SolverParameter())
        param.net_param.CopyFrom(text_format.Parse(net, caffe_pb2.NetParameter()))
        return get_solver(param)

    straight = solver()
    straight.solve()
    resumed = solver()
    resumed.solve(str(tmp_path / "tiny_iter_4.solverstate"))
    assert resumed.iter == 8
    np.testing.assert_array_equal(resumed.net.params["ip"][0].data,
                                  straight.net.params["ip"][0].data)
    straight.net.layers[0].close()
    resumed.net.layers[0].close()


@pytest.mark.parametrize("prefetch", [0, 2])
def test_skip_batch_advances_the_stream_by_one_batch_and_leaves_the_tops(source, prefetch):
    every = run(source, prefetch, 3)
    set_random_seed(1234)
    layer, top = make(source, prefetch)
    layer.forward([], top)
    first = top[0].data.copy(), top[1].data.copy()
    layer.skip_batch()
    # the tops still hold the first batch; the records are 4 per batch, labelled by index
    np.testing.assert_array_equal(top[0].data, first[0])
    np.testing.assert_array_equal(top[1].data, [0, 1, 2, 3])
    state = layer.get_resume_state()
    layer.forward([], top)
    np.testing.assert_array_equal(top[1].data, [8, 9, 10, 11])
    np.testing.assert_array_equal(top[0].data, every[2][0])   # same crops and mirrors too
    layer.close()
    # the resume state counts the skipped batch as consumed
    set_random_seed(1234)
    resumed, resumed_top = make(source, prefetch)
    resumed.set_resume_state(state)
    resumed.forward([], resumed_top)
    np.testing.assert_array_equal(resumed_top[1].data, [8, 9, 10, 11])
    np.testing.assert_array_equal(resumed_top[0].data, every[2][0])
    resumed.close()
