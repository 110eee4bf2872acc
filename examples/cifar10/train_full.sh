#!/usr/bin/env sh
# CIFAR-10 full: 60,000 iterations at lr 0.001, then 5,000 at 0.0001 and 5,000 at 0.00001.
set -e
cd "$(dirname "$0")/../.."
poseidon-caffe train --solver=examples/cifar10/cifar10_full_solver.prototxt "$@"
poseidon-caffe train --solver=examples/cifar10/cifar10_full_solver_lr1.prototxt \
  --snapshot=examples/cifar10/cifar10_full_iter_60000.solverstate "$@"
poseidon-caffe train --solver=examples/cifar10/cifar10_full_solver_lr2.prototxt \
  --snapshot=examples/cifar10/cifar10_full_iter_65000.solverstate "$@"
