#!/usr/bin/env sh
# Make the LMDBs from the full MNIST idx files in DATA_DIR (default data/mnist).
set -e
cd "$(dirname "$0")/../.."
DATA=${1:-data/mnist}
rm -rf examples/mnist/mnist_train_lmdb examples/mnist/mnist_test_lmdb
python scripts/create_mnist.py "$DATA" examples/mnist
echo "Done."
