"""A rank's start in a distributed job, before its solver is built: the topology, its log
file, failure handling, its data shard and its Poseidon client id (``prepare``); then, once
the solver exists, rank 0's weights on every worker (``broadcast_weights``)."""
import logging
import os

from .. import log
from .failure import install as install_failure_handlers
from .options import SyncOptions
from .topology import Topology, TopologyError

_state = {"topology": None, "log_handler": None, "client_id": None}


def this_client_id():
    """This rank's Poseidon client id, as ``prepare`` found it (None before)."""
    return _state["client_id"]


def prepare(options=None):
    """Start this rank's part of a job: topology, logs, failure handling, data shard.

    Call before the solver is built so that its data layers read this worker's shard and its
    set-up is logged to this rank's file; ``attach`` calls it if that was not done.
    """
    if _state["topology"] is not None:
        return _state["topology"]
    options = SyncOptions.of(options)
    topology = Topology(ranks_per_host=options.ranks_per_host,
                        server_ranks=options.server_ranks)
    _state["topology"] = topology
    install_failure_handlers(topology)
    client_id, named = _client_of(topology, options)
    _state["client_id"] = client_id
    output_dir = options.output_dir
    if output_dir:
        # Poseidon's layout: one log folder per client (host), logs.<client_id>, when the job
        # names its clients (-client_id / -hostfile); the rank logs keep their names
        log_dir = os.path.join(output_dir, "logs.%d" % client_id) if named else output_dir
        os.makedirs(log_dir, exist_ok=True)
        _state["log_handler"] = log.add_file(os.path.join(log_dir,
                                                          "caffe.rank%d.log" % topology.rank))
    if topology.job.rank != 0:
        log.set_console_level(logging.ERROR)
    if topology.is_server:
        log.info("Server rank %d of %d on host %s (pid %d): dedicated parameter-server shard "
                 "%d of %d for %d workers", topology.rank, topology.job.size, topology.hostname,
                 os.getpid(), topology.server_index, topology.num_servers, topology.num_workers)
        return topology
    log.info("Worker rank %d of %d on host %s (pid %d): host %d of %d, device %d of %d%s",
             topology.rank, topology.size, topology.hostname, os.getpid(), topology.host,
             topology.num_hosts, topology.local_rank, topology.local_size,
             ", %d dedicated server ranks" % topology.num_servers if topology.dedicated else "")
    from .. import data
    data.set_worker(topology.rank, topology.size,
                    client=(client_id, topology.local_rank, topology.local_size))
    return topology


def _client_of(topology, options):
    """(this rank's Poseidon client id, whether the job named it): -client_id as given to the
    host's ranks, else the host's line of -hostfile, else the host's index. Ids must agree
    within a host and differ between hosts; -num_clients, when given, must count the hosts."""
    from ..launch.hosts import HostFileError, read_localserver
    given, hostfile, num_clients = options.client_id, options.hostfile, options.num_clients
    host = topology.host
    if topology.is_server:
        topology.job.allgather_object(None)
        return -1, False
    hosts = None
    if hostfile:
        try:
            hosts = read_localserver(hostfile)
        except HostFileError as exc:
            raise TopologyError(str(exc)) from None
        if len(hosts) != topology.num_hosts:
            raise TopologyError("-hostfile=%s lists %d clients, but the job runs on %d hosts"
                                % (hostfile, len(hosts), topology.num_hosts))
        listed = [h[0] for h in hosts]
        if given >= 0 and given not in listed:
            raise TopologyError("-client_id=%d is not in -hostfile=%s (its clients are %s)"
                                % (given, hostfile, ", ".join(map(str, listed))))
    if num_clients and num_clients != topology.num_hosts:
        raise TopologyError("-num_clients=%d, but the job runs on %d hosts (%d workers, %d per "
                            "host)" % (num_clients, topology.num_hosts, topology.size,
                                       topology.local_size))
    if given >= 0:
        cid = given
    elif hosts is not None:
        cid = hosts[host][0]
    else:
        cid = host
    ids = [v for v in topology.job.allgather_object((host, cid)) if v is not None]
    by_host = {}
    for h, c in ids:
        by_host.setdefault(h, set()).add(c)
    for h, cs in sorted(by_host.items()):
        if len(cs) > 1:
            raise TopologyError("the ranks of host %d give different client ids %s: -client_id "
                                "names a host (Poseidon's client)" % (h, sorted(cs)))
    firsts = [min(cs) for _, cs in sorted(by_host.items())]
    if len(set(firsts)) != len(firsts):
        raise TopologyError("hosts share a client id (%s): give every host its own -client_id"
                            % firsts)
    return cid, given >= 0 or hosts is not None


def broadcast_weights(net, topology):
    """Rank 0's weights into every worker's net (they start alike)."""
    for blob in net.learnable_params:
        topology.world.bcast_array(blob.data.reshape(-1), root=0)
    log.info("Rank 0's weights broadcast to %d workers", topology.size)
