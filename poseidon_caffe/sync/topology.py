"""Who is where: workers (one MPI rank per device), hosts, and parameter-server shards.

Level 1 is the devices of one host: the ranks that share memory, found with MPI's
shared-memory split. ``ranks_per_host`` overrides it (consecutive ranks form a host), so that
tests on one machine can play several hosts. Level 2 is the hosts: the first rank of each host
is its leader and does the host's off-host exchanges. Level 3 is the parameter-server shards:
one per host, co-located with its leader, as in Poseidon.
"""
import socket

from mpi4py import MPI


class TopologyError(ValueError):
    pass


class Topology:
    def __init__(self, comm=None, ranks_per_host=0):
        self.world = comm if comm is not None else MPI.COMM_WORLD
        self.rank = self.world.rank
        self.size = self.world.size
        self.hostname = socket.gethostname()
        if ranks_per_host and ranks_per_host > 0:
            if self.size % ranks_per_host:
                raise TopologyError("ranks_per_host=%d does not divide the %d ranks of the job"
                                    % (ranks_per_host, self.size))
            self.local = self.world.Split(self.rank // ranks_per_host, self.rank)
        else:
            self.local = self.world.Split_type(MPI.COMM_TYPE_SHARED, key=self.rank)
        self.local_rank = self.local.rank
        self.local_size = self.local.size
        self.is_leader = self.local_rank == 0
        # every rank learns the world rank of its host's leader, then the list of leaders
        leader = self.local.bcast(self.rank, root=0)
        leaders = self.world.allgather(leader)
        self.leader_ranks = sorted(set(leaders))
        self.host_of_rank = [self.leader_ranks.index(l) for l in leaders]
        self.host = self.host_of_rank[self.rank]
        self.num_hosts = len(self.leader_ranks)
        self.hostnames = self.world.allgather(self.hostname)
        sizes = self.world.allgather(self.local_size)
        if len(set(sizes)) != 1:
            raise TopologyError("hosts run different numbers of workers (%s); every host must run "
                                "the same number of devices" % sorted(set(sizes)))
        self.leaders = self.world.Split(0 if self.is_leader else MPI.UNDEFINED, self.rank)
        if self.leaders == MPI.COMM_NULL:
            self.leaders = None

    @property
    def num_shards(self):
        return self.num_hosts

    def describe_rank(self, rank):
        return "rank %d (host %d, %s)" % (rank, self.host_of_rank[rank], self.hostnames[rank])

    def free(self):
        for comm in (self.local, self.leaders):
            if comm is not None:
                comm.Free()
        self.leaders = None
