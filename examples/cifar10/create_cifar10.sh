#!/usr/bin/env sh
# Make the CIFAR-10 LMDBs and their mean file from the binary batches in DATA_DIR
# (default data/cifar10: the unpacked cifar-10-binary.tar.gz, i.e. cifar-10-batches-bin).
# The inputs are checked first and the databases replaced only once the new ones are complete:
# a failed run leaves the existing ones (and the mean file) as they were.
set -e
cd "$(dirname "$0")/../.."
DATA=${1:-data/cifar10}
echo "Creating lmdb..."
python scripts/create_cifar10.py "$DATA" examples/cifar10
echo "Computing image mean..."
poseidon-caffe compute_image_mean -backend=lmdb examples/cifar10/cifar10_train_lmdb \
  examples/cifar10/mean.binaryproto
echo "Done."
