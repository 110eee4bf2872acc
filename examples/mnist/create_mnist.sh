#!/usr/bin/env sh
# Make the LMDBs from the full MNIST idx files in DATA_DIR (default data/mnist).
# The inputs are read and checked first and the databases replaced only once the new ones are
# complete: a failed run leaves the existing ones as they were.
set -e
cd "$(dirname "$0")/../.."
DATA=${1:-data/mnist}
python scripts/create_mnist.py "$DATA" examples/mnist
echo "Done."
