"""Who is where: workers (one MPI rank per device), hosts, and parameter-server shards.

Level 1 is the devices of one host: the ranks that share memory, found with MPI's
shared-memory split. ``ranks_per_host`` overrides it (consecutive ranks form a host), so that
tests on one machine can play several hosts. Level 2 is the hosts: the first rank of each host
is its leader and does the host's off-host exchanges. Level 3 is the parameter-server shards:
one per host, co-located with its leader, as in Poseidon; or, with ``server_ranks`` = N, the
last N ranks of the job are dedicated shards that build no net and only serve.

``world`` is the communicator of the workers (the whole job when no rank is a dedicated
server), so ``rank`` and ``size`` are a worker's index and the number of workers P. ``job`` is
the whole job; ``ps_comm`` joins the host leaders and the shards (leaders first, in host order,
then the dedicated servers), the one communicator pushes and pulls travel on.
"""
import socket

from . import communicator
from .communicator import Communicator


class TopologyError(ValueError):
    pass


class Topology:
    def __init__(self, comm=None, ranks_per_host=0, server_ranks=0):
        if comm is None:
            self.job = communicator.world()
        else:
            self.job = comm if isinstance(comm, Communicator) else Communicator(comm)
        servers = int(server_ranks or 0)
        if servers < 0 or servers >= self.job.size:
            raise TopologyError("-server_ranks=%d: the job has %d ranks, and needs at least one "
                                "worker besides the dedicated servers"
                                % (servers, self.job.size))
        self.num_servers = servers
        self.num_workers = self.job.size - servers
        self.is_server = self.job.rank >= self.num_workers
        self.server_index = self.job.rank - self.num_workers if self.is_server else None
        self.hostname = socket.gethostname()
        self.job_hostnames = self.job.allgather_object(self.hostname)
        self.world = self.job.split(1 if self.is_server else 0, self.job.rank) if servers \
            else self.job
        self.local = self.leaders = None
        if self.is_server:
            self._server_side()
        else:
            self._worker_side(ranks_per_host)
        # pushes and pulls: host leaders (in host order) and the dedicated shards after them
        if servers:
            member = self.is_server or self.is_leader
            self.ps_comm = self.job.split(0 if member else None, self.job.rank)
            self.num_hosts = self.job.bcast_object(getattr(self, "num_hosts", None), root=0)
            self.shard_comm_ranks = [self.num_hosts + s for s in range(servers)]
            self.shard_job_ranks = [self.num_workers + s for s in range(servers)]
        else:
            self.ps_comm = self.leaders
            self.shard_comm_ranks = list(range(self.num_hosts))
            self.shard_job_ranks = list(self.leader_ranks)

    def _worker_side(self, ranks_per_host):
        self.rank = self.world.rank
        self.size = self.world.size
        if ranks_per_host and ranks_per_host > 0:
            if self.size % ranks_per_host:
                raise TopologyError("ranks_per_host=%d does not divide the %d worker ranks of "
                                    "the job" % (ranks_per_host, self.size))
            self.local = self.world.split(self.rank // ranks_per_host, self.rank)
        else:
            self.local = self.world.split_shared(key=self.rank)
        self.local_rank = self.local.rank
        self.local_size = self.local.size
        self.is_leader = self.local_rank == 0
        # every rank learns the world rank of its host's leader, then the list of leaders
        leader = self.local.bcast_object(self.rank, root=0)
        leaders = self.world.allgather_object(leader)
        self.leader_ranks = sorted(set(leaders))
        self.host_of_rank = [self.leader_ranks.index(l) for l in leaders]
        self.host = self.host_of_rank[self.rank]
        self.num_hosts = len(self.leader_ranks)
        self.hostnames = self.world.allgather_object(self.hostname)
        sizes = self.world.allgather_object(self.local_size)
        if len(set(sizes)) != 1:
            raise TopologyError("hosts run different numbers of workers (%s); every host must run "
                                "the same number of devices" % sorted(set(sizes)))
        self.leaders = self.world.split(0 if self.is_leader else None, self.rank)

    def _server_side(self):
        # a dedicated server is a rank of the job, not a worker: it joins no worker collective
        self.rank = self.job.rank
        self.size = self.num_workers
        self.local_rank, self.local_size = 0, 1
        self.is_leader = False
        self.host = None

    @property
    def num_shards(self):
        return self.num_servers or self.num_hosts

    @property
    def dedicated(self):
        return self.num_servers > 0

    def describe_rank(self, rank):
        """``rank`` is a rank of the job (a worker's equals its index among the workers)."""
        if rank >= self.num_workers:
            return "server rank %d (%s)" % (rank, self.job_hostnames[rank])
        if self.is_server:
            return "rank %d (%s)" % (rank, self.job_hostnames[rank])
        return "rank %d (host %d, %s)" % (rank, self.host_of_rank[rank], self.hostnames[rank])

    def free(self):
        comms = [self.local, self.leaders]
        if self.dedicated:
            comms += [self.ps_comm, self.world]
        for comm in comms:
            if comm is not None:
                comm.free()
        self.leaders = self.ps_comm = None
