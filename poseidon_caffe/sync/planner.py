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
The strategies and their prices come from the registry (``strategy.py``): the rules below are
stated on what each strategy declares (carries factors, bounds staleness, updates locally).

``svb`` keeps Poseidon's meaning in auto mode: set, every InnerProduct weight travels as
sufficient factors when the job spans more than one host; false, none does; unset, the price
decides. A forced mode (``-sync=ps`` ...) names the strategy of every blob. Two rules cannot carry factors: stale-synchronous
training (the server holds the weights) and ``-ps_update=worker`` (the workers exchange update
values, which are not rank-K): there svb is ignored, with a note in the log.
"""
from .. import log
from ..memory import format_bytes
from . import strategy as registry

UPDATES = ("server", "worker")


class PlanError(ValueError):
    pass


def modes():
    """The values -sync takes: auto, or a registered strategy's name."""
    return ("auto",) + tuple(cls.name for cls in registry.registered())


def blob_dims(item):
    """(M, N) of a blob for the cost model: its count as N rows of M values."""
    if item.sfb is not None:
        return item.sfb.M, item.sfb.N
    rows = item.rows
    return item.count // rows, rows


def prices(item, K, P, S, dedicated=False):
    """{strategy: the busiest node's bytes per iteration} for one blob."""
    M, N = blob_dims(item)
    return {cls.name: cls.cost(M, N, K, P, S, dedicated)
            for cls in registry.registered() if cls.carries(item)}


def host_price(name, M, N, K, P, S, dedicated=False):
    """Off-host bytes one host sends plus receives per iteration with strategy ``name``."""
    return registry.get(name).price(M, N, K, P, S, dedicated)


def _names(classes):
    return " or ".join(cls.name for cls in classes)


def choose(item, mode, K, P, S, staleness=0, svb=None, clip=False, dedicated=False,
           update="server"):
    """The strategy name for one blob."""
    every = registry.registered()
    if mode not in modes():
        raise PlanError("-sync=%s is not one of %s" % (mode, "|".join(modes())))
    if update not in UPDATES:
        raise PlanError("-ps_update=%s is not one of %s" % (update, "|".join(UPDATES)))
    forced = registry.get(mode) if mode != "auto" else None
    if update == "worker":
        if forced is not None and not forced.carries_updates:
            raise PlanError("-sync=%s cannot carry the update values that -ps_update=worker "
                            "exchanges: use -sync=%s or auto"
                            % (mode, _names(c for c in every if c.carries_updates)))
        if clip:
            raise PlanError("-ps_update=worker cannot apply clip_gradients: each worker's update "
                            "is sent as soon as its layer is ready, before a global norm is "
                            "known (use the default -ps_update=server)")
        every = [cls for cls in every if cls.carries_updates]
        svb = False
    fits = [cls for cls in every if cls.carries(item)]
    if svb and mode == "auto" and P > 1 and staleness == 0:
        for cls in fits:
            if cls.follows_svb:
                return cls.name
    if staleness > 0:
        if forced is not None and not forced.bounded_staleness:
            raise PlanError("-staleness=%d needs a strategy that bounds staleness: "
                            "stale-synchronous training is a server consistency model (use "
                            "-sync=%s or auto)"
                            % (staleness, _names(c for c in every if c.bounded_staleness)))
        if clip:
            raise PlanError("-staleness=%d cannot be combined with clip_gradients: the global "
                            "gradient norm needs every blob at once" % staleness)
        fits = [cls for cls in fits if cls.bounded_staleness]
    if clip and forced is not None and not forced.local_update:
        raise PlanError("-sync=%s cannot apply clip_gradients (a global norm over all blobs); "
                        "use -sync=%s" % (mode, _names(c for c in every if c.local_update)))
    if forced is not None and forced in fits:
        return forced.name
    if clip:
        fits = [cls for cls in fits if cls.local_update]
    if forced is not None:
        # a blob the forced strategy cannot carry goes the preferred way that can
        fits = fits[:1]
    elif svb is False:
        fits = [cls for cls in fits if not cls.follows_svb]
    if not fits:
        raise PlanError("no sync strategy can carry %s with -sync=%s under these settings"
                        % (item.name, mode))
    M, N = blob_dims(item)
    cost = {cls.name: cls.cost(M, N, K, P, S, dedicated) for cls in fits}
    order = {cls.name: cls.preference for cls in fits}
    return min(cost, key=lambda name: (cost[name], order[name]))


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
    if svb and announce and any(cls.follows_svb and cls.carries(item)
                                for cls in registry.registered() for item in items):
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
        if dedicated:
            server_load += registry.get(name).server_load(M, N, P, S)
        if announce:
            cost = prices(item, K, P, S, dedicated)
            log.info("Sync plan: %s (M=%d N=%d K=%d P=%d S=%d): %s -> %s", item.name, M, N, K,
                     P, S, ", ".join("%s %s" % (n, format_bytes(c))
                                     for n, c in sorted(cost.items())), name)
    if announce:
        log.info("Sync plan: predicted %s off-host per host per iteration (%d hosts, %d shards, "
                 "%d devices per host)", format_bytes(sum(predicted.values())), P, S, per_host)
        if dedicated:
            log.info("Sync plan: predicted %s per dedicated server node per iteration",
                     format_bytes(server_load))
    return plan, predicted


def exchanged_params(net):
    """(index, name, blob, ready layer, factor offer) for each learnable blob of ``net`` that
    training changes, as the engine exchanges them: named after the first layer using it,
    final at the earliest such layer, and with the layer's sufficient-factor offer (a dict,
    see InnerProduct) when the blob is the weight of one layer that makes one, else None."""
    uses = net.param_uses()
    for index, blob in enumerate(net.learnable_params):
        if net.params_lr[index] == 0:
            continue        # never changes: nothing to exchange
        where = uses[index]
        first = min(layer for layer, _ in where)
        layer_index, j = where[0]
        offer = None
        if len(where) == 1 and j == 0:
            make = getattr(net.layers[layer_index], "sufficient_factor_source", None)
            offer = make(*net.layer_blobs(layer_index)) if make is not None else None
        yield index, "%s[%d]" % (net.layer_names[layer_index], j), blob, first, offer
