#!/usr/bin/env sh
# CIFAR-10 quick: 4,000 iterations at lr 0.001, then 1,000 more at lr 0.0001.
set -e
cd "$(dirname "$0")/../.."
poseidon-caffe train --solver=examples/cifar10/cifar10_quick_solver.prototxt "$@"
poseidon-caffe train --solver=examples/cifar10/cifar10_quick_solver_lr1.prototxt \
  --snapshot=examples/cifar10/cifar10_quick_iter_4000.solverstate "$@"
