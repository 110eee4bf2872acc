"""Datasets: LMDB reading in record order, Caffe's transforms, prefetch, image tools.

The distributed engine tells this package which worker the process is (``set_worker``); the data
layers then read only that worker's share of every database, by one of two rules:

* striding (Caffe's multi-GPU rule): worker r of P reads records r, r+P, r+2P, ... of the one
  database, so P workers of batch B together see exactly the batches of one worker of batch P*B;
* partitions (Poseidon's rule, ``partitioned=True``): worker r reads the whole database
  ``<source>_<r>`` that ``make_partitions`` wrote (record i into partition i % P), so each
  worker holds exactly the records striding would give it, on its own disk if need be; only
  the wrap-around point differs when P does not divide the number of records.

Only TRAIN-phase layers are sharded: as in Caffe, the test nets of every worker read the whole
test set.
"""
import threading

_worker = {"rank": 0, "size": 1, "partitioned": False}
_lock = threading.Lock()


def set_worker(rank, size, partitioned=False):
    """Make this process worker ``rank`` of ``size`` for every data layer built from now on."""
    rank, size = int(rank), int(size)
    if size < 1 or not 0 <= rank < size:
        raise ValueError("worker rank %d of %d is out of range" % (rank, size))
    with _lock:
        _worker.update(rank=rank, size=size, partitioned=bool(partitioned))


def get_worker():
    """(rank, size, partitioned) as last set; (0, 1, False) in a plain run."""
    with _lock:
        return _worker["rank"], _worker["size"], _worker["partitioned"]


def partition_path(source, k):
    """Where make_partitions writes partition ``k`` of ``source``."""
    return "%s_%d" % (str(source).rstrip("/"), k)
