"""One process-wide random generator, seeded like Caffe's (``random_seed`` / set_random_seed).

Fillers, dropout, random crops and mirrors, shuffling and stochastic pooling all draw from it,
so that one seed makes a run repeatable.
"""
import threading

import numpy as np

_state = {"rng": np.random.default_rng(), "before_draw": None, "thread": None}


def set_before_draw(fn):
    """``fn()`` runs before this thread next takes the generator (None: nothing). Deferred
    fills use it to make their draws first, so the stream's order is the order draws were
    asked for; other threads (data prefetch) are not the net's builder and pass."""
    _state["before_draw"] = fn
    _state["thread"] = threading.get_ident() if fn is not None else None


def _settle():
    if _state["before_draw"] is not None and _state["thread"] == threading.get_ident():
        _state["before_draw"]()


def set_random_seed(seed):
    _settle()
    _state["rng"] = np.random.default_rng(int(seed))


def get_rng():
    if _state["before_draw"] is not None:
        _settle()
    return _state["rng"]


def get_state():
    _settle()
    return _state["rng"].bit_generator.state


def set_state(state):
    _settle()
    _state["rng"].bit_generator.state = state
