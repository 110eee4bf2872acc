"""What every sync strategy offers the planner and the engine, and the registry of strategies.

A strategy moves the gradients of some parameter blobs between the workers of a job. The
planner prices every registered strategy for every blob and names one per blob; the engine
opens each named strategy once, hands it a blob's gradient as backward makes it final, and
starts one exchange per bucket on the communication thread. An exchange is a generator
(``start``) that yields while its MPI requests are in flight, so that the communication
thread keeps several buckets' exchanges going at once; a strategy that only offers the
blocking ``run`` still works (its exchanges then hold the thread until they are done).

A new strategy is one module with one ``Strategy`` subclass decorated with ``@register``; once
the module is imported the planner prices it for every blob, ``sync=<name>`` forces it and the
engine runs it. The built-in ones (``ps``, ``sfb``, ``allreduce``) are found by name in
``sync/strategies/`` and imported by ``registered()``.
"""
import os
from abc import ABC, abstractmethod

import numpy as np

ITEMSIZE = 4  # float32 on the wire

_REGISTRY = {}


class Strategy(ABC):
    """One way for a blob's gradient to travel. The class describes it to the planner; an
    instance does the exchanges of one engine's blobs that the plan gave it."""

    name = ""                  # the plan's label and the value of -sync that forces it
    preference = 100           # among equal prices the lowest wins
    fuses = False              # consecutive small blobs may share one message (a bucket)
    local_update = True        # each worker applies the update to its own replica from the
    #                            exchanged sum (what clip_gradients' global norm needs)
    bounded_staleness = False  # can let a worker read weights up to -staleness clocks old
    carries_updates = True     # can exchange update values instead (-ps_update=worker)
    follows_svb = False        # -svb=true sends every blob it carries this way, false none

    # -- the planner's side ---------------------------------------------------------------------
    @staticmethod
    def carries(item):
        """Whether this strategy can move ``item``'s gradient at all."""
        return True

    @classmethod
    @abstractmethod
    def price(cls, M, N, K, P, S, dedicated=False):
        """Off-host bytes one host sends plus receives per iteration for a blob of M x N values
        (K batch rows per host, P hosts, S server shards): what the byte counters are held to."""

    @classmethod
    def cost(cls, M, N, K, P, S, dedicated=False):
        """What the planner compares: the busiest node's bytes per iteration."""
        return cls.price(M, N, K, P, S, dedicated)

    @classmethod
    def server_load(cls, M, N, P, S):
        """Bytes one dedicated server node moves per iteration for this blob."""
        return 0.0

    # -- the engine's side ----------------------------------------------------------------------
    @classmethod
    def open(cls, engine, items):
        """The instance that exchanges ``items`` (the blobs the plan gave this strategy) for
        ``engine``, or None when there is nothing to do. Runs on every rank, in registry order."""
        if not items:
            return None
        return cls(engine.transport, engine.topology, engine.counters)

    def __init__(self, transport, topology, counters):
        self.transport = transport
        self.topology = topology
        self.counters = counters
        self.stale_reads = {}      # item index -> oldest clock lag read (bounded staleness)

    def capture(self, item):
        """Called as each backward pass makes ``item``'s gradient ready (iter_size per
        iteration): keep what cannot be read later."""

    def payload(self, item, clock):
        """What this worker sends for ``item`` once the passes of iteration ``clock`` are done; by
        default a private copy of the accumulated gradient."""
        return np.array(item.diff_flat, dtype=np.float32, copy=True)

    @abstractmethod
    def run(self, bucket, payloads, clock, what):
        """Exchange one bucket (on the communication thread). Returns, per item of the bucket,
        the flat sum over every worker of what they sent, for the engine to apply; or None when
        the strategy has itself left the fresh weights in the items."""

    def start(self, bucket, payloads, clock, what, channel):
        """The exchange of one bucket as a generator: it starts non-blocking MPI calls, yields
        ``steps.Wait``/``steps.Until`` until they are done, and returns what ``run``
        returns. Its collectives use ``channel``'s communicators (the exchanges in flight at
        one time each have their own). By default: ``run``, in one step."""
        return self.run(bucket, payloads, clock, what)
        yield  # pragma: no cover -- makes this a generator

    def wait(self, clock):
        """Before a snapshot, a test or the end: leave every replica holding all updates before
        ``clock`` (communication thread)."""

    def gather_history(self, clock):
        """Rank 0 gets {item index: [solver history arrays]} that live away from the workers
        (None elsewhere, or when the workers hold the history)."""
        return None

    def close(self, clock=None):
        """The last call, once every exchange has finished: end what is in flight and free the
        communicators."""


def register(cls):
    """Class decorator: make ``cls`` a strategy the planner and the engine know by its name."""
    if not (isinstance(cls, type) and issubclass(cls, Strategy)):
        raise TypeError("a sync strategy is a subclass of Strategy, not %r" % (cls,))
    if cls.__abstractmethods__:
        raise TypeError("sync strategy %s does not define %s"
                        % (cls.__name__, ", ".join(sorted(cls.__abstractmethods__))))
    if not cls.name or cls.name == "auto":
        raise ValueError("sync strategy %s needs a name other than '' and 'auto'" % cls.__name__)
    known = _REGISTRY.get(cls.name)
    if known is not None and known is not cls:
        raise ValueError("two sync strategies are named %r: %s and %s"
                         % (cls.name, known.__name__, cls.__name__))
    _REGISTRY[cls.name] = cls
    return cls


def _import_builtins():
    """Import every module of sync/strategies/, found by name in that folder (the interface
    names no implementation): each registers its strategy on import."""
    import importlib
    folder = os.path.join(os.path.dirname(os.path.abspath(__file__)), "strategies")
    for name in sorted(os.listdir(folder)):
        if name.endswith(".py") and not name.startswith("_"):
            importlib.import_module("%s.strategies.%s" % (__package__, name[:-3]))


def registered():
    """Every known strategy class, in order of preference."""
    _import_builtins()
    return sorted(_REGISTRY.values(), key=lambda cls: (cls.preference, cls.name))


def get(name):
    """The strategy class registered as ``name``."""
    for cls in registered():
        if cls.name == name:
            return cls
    raise KeyError(name)
