"""Training end to end: a small net on a small, learnable, deterministic problem."""
import numpy as np

from poseidon_caffe import io as pio
from poseidon_caffe.solver import get_solver

NET = """
name: "xor"
layer { name: "data" type: "MemoryData" top: "data" top: "label"
  memory_data_param { batch_size: 32 channels: 2 height: 1 width: 1 } }
layer { name: "hidden" type: "InnerProduct" bottom: "data" top: "hidden"
  inner_product_param { num_output: 16 weight_filler { type: "xavier" }
                        bias_filler { type: "constant" value: 0.1 } } }
layer { name: "relu" type: "ReLU" bottom: "hidden" top: "hidden" }
layer { name: "score" type: "InnerProduct" bottom: "hidden" top: "score"
  inner_product_param { num_output: 2 weight_filler { type: "xavier" } } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "score" bottom: "label" top: "loss" }
layer { name: "accuracy" type: "Accuracy" bottom: "score" bottom: "label" top: "accuracy"
  include { phase: TEST } }
"""


def xor_data(n, seed):
    """Points in the four quadrants, label = 1 where the signs of x and y differ, kept at least
    0.2 away from both axes. No line separates the classes (a linear model cannot beat 75%),
    while a ReLU layer of 16 units can represent the rule exactly, so a correct trainer gets
    every point right; broken gradients or updates leave it near chance."""
    gen = np.random.default_rng(seed)
    pts = gen.uniform(0.2, 1.0, size=(n, 2)) * gen.choice([-1.0, 1.0], size=(n, 2))
    labels = (pts[:, 0] * pts[:, 1] < 0).astype(np.float32)
    return pts.astype(np.float32).reshape(n, 2, 1, 1), labels


def predict(net_params, x):
    """Forward pass written out in numpy from the learned weights (independent of the net)."""
    w1, b1 = net_params["hidden"]
    w2, b2 = net_params["score"]
    h = np.maximum(x.reshape(len(x), 2) @ w1.data.T + b1.data, 0)
    return np.argmax(h @ w2.data.T + b2.data, axis=1)


def test_mlp_learns_xor_with_sgd_momentum():
    text = """net_param { %s }
      test_iter: 8 test_interval: 100 test_initialization: false
      base_lr: 0.1 momentum: 0.9 weight_decay: 0.0001 lr_policy: "fixed"
      display: 0 max_iter: 400 snapshot_after_train: false random_seed: 7 type: "SGD"
    """ % NET
    solver = get_solver(pio.parse_solver_text(text, "xor solver"))
    x_train, y_train = xor_data(256, seed=1)
    x_test, y_test = xor_data(256, seed=2)
    solver.net.set_input_arrays(x_train, y_train)
    solver.test_nets[0].set_input_arrays(x_test, y_test)
    before = (predict(solver.net.params, x_test) == y_test).mean()
    solver.solve()
    assert solver.iter == 400
    accuracy = (predict(solver.net.params, x_test) == y_test).mean()
    assert before < 0.8
    assert accuracy >= 0.97, accuracy
    # the test net sees the same weights without a copy
    assert np.shares_memory(solver.test_nets[0].params["hidden"][0].data,
                            solver.net.params["hidden"][0].data)


def test_adam_learns_xor_too():
    text = """net_param { %s }
      base_lr: 0.01 momentum: 0.9 momentum2: 0.999 lr_policy: "fixed" type: "Adam"
      display: 0 max_iter: 300 snapshot_after_train: false random_seed: 11
    """ % NET
    solver = get_solver(pio.parse_solver_text(text, "xor adam"))
    x_train, y_train = xor_data(256, seed=3)
    x_test, y_test = xor_data(256, seed=4)
    solver.net.set_input_arrays(x_train, y_train)
    solver.step(300)
    assert (predict(solver.net.params, x_test) == y_test).mean() >= 0.97


STAGED = """
name: "staged"
layer { name: "data" type: "DummyData" top: "data" top: "label"
  dummy_data_param { shape { dim: 2 dim: 3 } shape { dim: 2 }
    data_filler { type: "constant" value: 1 } data_filler { type: "constant" value: 0 } } }
layer { name: "ip" type: "InnerProduct" bottom: "data" top: "ip"
  inner_product_param { num_output: 2 weight_filler { type: "constant" value: 0 } } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip" bottom: "label" top: "loss" }
layer { name: "deep_only" type: "Accuracy" bottom: "ip" bottom: "label" top: "acc"
  include { phase: TEST stage: "deep" } }
layer { name: "train_extra" type: "Softmax" bottom: "ip" top: "prob"
  include { phase: TRAIN min_level: 2 } }
"""


def test_states_and_several_test_nets(tmp_path):
    """A generic ``net`` makes one test net per test_iter; test_state picks each one's stages,
    train_state the training net's level; test_compute_loss logs the mean test loss."""
    import logging
    from poseidon_caffe import log
    text = """net_param { %s } test_iter: 2 test_iter: 3
      test_state { stage: "deep" } test_state { }
      train_state { level: 2 }
      test_interval: 1 test_compute_loss: true base_lr: 0.1 lr_policy: "fixed" max_iter: 1
      snapshot_after_train: false""" % STAGED
    solver = get_solver(pio.parse_solver_text(text, "staged solver"))
    assert "train_extra" in solver.net.layer_names
    assert len(solver.test_nets) == 2
    assert "deep_only" in solver.test_nets[0].layer_names
    assert "deep_only" not in solver.test_nets[1].layer_names
    assert "train_extra" not in solver.test_nets[0].layer_names

    messages = []
    handler = logging.Handler()
    handler.emit = lambda record: messages.append(record.getMessage())
    log.logger.addHandler(handler)
    try:
        solver.test_all()
    finally:
        log.logger.removeHandler(handler)
    assert "Iteration 0, Testing net (#0)" in messages
    assert "Iteration 0, Testing net (#1)" in messages
    # zero weights: two equal logits, loss ln 2 on every batch
    assert messages.count("Test loss: %g" % np.log(2.0)) == 2
    # only test net #0 has the accuracy layer (ties count against, as in Caffe: acc = 0);
    # outputs come by name, as Caffe's std::set gives them: acc before loss
    assert [m for m in messages if "acc =" in m] == ["    Test net output #0: acc = 0"]


def test_missing_or_doubled_train_nets_are_named():
    import pytest
    from poseidon_caffe.solver import SolverError
    with pytest.raises(SolverError, match="must specify a train net"):
        get_solver(pio.parse_solver_text('base_lr: 0.1 lr_policy: "fixed"', "s"))
    with pytest.raises(SolverError, match="test_iter must be specified for each test network"):
        get_solver(pio.parse_solver_text(
            "train_net_param { %s } test_net_param { %s } base_lr: 0.1 lr_policy: \"fixed\""
            % (STAGED, STAGED), "s"))
