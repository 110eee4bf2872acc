"""Predicted iteration time of a job: the planner's bytes over a link model, scheduled as the
sync engine schedules the exchanges.

The link model. Every host has one full-duplex NIC of ``bandwidth`` bytes per second each way
and a one-way ``latency``. The hosts are alike (same compute, same bytes), so one host's
timeline stands for all of them. The off-host bytes of an exchange are the planner's
prediction for its blobs (``planner.make_plan``: the bytes the engine's counters measure), sent
plus received; every strategy moves half of them each way (a parameter-server shard co-located
with each host leader: the host pushes (H-1)/H of a blob to the other shards and takes the
other hosts' pushes of its 1/H, then the same again for the pulls; sufficient factors go to and
come from every other host; the ring sends and receives 2(H-1)/H of the blob), so the wire time
is (bytes / 2) / bandwidth, the bandwidth counted in payload (``wire_efficiency`` of it:
Ethernet, IP and TCP headers take the rest). Latency is paid once per round of messages: 2 for ps (push, then
pull), 1 for sfb (one broadcast), 2(H-1) for the ring. With ``gpus_per_node`` G > 1 each
exchange first sums (ps, allreduce) or gathers (sfb) the G devices' part over the host's
``local_bandwidth`` and hands the result back the same way. Sufficient factors cost compute at
the receiver: rebuilding the summed gradient from all H*G workers' factors is taken as H*G times
the weight-gradient half of that layer's backward time. ``overhead`` is a fixed cost per
exchange (the software's own, per message batch). With ``update_rate`` (parameter values per
second) the update that follows an exchange is counted too: on 1/H of the blob at its shard for
ps, on the whole blob at every worker for sfb and allreduce (on a GPU it is small; on a CPU it
is not).

The schedule (``sync/dwbp.py``). A bucket's exchange is submitted as soon as backward has made
all its blobs final (with ``dwbp`` off, all of them after backward, and the next forward waits
until every one is done). Exchanges start in bucket (backward) order, bucket b on channel
b mod ``channels`` (train's ``-comm_channels``; 0, a channel per bucket), one exchange per
channel at a time; those on the wire share the NIC equally, and the work after the wire
(factor rebuild, update) runs on the one worker thread, one exchange's at a time. The next
iteration's forward of a layer waits until the blobs that layer uses are fresh. The
prediction is the steady state: the mean length of the last iterations of a short run.

The host's cores (``Cluster.cores``, ``cpu_polling``, ``cpu_per_round``, ``cpu_per_byte``).
By default every thread has a core of its own and communication costs no compute. Given
cores, compute and exchanges run on one timeline (``_simulate_shared``) where the compute
thread, the communication thread, the worker thread and the network stack share them
max-min fairly (``share_cores``): compute stretches while exchanges take CPU, and their CPU
work waits for a core. The costs are measured by ``calibration.py``.
"""
from ..sync import planner
from ..sync.dwbp import make_buckets
from ..sync import strategy as registry
from .model import SimulationError

# exchanges in flight at once, as train's -comm_channels: 0, a channel per bucket
CHANNELS = 0

# payload bytes per byte on the wire: 1448 of a 1514-byte Ethernet frame (IP and TCP with
# timestamps), and the acknowledgements going the other way
WIRE_EFFICIENCY = 0.94

LATENCY_ROUNDS = {"ps": lambda hosts: 2, "sfb": lambda hosts: 1,
                  "allreduce": lambda hosts: 2 * (hosts - 1)}


class Cluster:
    """The machines: ``hosts`` nodes of ``gpus_per_node`` workers, the NIC's rate each way
    (bytes/s), the one-way latency (s), the on-host rate between devices (bytes/s)."""

    def __init__(self, hosts, bandwidth, gpus_per_node=1, latency=0.0,
                 local_bandwidth=12.5e9, channels=CHANNELS, overhead=0.0, update_rate=None,
                 wire_efficiency=WIRE_EFFICIENCY, cores=None, cpu_per_byte=0.0,
                 cpu_per_round=0.0, cpu_polling=0.0):
        if hosts < 1 or gpus_per_node < 1:
            raise SimulationError("a cluster needs at least one node of at least one GPU "
                                  "(nodes %r, gpus per node %r)" % (hosts, gpus_per_node))
        if channels < 0:
            raise SimulationError("-comm_channels=%r: a number of channels, or 0 for one per "
                                  "bucket" % (channels,))
        self.hosts = int(hosts)
        self.gpus_per_node = int(gpus_per_node)
        self.bandwidth = float(bandwidth)
        self.latency = float(latency)
        self.local_bandwidth = float(local_bandwidth)
        self.channels = int(channels)
        self.overhead = float(overhead)
        self.update_rate = float(update_rate) if update_rate else None
        if not 0 < wire_efficiency <= 1:
            raise SimulationError("wire efficiency %r: the share of a link's bytes that are "
                                  "payload is more than 0 and at most 1" % (wire_efficiency,))
        self.wire_efficiency = float(wire_efficiency)
        if cores is not None and not cores >= 1:
            raise SimulationError("-cores_per_node=%r: the cores a node's threads share, 1 or "
                                  "more" % (cores,))
        if not cpu_per_byte >= 0 or not cpu_per_round >= 0:
            raise SimulationError("CPU costs of communication are seconds, 0 or more "
                                  "(per byte %r, per round %r)" % (cpu_per_byte, cpu_per_round))
        if not 0 <= cpu_polling <= 1:
            raise SimulationError("-cpu_polling=%r: the share of a core the communication "
                                  "thread takes while exchanges are in flight, 0 to 1"
                                  % (cpu_polling,))
        self.cpu_polling = float(cpu_polling)
        self.cores = None if cores is None else float(cores)
        self.cpu_per_byte = float(cpu_per_byte)
        self.cpu_per_round = float(cpu_per_round)

    @property
    def shares_cores(self):
        """Whether the host-CPU model is asked for (else: a core for every thread, free
        communication, the schedule of ``run_exchanges``)."""
        return (self.cores is not None or self.cpu_per_byte > 0 or self.cpu_per_round > 0
                or self.cpu_polling > 0)

    def with_hosts(self, hosts):
        return Cluster(hosts, self.bandwidth, self.gpus_per_node, self.latency,
                       self.local_bandwidth, self.channels, self.overhead, self.update_rate,
                       self.wire_efficiency, self.cores, self.cpu_per_byte, self.cpu_per_round,
                       self.cpu_polling)

    @property
    def workers(self):
        return self.hosts * self.gpus_per_node


class Exchange:
    """One bucket's exchange: when it may start and what it costs."""

    def __init__(self, index, name, strategy, params, submit_layer, wire_bytes, fixed, post,
                 host_bytes, cpu=0.0):
        self.index = index
        self.name = name
        self.strategy = strategy
        self.params = params
        self.submit_layer = submit_layer      # submitted once this layer's backward is done
        self.wire_bytes = wire_bytes          # each way, through the host's NIC
        self.fixed = fixed                    # seconds not on the NIC before the wire
        self.post = post                      # seconds after the wire (factor rebuild)
        self.host_bytes = host_bytes          # off-host sent + received (the planner's)
        self.cpu = cpu                        # CPU seconds on the communication thread


def plan_exchanges(model, times, cluster, mode="auto", svb=None, fuse_bytes=1 << 16):
    """The plan ({param index: strategy}) and the list of Exchange, in backward order."""
    if cluster.workers == 1:
        return {}, []                     # one worker alone exchanges nothing
    params = model.params
    if mode not in planner.modes():
        raise SimulationError("-sync=%s is not one of %s" % (mode, "|".join(planner.modes())))
    try:
        plan, predicted = planner.make_plan(
            params, mode, lambda p: p.sfb.rows_per_pass if p.sfb else 1,
            (cluster.hosts, cluster.hosts, cluster.gpus_per_node), svb=svb, announce=False)
    except planner.PlanError as exc:
        raise SimulationError(str(exc)) from None
    fusing = {cls.name for cls in registry.registered() if cls.fuses}
    buckets = make_buckets(params, plan, fuse_bytes, fusing)
    H, G = cluster.hosts, cluster.gpus_per_node
    exchanges = []
    for bucket in buckets:
        host_bytes = sum(predicted[p.index] for p in bucket.items)
        rounds = LATENCY_ROUNDS.get(bucket.strategy, lambda hosts: 2)(H) if H > 1 else 0
        fixed = rounds * cluster.latency + cluster.overhead
        post = 0.0
        if G > 1:
            fixed += _local_seconds(bucket, cluster)
        if bucket.strategy == "sfb":
            layer = bucket.items[0].ready_layer
            post = H * G * 0.5 * times.backward_ms[layer] * 1e-3
        if cluster.update_rate:
            # the update after the exchange: a shard's 1/H of each blob (ps), or the whole
            # blob on every worker (the others)
            updated = bucket.count / float(H) if bucket.strategy == "ps" else bucket.count
            post += updated / cluster.update_rate
        submit = min(p.ready_layer for p in bucket.items)
        exchanges.append(Exchange(bucket.index, bucket.name, bucket.strategy, bucket.items,
                                  submit, host_bytes / 2.0 / cluster.wire_efficiency, fixed,
                                  post, host_bytes, rounds * cluster.cpu_per_round))
    return plan, exchanges


def _local_seconds(bucket, cluster):
    """The device level: the G devices' part summed (or gathered) into the host leader and
    the result handed back."""
    H, G = cluster.hosts, cluster.gpus_per_node
    if bucket.strategy == "sfb":
        item = bucket.items[0]
        factors = 4.0 * item.sfb.rows_per_pass * (item.sfb.M + item.sfb.N)
        moved = (G - 1) * factors + (G - 1) * H * G * factors
    else:
        moved = 2.0 * (G - 1) * 4.0 * bucket.count
    return moved / cluster.local_bandwidth


class _Task:
    def __init__(self, exchange, submit):
        self.exchange = exchange
        self.submit = submit
        self.phase = None
        self.left = 0.0
        self.start = None
        self.end = None


def run_exchanges(tasks, cluster):
    """Give every task its start and end as the engine runs them: exchanges start in bucket
    order, bucket b on channel b mod C, a channel carrying one exchange at a time (so bucket b
    also waits for bucket b - C to end); exchanges on the wire share the bandwidth equally;
    the work after the wire (rebuilding from factors, the update) runs on the one worker
    thread, one exchange's at a time."""
    order = sorted(tasks, key=lambda t: t.exchange.index)
    position = {id(t): k for k, t in enumerate(order)}
    channels = len(order) if cluster.channels <= 0 else cluster.channels
    channels = max(1, min(channels, len(order)))
    waiting = list(order)
    active = []
    cpu_queue = []             # tasks whose wire is done, waiting for the communication thread
    now = 0.0
    eps = 1e-12
    bw = cluster.bandwidth

    def may_start(task):
        k = position[id(task)]
        return (task.submit <= now + eps and (k == 0 or order[k - 1].start is not None)
                and (k < channels or order[k - channels].end is not None))

    def advance(task):
        # pre -> wire -> (wait for the thread) -> post -> done, skipping empty phases
        while True:
            if task.phase is None:
                task.phase, task.left = "pre", task.exchange.fixed
            elif task.phase == "pre":
                task.phase, task.left = "wire", task.exchange.wire_bytes
            elif task.phase == "wire":
                if task.exchange.post <= 0:
                    task.phase, task.end = "done", now
                    return
                task.phase, task.left = "queued", task.exchange.post
                cpu_queue.append(task)
                return
            else:
                task.phase, task.end = "done", now
                return
            if task.left > eps:
                return

    while waiting or active:
        while waiting and may_start(waiting[0]):
            task = waiting.pop(0)
            task.start = now
            advance(task)
            if task.phase != "done":
                active.append(task)
        if not any(t.phase == "post" for t in active) and cpu_queue:
            cpu_queue.pop(0).phase = "post"
        wiring = sum(1 for t in active if t.phase == "wire")
        share = bw / wiring if wiring else bw
        steps = [t.left / share if t.phase == "wire" else t.left
                 for t in active if t.phase in ("pre", "wire", "post")]
        if waiting and waiting[0].submit > now + eps:
            steps.append(waiting[0].submit - now)
        if not steps:
            if waiting:                     # nothing runs and the next may start now
                continue
            break
        dt = max(min(steps), 0.0)
        now += dt
        for task in list(active):
            if task.phase == "wire":
                task.left -= dt * share
                finished = task.left <= eps * max(1.0, task.exchange.wire_bytes)
            elif task.phase in ("pre", "post"):
                task.left -= dt
                finished = task.left <= eps
            else:
                continue
            if finished:
                advance(task)
                if task.phase == "done":
                    active.remove(task)
    return tasks


def share_cores(demands, cores):
    """Max-min fair shares of ``cores`` for ``demands`` (cores each would use alone): the
    smallest demands are met in full, the rest split what is left equally, as a fair
    scheduler time-slices runnable threads. ``cores`` None: every demand is met."""
    if cores is None:
        return list(demands)
    shares = [0.0] * len(demands)
    left, count = float(cores), len(demands)
    for k in sorted(range(len(demands)), key=lambda j: demands[j]):
        shares[k] = min(demands[k], left / count)
        left -= shares[k]
        count -= 1
    return shares


class _Flow:
    """One exchange on the shared timeline: pre (latency, on-host, overhead: no CPU) -> cpu
    (its rounds' work on the communication thread) -> wire (the NIC, and the network stack's
    CPU per byte) -> queued/post (factor rebuild, update: the worker thread) -> done."""
    __slots__ = ("exchange", "iteration", "submit", "phase", "left", "start", "end")

    def __init__(self, exchange, iteration, submit):
        self.exchange = exchange
        self.iteration = iteration
        self.submit = submit
        self.phase = None
        self.left = 0.0
        self.start = None
        self.end = None


def _simulate_shared(forward, backward, exchanges, by_first_use, cluster, dwbp, iterations):
    """Compute and exchanges on one timeline whose CPU work shares the node's cores.

    Four things want cores: the compute thread (one core while it runs a layer), the
    communication thread (one core while any exchange is in its cpu phase, split equally
    among them; else ``cpu_polling`` of one while any is in flight: it tests and sleeps),
    the worker thread (one core for the post work of one exchange at a time) and
    the network stack (``cpu_per_byte`` x the bytes per second on the wire, sent plus
    received). ``share_cores`` gives each its share; each runs at its share over its demand
    of the speed it has alone, so compute stretches while exchanges take CPU, and an
    exchange's CPU work waits for a core; the wire slows once the stack's share falls below
    what it has with only the polling beside it (the link's rate is the rate it gives
    then). (iteration starts, [(start, end)] of each iteration's exchanges, seconds the
    compute thread ran per iteration)."""
    eps = 1e-12
    cores = cluster.cores
    bw = cluster.bandwidth
    stack_demand = cluster.cpu_per_byte * 2.0 * cluster.wire_efficiency * bw
    # the link's rate is what the wire gets with only the polling beside the stack (as a rate
    # measured on the machines is), so the stack slows it only below this share
    stack_alone = share_cores([0.0, cluster.cpu_polling, 0.0, stack_demand], cores)[3]
    in_order = sorted(exchanges, key=lambda e: e.index)
    by_submit = {}                      # layer -> the exchanges its backward submits, in order
    for e in in_order:
        by_submit.setdefault(e.submit_layer, []).append(e)
    n = len(forward)
    program = []                        # the compute thread's steps, every iteration
    for k in range(iterations):
        program.append(("start", k, None))
        for i in range(n):
            if by_first_use.get(i):
                program.append(("wait", k, by_first_use[i]))
            program.append(("work", k, forward[i]))
        for i in range(n - 1, -1, -1):
            program.append(("work", k, backward[i]))
            if dwbp and by_submit.get(i):
                program.append(("submit", k, by_submit[i]))
        if not dwbp and exchanges:
            program.append(("submit", k, in_order))
            program.append(("wait all", k, None))
    program.append(("start", iterations, None))
    fresh = {}                          # param index -> iterations whose update has landed
    flows = []                          # every exchange of every iteration, in start order
    waiting, active, post_queue = [], [], []
    open_by_iteration = [0] * (iterations + 1)
    channels = len(exchanges) if cluster.channels <= 0 else cluster.channels
    channels = max(1, min(channels, max(len(exchanges), 1)))
    starts, busy = [], [0.0] * iterations
    step, work_left = 0, None
    now = 0.0

    def advance(flow):
        # to the next phase that has something to do
        while True:
            if flow.phase is None:
                flow.phase, flow.left = "pre", flow.exchange.fixed
            elif flow.phase == "pre":
                flow.phase, flow.left = "cpu", flow.exchange.cpu
            elif flow.phase == "cpu":
                flow.phase, flow.left = "wire", flow.exchange.wire_bytes
            elif flow.phase == "wire" and flow.exchange.post > 0:
                flow.phase, flow.left = "queued", flow.exchange.post
                post_queue.append(flow)
                return
            else:
                flow.phase, flow.end = "done", now
                active.remove(flow)
                open_by_iteration[flow.iteration] -= 1
                for p in flow.exchange.params:
                    fresh[p.index] = flow.iteration + 1
                return
            if flow.left > eps:
                return

    def may_start(flow):
        # ``flow`` is the first waiting one: the flows before it have all started
        k = len(flows) - len(waiting)
        return (flow.submit <= now + eps and (k == 0 or flows[k - 1].start is not None)
                and (k < channels or flows[k - channels].end is not None))

    while True:
        moved = True
        while moved:                    # everything that can happen at ``now``
            moved = False
            while work_left is None and step < len(program):
                kind, k, what = program[step]
                if kind == "start":
                    starts.append(now)
                elif kind == "wait":
                    if any(fresh.get(p.index, 0) < k for p in what):
                        break
                elif kind == "wait all":
                    if open_by_iteration[k]:
                        break
                elif kind == "submit":
                    for e in what:
                        flow = _Flow(e, k, now)
                        flows.append(flow)
                        waiting.append(flow)
                        open_by_iteration[k] += 1
                elif what > eps:
                    work_left = what
                step += 1
                moved = True
            while waiting and may_start(waiting[0]):
                flow = waiting.pop(0)
                flow.start = now
                active.append(flow)
                advance(flow)
                moved = True
            if post_queue and not any(f.phase == "post" for f in active):
                post_queue.pop(0).phase = "post"
                moved = True
        if step >= len(program) and work_left is None and not active and not waiting:
            break
        # who wants cores now, and what each gets
        in_cpu = [f for f in active if f.phase == "cpu"]
        on_wire = [f for f in active if f.phase == "wire"]
        in_post = [f for f in active if f.phase == "post"]
        # the communication thread: a core for its rounds' work, else its polling while
        # anything is in flight
        thread_wants = 1.0 if in_cpu else (cluster.cpu_polling if active else 0.0)
        wants = [1.0 if work_left is not None else 0.0, thread_wants,
                 1.0 if in_post else 0.0, stack_demand if on_wire else 0.0]
        got = share_cores(wants, cores)
        compute_speed = got[0]
        thread_speed = got[1] / len(in_cpu) if in_cpu else 0.0
        post_speed = got[2]
        wire_speed = ((min(got[3] / stack_alone, 1.0) if stack_alone > 0 else 1.0)
                      * bw / max(len(on_wire), 1))
        rates = []
        if work_left is not None:
            rates.append((None, compute_speed))
        for f in active:
            rate = {"pre": 1.0, "cpu": thread_speed, "wire": wire_speed,
                    "post": post_speed}.get(f.phase, 0.0)
            if rate > 0:
                rates.append((f, rate))
        steps = [(work_left if f is None else f.left) / rate for f, rate in rates]
        if waiting and waiting[0].submit > now + eps:
            steps.append(waiting[0].submit - now)
        if not steps:
            raise SimulationError("the schedule stalls: nothing runs and nothing may start")
        dt = max(min(steps), 0.0)
        now += dt
        for f, rate in rates:
            if f is None:
                work_left -= dt * rate
                busy[program[step - 1][1]] += dt
                if work_left <= eps:
                    work_left = None
                continue
            f.left -= dt * rate
            scale = max(1.0, f.exchange.wire_bytes) if f.phase == "wire" else 1.0
            if f.left <= eps * scale:
                advance(f)
    spans = [[] for _ in range(iterations)]
    for f in flows:
        spans[f.iteration].append((f.start, f.end))
    return starts, spans, busy


class Prediction:
    """One configuration's steady-state iteration."""

    def __init__(self, cluster, model, iter_s, compute_s, comm_s, host_bytes, plan, exchanges,
                 compute_busy_s=None):
        self.cluster = cluster
        # the compute thread's seconds per iteration with the cores shared (None: a core for
        # every thread, so compute_s)
        self.compute_busy_s = compute_busy_s
        self.model = model
        self.iter_s = iter_s
        self.compute_s = compute_s
        self.comm_s = comm_s
        self.host_bytes = host_bytes
        self.plan = plan
        self.exchanges = exchanges

    @property
    def images_per_s(self):
        return self.cluster.workers * self.model.batch / self.iter_s

    @property
    def exposed_s(self):
        return max(self.iter_s - self.compute_s, 0.0)

    @property
    def hidden_share(self):
        """Share of the communication time that overlapped compute (1 when there is none)."""
        if self.comm_s <= 0:
            return 1.0
        return min(max(1.0 - self.exposed_s / self.comm_s, 0.0), 1.0)


def simulate(model, times, cluster, mode="auto", svb=None, dwbp=True, fuse_bytes=1 << 16,
             iterations=8, measured=4):
    """The Prediction for ``model`` with per-layer ``times`` on ``cluster``."""
    forward = [v * 1e-3 for v in times.forward_ms]
    backward = [v * 1e-3 for v in times.backward_ms]
    plan, exchanges = plan_exchanges(model, times, cluster, mode, svb, fuse_bytes)
    by_first_use = {}
    for exchange in exchanges:
        for p in exchange.params:
            by_first_use.setdefault(p.first_use, []).append(p)
    if cluster.shares_cores:
        starts, spans, busy = _simulate_shared(forward, backward, exchanges, by_first_use,
                                               cluster, dwbp, iterations)
        comm = [_union(one) for one in spans]
        compute_busy_s = sum(busy[-measured:]) / len(busy[-measured:])
    else:
        starts, comm = _simulate_free(forward, backward, exchanges, by_first_use, cluster,
                                      dwbp, iterations)
        compute_busy_s = None
    lengths = [b - a for a, b in zip(starts[:-1], starts[1:])]
    last = lengths[-measured:]
    iter_s = sum(last) / len(last)
    compute_s = sum(forward) + sum(backward)
    comm_s = sum(comm[-measured:]) / len(comm[-measured:])
    host_bytes = sum(e.host_bytes for e in exchanges)
    return Prediction(cluster, model, iter_s, compute_s, comm_s, host_bytes, plan, exchanges,
                      compute_busy_s)


def _simulate_free(forward, backward, exchanges, by_first_use, cluster, dwbp, iterations):
    """A core for every thread: the compute runs at the speed of its times and the exchanges
    follow it (``run_exchanges``). (iteration starts, each iteration's exchange time)."""
    fresh = {p.index: 0.0 for ps in by_first_use.values() for p in ps}
    starts, comm = [], []
    now = 0.0
    for _ in range(iterations):
        starts.append(now)
        t = now
        for i, seconds in enumerate(forward):
            for p in by_first_use.get(i, ()):
                t = max(t, fresh[p.index])
            t += seconds
        submitted = {}
        for i in range(len(backward) - 1, -1, -1):
            t += backward[i]
            submitted[i] = t
        end_backward = t
        tasks = [_Task(e, submitted[e.submit_layer] if dwbp else end_backward)
                 for e in exchanges]
        run_exchanges(tasks, cluster)
        for task in tasks:
            for p in task.exchange.params:
                fresh[p.index] = task.end
        comm.append(_union([(task.start, task.end) for task in tasks]))
        now = end_backward if dwbp else max([end_backward] + [task.end for task in tasks])
    starts.append(now)
    return starts, comm


def _union(intervals):
    total, end = 0.0, None
    for a, b in sorted(intervals):
        if end is None or a > end:
            total += b - a
            end = b
        elif b > end:
            total += b - end
            end = b
    return total
