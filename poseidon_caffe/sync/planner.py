"""SACP: choose per parameter blob how it travels, with Poseidon's cost model.

A blob of M x N values (an InnerProduct weight: N outputs x M inputs), a batch of K rows per
host, P hosts and S parameter-server shards cost per host and iteration, in bytes sent plus
received off the host:
  ps        2MN(P+S-2)/S   (every host holds a shard)
  sfb       2K(P-1)(M+N)   (InnerProduct weights only)
  allreduce 4MN(P-1)/P     (2MN(P-1)/P each way)
With S dedicated server ranks (``-server_ranks``) a host sends and receives every row, 2MN,
and a server node moves the P hosts' pushes and pulls of its 1/S of the rows, 2MN P/S; an
iteration waits for the busier of the two, so ps is priced max(2MN, 2MN P/S) when choosing,
while the prediction that the byte counters are held to stays the per-host 2MN.
The cheapest wins; ties go to ps, then sfb, then allreduce (Poseidon's own order).

``svb`` keeps Poseidon's meaning in auto mode: set, every InnerProduct weight travels as
sufficient factors when the job spans more than one host; false, none does; unset, the price
decides. A forced mode (``-sync=ps`` ...) names the strategy of every blob. Two rules cannot carry factors: stale-synchronous
training (the server holds the weights) and ``-ps_update=worker`` (the workers exchange update
values, which are not rank-K): there svb is ignored, with a note in the log.
"""
from .. import log
from .allreduce import RingAllreduce
from .ps import ParameterServer
from .sfb import SufficientFactors

STRATEGIES = {"ps": ParameterServer, "sfb": SufficientFactors, "allreduce": RingAllreduce}
TIE_ORDER = ("ps", "sfb", "allreduce")
MODES = ("auto", "ps", "sfb", "allreduce")


class PlanError(ValueError):
    pass


def blob_dims(item):
    """(M, N) of a blob for the cost model: its count as N rows of M values."""
    if item.sfb is not None:
        return item.sfb.M, item.sfb.N
    rows = item.rows
    return item.count // rows, rows


def prices(item, K, P, S, dedicated=False):
    """{strategy: the busiest node's bytes per iteration} for one blob."""
    M, N = blob_dims(item)
    ps = ParameterServer.price(M, N, K, P, S, dedicated)
    if dedicated:
        ps = max(ps, ParameterServer.server_load(M, N, P, S))
    out = {"ps": ps,
           "allreduce": RingAllreduce.price(M, N, K, P, S)}
    if item.sfb is not None:
        out["sfb"] = SufficientFactors.price(M, N, K, P, S)
    return out


def host_price(name, M, N, K, P, S, dedicated=False):
    """Off-host bytes one host sends plus receives per iteration with strategy ``name``."""
    if name == "ps":
        return ParameterServer.price(M, N, K, P, S, dedicated)
    return STRATEGIES[name].price(M, N, K, P, S)


UPDATES = ("server", "worker")


def choose(item, mode, K, P, S, staleness=0, svb=None, clip=False, dedicated=False,
           update="server"):
    """The strategy name for one blob."""
    if mode not in MODES:
        raise PlanError("-sync=%s is not one of %s" % (mode, "|".join(MODES)))
    if update not in UPDATES:
        raise PlanError("-ps_update=%s is not one of %s" % (update, "|".join(UPDATES)))
    if update == "worker":
        if mode == "sfb":
            raise PlanError("-sync=sfb sends gradients as sufficient factors, but with "
                            "-ps_update=worker the workers exchange update values: use -sync=ps, "
                            "allreduce or auto")
        if clip:
            raise PlanError("-ps_update=worker cannot apply clip_gradients: each worker's update "
                            "is sent as soon as its layer is ready, before a global norm is "
                            "known (use the default -ps_update=server)")
        svb = False         # update values are not rank-K: no factors
    if svb and mode == "auto" and item.sfb is not None and P > 1 and staleness == 0:
        return "sfb"
    if staleness > 0:
        if mode in ("sfb", "allreduce"):
            raise PlanError("-staleness=%d needs the parameter server: stale-synchronous "
                            "training is a server consistency model (use -sync=ps or auto)"
                            % staleness)
        if clip:
            raise PlanError("-staleness=%d cannot be combined with clip_gradients: the global "
                            "gradient norm needs every blob at once" % staleness)
        return "ps"
    if mode == "ps":
        if clip:
            raise PlanError("-sync=ps cannot apply clip_gradients (a global norm over all "
                            "blobs); use -sync=allreduce or sfb")
        return "ps"
    if mode == "allreduce":
        return "allreduce"
    if mode == "sfb":
        if item.sfb is not None:
            return "sfb"
        return "allreduce" if clip else "ps"
    cost = prices(item, K, P, S, dedicated)
    if svb is False:
        cost.pop("sfb", None)
    if clip:
        cost.pop("ps", None)
    return min(cost, key=lambda name: (cost[name], TIE_ORDER.index(name)))


def make_plan(items, mode, K_per_worker, topology_shape, staleness=0, svb=None, clip=False,
              announce=True, dedicated=False, update="server"):
    """{item index: strategy name} and {item index: predicted off-host bytes per iteration}.

    ``topology_shape`` is (hosts P, shards S, devices per host); a host's factors count its
    devices' batches, so K = K_per_worker * devices per host (times iter_size, folded in by
    the caller). ``dedicated``: the S shards are dedicated server ranks.
    """
    P, S, per_host = topology_shape
    plan, predicted = {}, {}
    server_load = 0.0
    if svb and announce and any(item.sfb is not None for item in items):
        why = ("-ps_update=worker exchanges update values" if update == "worker" else
               "stale-synchronous training keeps the weights on the server" if staleness > 0
               else "the job runs on one host" if P == 1 else None)
        if why:
            log.info("Sync plan: -svb=true has no effect: %s", why)
    for item in items:
        K = K_per_worker(item) * per_host
        name = choose(item, mode, K, P, S, staleness, svb, clip, dedicated, update)
        M, N = blob_dims(item)
        plan[item.index] = name
        predicted[item.index] = host_price(name, M, N, K, P, S, dedicated)
        if dedicated and name == "ps":
            server_load += ParameterServer.server_load(M, N, P, S)
        if announce:
            cost = prices(item, K, P, S, dedicated)
            log.info("Sync plan: %s (M=%d N=%d K=%d P=%d S=%d): %s -> %s", item.name, M, N, K,
                     P, S, ", ".join("%s %s" % (n, human_bytes(c)) for n, c in sorted(cost.items())),
                     name)
    if announce:
        log.info("Sync plan: predicted %s off-host per host per iteration (%d hosts, %d shards, "
                 "%d devices per host)", human_bytes(sum(predicted.values())), P, S, per_host)
        if dedicated:
            log.info("Sync plan: predicted %s per dedicated server node per iteration",
                     human_bytes(server_load))
    return plan, predicted


def human_bytes(n):
    for unit in ("B", "KB", "MB", "GB"):
        if abs(n) < 1024 or unit == "GB":
            return ("%d %s" % (n, unit)) if unit == "B" else ("%.2f %s" % (n, unit))
        n /= 1024.0
