"""The sync runtime's one door to MPI.

A ``Communicator`` is an MPI communicator with the calls the runtime makes on it: the
exchanges' non-blocking sends, receives and collectives, each counted under a key in the
engine's byte counters (``counters.py``: what the plan is held to; ``local`` marks traffic
between the devices of one host), and the uncounted calls of start-up, snapshots and control
messages (Python objects, barriers). Requests are MPI's own; ``test_some``/``test_all`` test
them, ``abort`` ends the job. No other module of the runtime imports mpi4py; it is imported
on first use, so the planner and the simulator, which read the runtime's small classes, load
no MPI.
"""


def _mpi():
    from mpi4py import MPI
    return MPI


def world():
    """The whole job."""
    return Communicator(_mpi().COMM_WORLD)


def job_size():
    return _mpi().COMM_WORLD.Get_size()


def abort(code=1):
    """End every rank of the job now, with status ``code``."""
    _mpi().COMM_WORLD.Abort(code)


def test_some(requests):
    """Test ``requests`` in one call (completed ones become null); the indices completed."""
    return _mpi().Request.Testsome(requests) or ()


def test_all(requests):
    """Whether every one of ``requests`` has completed (they become null)."""
    return _mpi().Request.Testall(requests)


def null_request(request):
    """Whether ``request`` is MPI's null request (completed, or none made)."""
    return not request


class Communicator:
    """``comm`` (an mpi4py communicator) with byte counting under ``counters``."""

    def __init__(self, comm, counters=None, local=False):
        self.comm = comm
        self.counters = counters
        self.local = bool(local)

    @property
    def rank(self):
        return self.comm.rank

    @property
    def size(self):
        return self.comm.size

    def with_counters(self, counters, local=None):
        """This communicator, counting into ``counters`` (the same MPI communicator)."""
        return Communicator(self.comm, counters, self.local if local is None else local)

    def dup(self, counters=None, local=None):
        """A communicator of its own over the same ranks (collective), counting into
        ``counters`` (this one's by default)."""
        return Communicator(self.comm.Dup(), self.counters if counters is None else counters,
                            self.local if local is None else local)

    def split(self, color, key):
        """The ranks of one ``color`` (None: this rank joins none, and gets None)."""
        mpi = _mpi()
        comm = self.comm.Split(mpi.UNDEFINED if color is None else color, key)
        return None if comm == mpi.COMM_NULL else Communicator(comm)

    def split_shared(self, key):
        """The ranks that share memory with this one: its host."""
        return Communicator(self.comm.Split_type(_mpi().COMM_TYPE_SHARED, key=key))

    def free(self):
        if self.comm is not None:
            self.comm.Free()
            self.comm = None

    # -- counted: the exchanges' traffic ---------------------------------------------------
    def count(self, key, sent=0, received=0):
        """Count bytes this rank sent or received under ``key`` (for receives counted as they
        complete, not when posted)."""
        if self.counters is not None:
            self.counters.add(key, sent=sent, received=received, local=self.local)

    def isend(self, buf, dest, tag, key):
        request = self.comm.Isend(buf, dest=dest, tag=tag)
        self.count(key, sent=buf.nbytes)
        return request

    def irecv(self, buf, source, tag, key=None):
        """A receive into ``buf``, counted now under ``key``; with no key, uncounted (the
        caller counts it as it completes)."""
        request = self.comm.Irecv(buf, source=source, tag=tag)
        if key is not None:
            self.count(key, received=buf.nbytes)
        return request

    def reduce_sum(self, buf, key):
        """Sum ``buf`` over the ranks into rank 0's ``buf``."""
        mpi = _mpi()
        if self.rank == 0:
            request = self.comm.Ireduce(mpi.IN_PLACE, buf, op=mpi.SUM, root=0)
            self.count(key, received=buf.nbytes * (self.size - 1))
        else:
            request = self.comm.Ireduce(buf, None, op=mpi.SUM, root=0)
            self.count(key, sent=buf.nbytes)
        return request

    def broadcast(self, buf, key):
        """Rank 0's ``buf`` to every rank."""
        request = self.comm.Ibcast(buf, root=0)
        if self.rank == 0:
            self.count(key, sent=buf.nbytes * (self.size - 1))
        else:
            self.count(key, received=buf.nbytes)
        return request

    def gather(self, buf, gathered, key):
        """Every rank's ``buf`` (equal sizes), concatenated in rank order into rank 0's
        ``gathered``."""
        request = self.comm.Igather(buf, gathered if self.rank == 0 else None, root=0)
        if self.rank == 0:
            self.count(key, received=buf.nbytes * (self.size - 1))
        else:
            self.count(key, sent=buf.nbytes)
        return request

    # -- uncounted: start-up, snapshots, control -------------------------------------------
    def bcast_array(self, buf, root=0):
        """Blocking: ``root``'s ``buf`` into every rank's (the weights at start)."""
        self.comm.Bcast(buf, root=root)

    def iallreduce_max(self, send, recv):
        return self.comm.Iallreduce(send, recv, op=_mpi().MAX)

    def ibarrier(self):
        return self.comm.Ibarrier()

    def bcast_object(self, obj, root=0):
        return self.comm.bcast(obj, root=root)

    def allgather_object(self, obj):
        return self.comm.allgather(obj)

    def allreduce_object(self, obj):
        return self.comm.allreduce(obj)

    def gather_object(self, obj, root=0):
        return self.comm.gather(obj, root=root)

    def send_object(self, obj, dest, tag):
        self.comm.send(obj, dest=dest, tag=tag)

    def recv_object(self, source, tag):
        return self.comm.recv(source=source, tag=tag)

    def irecv_object(self, source, tag):
        """A request whose ``test()`` gives (done, the object)."""
        return self.comm.irecv(source=source, tag=tag)

    def iprobe(self, source, tag):
        return self.comm.iprobe(source=source, tag=tag)


def cancel(request):
    """Cancel a request still in flight and wait for it to end."""
    request.Cancel()
    request.Wait()


def wait(request):
    request.Wait()
