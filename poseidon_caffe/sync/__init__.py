"""Distributed training over MPI: topology, parameter server, sufficient factors, ring
allreduce, the SACP planner and wait-free backprop (the launcher is ``poseidon_caffe.launch``).

``attach(solver, options)`` makes a solver one worker of an MPI job (``poseidon-caffe train``
calls it when the job has more than one rank or a -sync flag); ``prepare(options)`` starts the
rank's part (topology, logs, data shard) before the solver is built. With ``server_ranks`` = N
the last N ranks are dedicated parameter-server shards: ``is_server(options)`` tells such a
rank, which calls ``serve(options)`` (once per ``attach`` of the workers) instead of training.
"""


def prepare(options=None):
    from .startup import prepare as _prepare
    return _prepare(options)


def attach(solver, options=None):
    from .distributed import attach as _attach
    return _attach(solver, options)


def is_server(options=None):
    from .distributed import is_server as _is_server
    return _is_server(options)


def serve(options=None):
    from .distributed import serve as _serve
    return _serve(options)
