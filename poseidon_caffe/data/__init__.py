"""Datasets: LMDB reading in record order, Caffe's transforms, prefetch, image tools.

The distributed engine tells this package which worker the process is (``set_worker``); the data
layers then read only that worker's share of every database, by one of two rules:

* striding (Caffe's multi-GPU rule): worker r of P reads records r, r+P, r+2P, ... of the one
  database, so P workers of batch B together see exactly the batches of one worker of batch P*B;
* partitions (Poseidon's rule): a worker of client (host) c reads ``<source>_<c>``, the
  client's partition, when it exists, and the client's L workers stride over it (local worker
  l reads records l, l+L, ...). ``make_partitions SOURCE N`` writes record i into partition
  i % N, so with one worker per client each holds exactly the records striding would give
  it, on its own disk if need be; only the wrap-around point differs when N does not divide
  the number of records. ``shared_file_system: true`` in the layer's data_param always
  selects the shared database; ``partitioned=True`` requires the partition.

Only TRAIN-phase layers are sharded: as in Caffe, the test nets of every worker read the whole
test set.
"""
import threading

import os

_worker = {"rank": 0, "size": 1, "partitioned": False, "client": None}
_lock = threading.Lock()


def set_worker(rank, size, partitioned=False, client=None):
    """Make this process worker ``rank`` of ``size`` for every data layer built from now on.

    ``client`` is (client_id, local_rank, local_size): the Poseidon client (host) the worker
    runs on and its place among that client's workers; unset, worker r is client r alone."""
    rank, size = int(rank), int(size)
    if size < 1 or not 0 <= rank < size:
        raise ValueError("worker rank %d of %d is out of range" % (rank, size))
    if client is not None:
        cid, local_rank, local_size = (int(v) for v in client)
        if cid < 0 or local_size < 1 or not 0 <= local_rank < local_size:
            raise ValueError("client %d, local worker %d of %d is out of range"
                             % (cid, local_rank, local_size))
        client = (cid, local_rank, local_size)
    with _lock:
        _worker.update(rank=rank, size=size, partitioned=bool(partitioned), client=client)


def get_worker():
    """(rank, size, partitioned) as last set; (0, 1, False) in a plain run."""
    with _lock:
        return _worker["rank"], _worker["size"], _worker["partitioned"]


def partition_path(source, k):
    """Where make_partitions writes partition ``k`` of ``source``."""
    return "%s_%d" % (str(source).rstrip("/"), k)


def select_source(source, shared=False, rank=None, size=None):
    """(database path, stride offset, stride) for a TRAIN data layer of this worker, by the
    rules above; ``rank``/``size`` default to the worker's. Raises FileNotFoundError naming
    the partition when ``partitioned=True`` was asked for and it is missing."""
    with _lock:
        w = dict(_worker)
    rank = w["rank"] if rank is None else rank
    size = w["size"] if size is None else size
    if size == 1 or shared:
        return source, rank, size
    cid, local_rank, local_size = w["client"] or (rank, 0, 1)
    part = partition_path(source, cid)
    if os.path.isdir(part):
        return part, local_rank, local_size
    if w["partitioned"]:
        raise FileNotFoundError(part)
    return source, rank, size
