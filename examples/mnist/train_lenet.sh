#!/usr/bin/env sh
# Train LeNet on MNIST digits (prepares the embedded digits first if no LMDBs exist).
set -e
cd "$(dirname "$0")/../.."
python -m poseidon_caffe.tools.mnist examples/mnist
poseidon-caffe train --solver=examples/mnist/lenet_solver.prototxt "$@"
