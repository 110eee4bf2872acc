"""One process-wide random generator, seeded like Caffe's (``random_seed`` / set_random_seed).

Fillers, dropout, random crops and mirrors, shuffling and stochastic pooling all draw from it,
so that one seed makes a run repeatable.
"""
import numpy as np

_state = {"rng": np.random.default_rng()}


def set_random_seed(seed):
    _state["rng"] = np.random.default_rng(int(seed))


def get_rng():
    return _state["rng"]


def get_state():
    return _state["rng"].bit_generator.state


def set_state(state):
    _state["rng"].bit_generator.state = state
