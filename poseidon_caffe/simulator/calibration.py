"""The host-CPU costs of communication, measured where the job will run: what the simulator's
``-cpu_polling``, ``-cpu_per_round`` and ``-cpu_per_byte`` are (``schedule.py``,
``_simulate_shared``).

Every rank of an MPI job (one rank per node, all at once, so that the nodes share whatever
they share in training) times ``work`` -- one forward and backward of its net, say -- alone,
before and after the rest. Then it runs ``work`` the same number of times three times more,
while a second thread

* waits for one message that the previous rank's compute thread sends when its compute is
  over: the thread only tests and sleeps, as the engine's communication thread does while
  its exchanges are in flight;
* exchanges small messages around the ring, round after round (each rank sends to the next
  and hears the previous; one round of messages, waited for the same way);
* the same with large messages.

The compute thread's lost time is what the communication cost it: with one core shared by
the compute and the communication (the model's ``-cores_per_node 1``) exactly the CPU the
communication took. The first phase gives the share of a core the waiting takes (per second
in flight); what the rounds cost beyond it, per round, is the fixed cost of a round plus the
cost of its bytes: the small rounds give the first, the difference between the small and
the large ones over the difference in bytes the second.

``measure(comm, work)`` returns this rank's figures; ``combine`` averages the ranks'.
``link(comm)`` measures the rate and latency MPI gets between the nodes, the simulator's
``-bandwidth`` and ``-latency`` (``poseidon-caffe calibrate`` runs both and prints the flags).
"""
import time

from ..sync.dwbp import BUSY_PAUSE

TAG = 31337
SMALL_VALUES = 256            # 1 KiB of float32: a round of messages whose bytes cost nothing
LARGE_VALUES = 1 << 18        # 1 MiB: one whose bytes dominate


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
    """This rank's figures: ``cpu_polling`` (share of a core), ``cpu_per_round`` (s),
    ``cpu_per_byte`` (s per byte sent plus received) and what they came from. ``work()`` is
    one unit of compute (the same on every rank); each timed phase lasts about ``seconds``."""
    import threading
    import numpy as np
    from mpi4py import MPI
    rank, size = comm.rank, comm.size
    work()                                   # warm: first calls allocate
    first = _timed_work(comm, work, 1)
    calls = max(2, int(round(seconds / max(comm.allreduce(first, op=MPI.MAX), 1e-6))))
    before = _timed_work(comm, work, calls)
    out = {"calls": calls}

    def beside(communicate, after_work=None):
        # ``calls`` of work beside a thread that communicates: (seconds, the thread's result)
        result = {}
        thread = threading.Thread(target=lambda: result.update(value=communicate()),
                                  name="calibration-comm")
        comm.Barrier()
        start = time.perf_counter()
        thread.start()
        for _ in range(calls):
            work()
        end = time.perf_counter()
        if after_work is not None:
            after_work()
        thread.join()
        return start, end, result.get("value")

    # waiting: one message in flight for the whole compute
    note = np.zeros(1, np.float32)
    heard = np.zeros(1, np.float32)
    start, end, _ = beside(
        lambda: _wait([comm.Irecv(heard, source=(rank - 1) % size, tag=TAG + 1)]),
        lambda: comm.Send(note, dest=(rank + 1) % size, tag=TAG + 1))
    out["waiting"] = {"busy_s": end - start}
    for name, values in (("small", small), ("large", large)):
        comm.Barrier()
        ends = _exchanges(comm, values, count=5)
        round_alone = (ends[-1] - ends[1]) / 3.0     # the first two warm the connection
        done = threading.Event()
        start, end, ends = beside(lambda: _exchanges(comm, values, done), done.set)
        rounds = rounds_within(start, ends, end)
        out[name] = {"values": values, "bytes": 2.0 * 4 * values, "rounds": rounds,
                     "round_alone_s": round_alone,
                     "round_busy_s": (end - start) / max(rounds, 1e-9),
                     "work_busy_s": (end - start) / calls, "busy_s": end - start}
    # the compute alone again, after: the mean of the two stands for it, and their difference
    # says how steady the machine was meanwhile
    after = _timed_work(comm, work, calls)
    alone = 0.5 * (before + after)
    out["work_alone_s"] = alone / calls
    out["alone_drift"] = (after - before) / alone
    for name in ("waiting", "small", "large"):
        out[name]["lost_s"] = out[name]["busy_s"] - alone
    out["cpu_polling"], out["cpu_per_round"], out["cpu_per_byte"] = costs(
        out["waiting"], out["small"], out["large"])
    return out


def link(comm, values=1 << 20, trips=20):
    """(bytes a second each way, one-way latency in seconds) that MPI gets between this rank
    and its neighbours now: every rank sends 4 MB to the next while hearing the previous
    (twice, the second counts; waited for without pause), then pairs of ranks bounce one
    value ``trips`` times, each wait polled with the engine's pause (the latency a round of
    an exchange pays; the median trip halved). The rate is what the simulator's ``-bandwidth`` is, the latency its
    ``-latency``."""
    import numpy as np
    from mpi4py import MPI
    size, rank = comm.size, comm.rank
    sent, heard = np.ones(values, np.float32), np.empty(values, np.float32)
    rate = 0.0
    for _ in range(2):
        comm.Barrier()
        start = time.perf_counter()
        # a blocking wait: MPI moves bytes only while it is polled, and the link's rate is
        # what it gives polled without pause
        MPI.Request.Waitall([comm.Isend(sent, dest=(rank + 1) % size, tag=TAG + 2),
                             comm.Irecv(heard, source=(rank - 1) % size, tag=TAG + 2)])
        comm.Barrier()
        rate = sent.nbytes / max(time.perf_counter() - start, 1e-9)
    tiny, back = np.zeros(1, np.float32), np.zeros(1, np.float32)
    partner = rank + 1 if rank % 2 == 0 else rank - 1
    times = []
    for _ in range(trips):
        comm.Barrier()
        start = time.perf_counter()
        if partner < size:
            if rank % 2 == 0:
                _wait([comm.Isend(tiny, dest=partner, tag=TAG + 3)])
                _wait([comm.Irecv(back, source=partner, tag=TAG + 3)])
            else:
                _wait([comm.Irecv(back, source=partner, tag=TAG + 3)])
                _wait([comm.Isend(tiny, dest=partner, tag=TAG + 3)])
        times.append(time.perf_counter() - start)
    # a rank left without a partner (an odd count) bounced nothing: the others' trips count
    trip = sorted(times)[len(times) // 2] if partner < size else None
    trips_heard = [t for t in comm.allgather(trip) if t is not None]
    latency = sorted(trips_heard)[len(trips_heard) // 2] / 2.0 if trips_heard else 0.0
    return rate, latency


def costs(waiting, small, large):
    """(share of a core while waiting, seconds a round, seconds a byte) from the compute lost
    (``lost_s``) in ``busy_s`` seconds beside a wait, and beside ``rounds`` small and large
    rounds (``bytes`` sent plus received each). As the model has it with one core: waiting
    takes ``polling`` of it; a round's own work (per_round + bytes x per_byte) runs at half a
    core beside the compute, the thread polling the rest of the time. Noise that would make
    a cost negative reads as 0, and so do the rounds' costs where waiting took half a core (a
    busy machine): no share of the core is left to tell a round's work by."""
    polling = min(max(waiting["lost_s"] / max(waiting["busy_s"], 1e-9), 0.0), 0.5)

    def per_round(phase):
        # lost = rounds x work + polling x (busy - rounds x 2 x work)
        spare = 1.0 - 2.0 * polling
        if spare <= 0.0:
            return 0.0
        return (phase["lost_s"] - polling * phase["busy_s"]) / (
            max(phase["rounds"], 1e-9) * spare)
    per_small, per_large = per_round(small), per_round(large)
    per_byte = max((per_large - per_small) / (large["bytes"] - small["bytes"]), 0.0)
    return polling, max(per_small - per_byte * small["bytes"], 0.0), per_byte


def combine(figures):
    """The ranks' figures as one: the mean of each cost."""
    n = float(len(figures))
    return {key: sum(f[key] for f in figures) / n
            for key in ("cpu_polling", "cpu_per_round", "cpu_per_byte")}
