"""Training jobs on disk for the tests that run them: LeNet on the MNIST LMDBs, a small
convolutional net on DummyData, and LMDBs of float records."""
import os

import lmdb
import numpy as np

from poseidon_caffe.io import read_net_weights
from poseidon_caffe.proto import caffe_pb2

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# 4 random 3-vectors of label 2 through one InnerProduct; accuracy in TEST
TINY_NET = """
name: "tiny"
layer { name: "data" type: "DummyData" top: "data" top: "label"
  dummy_data_param { shape { dim: 4 dim: 3 } shape { dim: 4 }
    data_filler { type: "gaussian" std: 1 } data_filler { type: "constant" value: 2 } } }
layer { name: "ip" type: "InnerProduct" bottom: "data" top: "ip"
  inner_product_param { num_output: 3 weight_filler { type: "gaussian" std: 0.1 } } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip" bottom: "label" top: "loss" }
layer { name: "accuracy" type: "Accuracy" bottom: "ip" bottom: "label" top: "accuracy"
  include { phase: TEST } }
"""

# 8 random 1x8x8 images of label 1 through a convolution and an InnerProduct
SMALL_CONV_NET = """name: "small"
layer { name: "data" type: "DummyData" top: "data" top: "label"
  dummy_data_param { shape { dim: 8 dim: 1 dim: 8 dim: 8 } shape { dim: 8 }
    data_filler { type: "gaussian" std: 1 } data_filler { type: "constant" value: 1 } } }
layer { name: "conv" type: "Convolution" bottom: "data" top: "conv"
  convolution_param { num_output: 4 kernel_size: 3 weight_filler { type: "xavier" } } }
layer { name: "ip" type: "InnerProduct" bottom: "conv" top: "ip"
  inner_product_param { num_output: 3 weight_filler { type: "xavier" } } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip" bottom: "label" top: "loss" }
"""


def write_lenet_job(tmp_path, name, batch, train_db, test_db, extra="", display=0, max_iter=4):
    """<name>.prototxt, the MNIST example's LeNet reading these databases with TRAIN batch
    ``batch``, and <name>_solver.prototxt (seed 7, no snapshot, ``extra`` lines appended);
    returns the solver's path."""
    with open(os.path.join(ROOT, "examples", "mnist", "lenet_train_test.prototxt")) as f:
        net = (f.read().replace("examples/mnist/mnist_train_lmdb", train_db)
               .replace("examples/mnist/mnist_test_lmdb", test_db)
               .replace("batch_size: 64", "batch_size: %d" % batch))
    (tmp_path / (name + ".prototxt")).write_text(net)
    solver = tmp_path / (name + "_solver.prototxt")
    solver.write_text('net: "%s"\nbase_lr: 0.05 momentum: 0.9 weight_decay: 0.0005\n'
                      'lr_policy: "inv" gamma: 0.0001 power: 0.75 display: %d max_iter: %d\n'
                      'test_interval: 1000 test_iter: 1 test_initialization: false\n'
                      'random_seed: 7 snapshot: 0 snapshot_prefix: "%s"\n%s'
                      % (tmp_path / (name + ".prototxt"), display, max_iter, tmp_path / name,
                         extra))
    return str(solver)


def write_float_db(path, rows, labels):
    """An LMDB of one Datum per row (1 x 1 x len(row) float_data, its label), keys 00000000,
    00000001, ... in row order."""
    env = lmdb.open(str(path), map_size=1 << 22)
    with env.begin(write=True) as txn:
        for i, (x, y) in enumerate(zip(rows, labels)):
            datum = caffe_pb2.Datum(channels=1, height=1, width=len(x), label=int(y))
            datum.float_data.extend(x.tolist())
            txn.put(b"%08d" % i, datum.SerializeToString())
    env.close()


def assert_resumed_equals_straight(folder, layers=("conv", "ip")):
    """The weights of "stopped" resumed to iteration 6 equal "straight"'s at 6, which moved on
    from its own iteration 3 (the snapshot the resume started from)."""
    _, straight = read_net_weights(os.path.join(folder, "straight_iter_6.caffemodel"))
    _, resumed = read_net_weights(os.path.join(folder, "stopped_iter_6.caffemodel"))
    _, early = read_net_weights(os.path.join(folder, "straight_iter_3.caffemodel"))
    for name in layers:
        for a, b, c in zip(straight[name], resumed[name], early[name]):
            np.testing.assert_array_equal(a, b)
            assert not np.array_equal(a, c)        # training moved on after the snapshot
