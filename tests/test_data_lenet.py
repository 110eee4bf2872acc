"""The quick start, end to end: the embedded MNIST digits become LMDBs, the example's LeNet and
solver train on them, and the held-out digits are classified at >= 95% accuracy."""
import os

import numpy as np

from poseidon_caffe.data import mnist_embedded
from poseidon_caffe.io import read_net_param, read_solver_param
from poseidon_caffe.solver import get_solver

EXAMPLE = os.path.join(os.path.dirname(__file__), os.pardir, "examples", "mnist")


def test_embedded_digits_are_real_and_split_4000_1000(tmp_path):
    images, labels = mnist_embedded.load_digits()
    assert images.shape == (5000, 28, 28) and images.dtype == np.uint8
    assert np.bincount(labels).tolist() == [500] * 10
    (train_x, train_y), (test_x, test_y) = mnist_embedded.split_digits(images, labels)
    assert len(train_x) == 4000 and len(test_x) == 1000
    assert np.bincount(test_y).tolist() == [100] * 10
    # no digit is in both sets
    train_keys = {x.tobytes() for x in train_x}
    assert not any(x.tobytes() in train_keys for x in test_x)
    # the training order is mixed, not sorted by class as in the file
    assert len(set(train_y[:50].tolist())) == 10


def test_lenet_on_embedded_digits_reaches_95_percent(tmp_path):
    train_db, test_db = mnist_embedded.ensure_mnist_lmdbs(str(tmp_path))
    net = read_net_param(os.path.join(EXAMPLE, "lenet_train_test.prototxt"))
    for layer in net.layer:
        if layer.type == "Data":
            train = layer.include[0].phase == 0
            layer.data_param.source = train_db if train else test_db
    solver_param = read_solver_param(os.path.join(EXAMPLE, "lenet_solver.prototxt"))
    solver_param.ClearField("net")
    solver_param.net_param.CopyFrom(net)
    solver_param.max_iter = 500
    solver_param.test_interval = 500
    solver_param.snapshot = 0
    solver_param.snapshot_after_train = False
    solver_param.snapshot_prefix = str(tmp_path / "lenet")
    solver_param.random_seed = 1
    solver = get_solver(solver_param)
    solver.solve()

    test_net = solver.test_nets[0]
    test_net.share_trained_layers_with(solver.net)
    correct = seen = 0
    for _ in range(10):                     # 10 batches of 100: the 1,000 held-out digits
        test_net.forward_prefilled()
        scores = test_net.blobs["ip2"].data
        labels = test_net.blobs["label"].data
        correct += int((scores.argmax(axis=1) == labels).sum())
        seen += len(labels)
    assert seen == 1000
    assert correct / seen >= 0.95


def test_cifar10_example_nets_run_on_a_generated_dataset(tmp_path):
    """The cifar10 prototxts, with the LMDBs and the mean file made by the project's own
    script and tool, build and take training steps."""
    import subprocess
    import sys
    from poseidon_caffe.tools import datasets as tools
    rng = np.random.default_rng(0)
    for name in ["data_batch_%d.bin" % i for i in range(1, 6)] + ["test_batch.bin"]:
        recs = rng.integers(0, 256, size=(20, 3073)).astype(np.uint8)
        recs[:, 0] %= 10
        recs.tofile(tmp_path / name)
    script = os.path.join(os.path.dirname(__file__), os.pardir, "scripts", "create_cifar10.py")
    done = subprocess.run([sys.executable, script, str(tmp_path), str(tmp_path)],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    mean = str(tmp_path / "mean.binaryproto")
    assert tools.compute_image_mean_main([str(tmp_path / "cifar10_train_lmdb"), mean]) == 0
    example = os.path.join(os.path.dirname(__file__), os.pardir, "examples", "cifar10")
    for stem in ("cifar10_quick", "cifar10_full"):
        net = read_net_param(os.path.join(example, stem + "_train_test.prototxt"))
        for layer in net.layer:
            if layer.type == "Data":
                layer.transform_param.mean_file = mean
                layer.data_param.batch_size = 10
                layer.data_param.source = str(tmp_path / (
                    "cifar10_train_lmdb" if layer.include[0].phase == 0 else "cifar10_test_lmdb"))
        solver_param = read_solver_param(os.path.join(example, stem + "_solver.prototxt"))
        solver_param.ClearField("net")
        solver_param.net_param.CopyFrom(net)
        solver_param.max_iter = 2
        solver_param.test_iter[0] = 1
        solver_param.snapshot = 0
        solver_param.snapshot_after_train = False
        solver_param.snapshot_prefix = str(tmp_path / stem)
        solver = get_solver(solver_param)
        solver.solve()
        assert solver.iter == 2
        assert np.isfinite(solver.smoothed_loss)
