"""The host-CPU costs of communication, measured where the job will run: what the simulator's
``-cpu_per_byte`` and ``-cpu_per_round`` are (``schedule.py``, "the host's cores").

Every rank of an MPI job (one rank per node, all at once, so that the nodes share whatever
they share in training) first times ``work`` -- one forward and backward of its net, say --
alone. Then, twice, it runs ``work`` the same number of times again while a second thread
exchanges messages around the ring (each rank sends to the next and hears the previous; one
round of messages per exchange, waited for as the engine waits: tests with short sleeps),
once with small messages, once with large ones. The compute thread's lost time, divided by
the exchanges made, is what one exchange costs the compute: with one core for the compute
and the communication (the model's ``-cores_per_node 1``) exactly the CPU it took, the
fixed cost of a round plus the cost of its bytes. The small messages give the first; the
difference between the two, over the difference in bytes, the second.

``measure(comm, work)`` returns this rank's figures; ``combine`` averages the ranks'.
"""
import time

from ..sync.dwbp import BUSY_PAUSE

TAG = 31337
SMALL_VALUES = 256            # 1 KB of float32: a round of messages whose bytes cost nothing
LARGE_VALUES = 1 << 18        # 1 MB: one whose bytes dominate


def _wait(requests):
    """Wait as the engine's communication thread waits: test, then sleep, backing off."""
    from mpi4py import MPI
    pause = 0.0
    while not MPI.Request.Testall(requests):
        pause = min(pause * 2 or 5e-5, BUSY_PAUSE)
        time.sleep(pause)


def _exchanges(comm, values, done=None, count=None):
    """Rounds around the ring of ``values`` float32 each way: ``count`` of them, or (``done``,
    an Event) until every rank has seen some rank's ``done`` set. The first value of each
    message carries the round the ranks stop after (0: not decided): the first rank done
    decides on the round after the decision has gone round the ring, and the earliest decision
    wins. The end time of each round, in order."""
    import numpy as np
    out = np.ones(values, np.float32)
    into = np.empty_like(out)
    rank, size = comm.rank, comm.size
    stop_at = float(count or 0)
    ends = []
    i = 0
    while True:
        i += 1
        if done is not None and not stop_at and done.is_set():
            stop_at = float(i + size + 1)
        out[0] = stop_at
        _wait([comm.Isend(out, dest=(rank + 1) % size, tag=TAG),
               comm.Irecv(into, source=(rank - 1) % size, tag=TAG)])
        ends.append(time.perf_counter())
        heard = float(into[0])
        if heard and (not stop_at or heard < stop_at):
            stop_at = heard
        if stop_at and i >= stop_at:
            return ends


def _timed_work(comm, work, calls):
    comm.Barrier()
    start = time.perf_counter()
    for _ in range(calls):
        work()
    return time.perf_counter() - start


def rounds_within(start, ends, until):
    """Rounds (with the share of the one under way) done between ``start`` and ``until``."""
    whole = [e for e in ends if e <= until]
    rounds = float(len(whole))
    later = [e for e in ends if e > until]
    if later:
        since = whole[-1] if whole else start
        rounds += (until - since) / max(later[0] - since, 1e-12)
    return rounds


def measure(comm, work, seconds=1.5, small=SMALL_VALUES, large=LARGE_VALUES):
    """This rank's figures: ``cpu_per_round`` (s), ``cpu_per_byte`` (s per byte sent plus
    received) and what they came from. ``work()`` is one unit of compute (the same on every
    rank); each timed phase lasts about ``seconds``."""
    import threading
    from mpi4py import MPI
    work()                                   # warm: first calls allocate
    first = _timed_work(comm, work, 1)
    calls = max(2, int(round(seconds / max(comm.allreduce(first, op=MPI.MAX), 1e-6))))
    alone = _timed_work(comm, work, calls)
    out = {"calls": calls, "work_alone_s": alone / calls}
    for name, values in (("small", small), ("large", large)):
        comm.Barrier()
        start = time.perf_counter()
        ends = _exchanges(comm, values, count=5)
        round_alone = (ends[-1] - ends[1]) / 3.0     # the first two warm the connection
        done = threading.Event()
        ends = []
        thread = threading.Thread(target=lambda: ends.extend(_exchanges(comm, values, done)),
                                  name="calibration-comm")
        comm.Barrier()
        start = time.perf_counter()
        thread.start()
        for _ in range(calls):
            work()
        end = time.perf_counter()
        done.set()
        thread.join()
        rounds = rounds_within(start, ends, end)
        out[name] = {"values": values, "bytes": 2.0 * 4 * values, "rounds": rounds,
                     "round_alone_s": round_alone, "round_busy_s": (end - start) / max(rounds, 1e-9),
                     "work_busy_s": (end - start) / calls, "lost_s": end - start - alone}
    out["cpu_per_round"], out["cpu_per_byte"] = costs(out["small"], out["large"])
    return out


def costs(small, large):
    """(seconds a round, seconds a byte) from the compute lost beside small and large rounds
    (``lost_s``, ``rounds``, ``bytes`` sent plus received each round): a round costs
    per_round + bytes x per_byte. Noise that would make either negative reads as 0."""
    per_small = small["lost_s"] / max(small["rounds"], 1e-9)
    per_large = large["lost_s"] / max(large["rounds"], 1e-9)
    per_byte = max((per_large - per_small) / (large["bytes"] - small["bytes"]), 0.0)
    return max(per_small - per_byte * small["bytes"], 0.0), per_byte


def combine(figures):
    """The ranks' figures as one: the means of ``cpu_per_byte`` and ``cpu_per_round``."""
    n = float(len(figures))
    return {"cpu_per_byte": sum(f["cpu_per_byte"] for f in figures) / n,
            "cpu_per_round": sum(f["cpu_per_round"] for f in figures) / n}
