"""The sync engine's core: items (learnable blobs), the plan, the strategies and the schedule.

It knows a model only as a list of items -- a blob with data and diff, the layer whose backward
makes its gradient final, the layer whose forward first needs it, and for an InnerProduct weight
a way to read its sufficient factors -- plus an update rule over array slices. ``attach`` in
``distributed.py`` builds those from a solver; tests build them from plain arrays.
"""
import dataclasses
import time
import typing

import numpy as np

from .. import log
from ..memory import format_bytes
from ..solver import updates
from . import strategy as registry
from .strategy import Strategy
from .counters import ByteCounters
from .device_transfers import DeviceTransfers, on_device
from .dwbp import Scheduler, SyncError, make_buckets
from .planner import make_plan
from .offload import OFFLOAD_SIZE
from .channels import Channel
from .transport import Transport

CHANNELS = 0      # exchanges in flight at once, by default: 0, one lane per bucket


@dataclasses.dataclass(eq=False)
class FactorSource:
    """Where an InnerProduct layer's sufficient factors are read: top diff (K x N), bottom data
    (K x M); ``transpose`` as the layer's weight layout. On the host ``read()`` gives this
    pass's (top diff, bottom data); on a device rank the layer's (bottom, top) blobs are read
    there instead, by the device transfers (``device_transfers.py``)."""
    M: int
    N: int
    read: typing.Optional[typing.Callable[[], tuple]]
    transpose: bool = False
    rows_per_pass: typing.Optional[int] = None
    device_blobs: typing.Optional[tuple] = None

    def __post_init__(self):
        self.M, self.N = int(self.M), int(self.N)
        self.transpose = bool(self.transpose)


@dataclasses.dataclass(eq=False)
class Item:
    """One exchanged blob: what the planner prices, the engine schedules and the strategies
    move. Every field is here; a device rank's copies and buffers live in its DeviceTransfers."""
    index: int
    name: str
    blob: typing.Any
    ready_layer: int                   # the layer whose backward makes its gradient final
    first_use: int                     # the layer whose forward first needs its weights
    sfb: typing.Optional[FactorSource] = None
    shape: tuple = dataclasses.field(init=False)
    count: int = dataclasses.field(init=False)
    rows: int = dataclasses.field(init=False)
    strategy: typing.Optional[str] = None      # the plan's name for it
    bucket: typing.Any = None                  # the Bucket it travels in
    fresh: int = 0                     # the first clock whose update its weights lack
    passes: int = 0                    # backward passes of this iteration captured
    host_data: typing.Any = None       # on a device rank: the pinned weights the exchanges
    #                                    update (device_transfers.py)
    result: typing.Any = None          # with global clipping: the summed gradient, until the
    #                                    norm over every item is known

    def __post_init__(self):
        # a device blob's shape is read without touching its host copy
        self.shape = tuple(self.blob.shape if self.blob.backend.on_device
                           else self.blob.data.shape)
        self.count = int(np.prod(self.shape)) if self.shape else 1
        self.rows = self.shape[0] if self.shape else 1

    @property
    def data_flat(self):
        if self.host_data is not None:
            return self.host_data
        flat = self.blob.data.reshape(-1)
        if not np.shares_memory(flat, self.blob.data):
            raise SyncError("parameter %s is not contiguous in memory" % self.name)
        return flat

    @property
    def diff_flat(self):
        return self.blob.diff.reshape(-1)


class SyncEngine:
    def __init__(self, topology, items, rule, mode="auto", staleness=0, svb=None, dwbp=True,
                 batch_rows=None, iter_size=1, start_clock=0, clip=None, fuse_bytes=1 << 16,
                 timeout=300.0, timeline=None, announce=True, update="server",
                 channels=CHANNELS, offload_size=OFFLOAD_SIZE):
        # update "server": one Caffe update of the averaged gradient (one worker with P times
        # the batch); "worker": Poseidon's rule, each worker's solver computes its update from
        # its own gradient and history, and the exchange adds the workers' updates
        self.update = update
        self.topology = topology
        self.items = list(items)
        self.rule = rule
        self.iter_size = int(iter_size)
        self.staleness = int(staleness)
        self.workers = topology.size
        self.clip = clip if (clip is not None and clip >= 0) else None
        self.counters = ByteCounters()
        self.transport = Transport(topology, self.counters, timeout)
        self.transport.offload.size = int(offload_size)
        self.timeline = timeline
        batch_rows = batch_rows or (lambda item: item.sfb.rows_per_pass if item.sfb else 1)
        self.plan, self.predicted = make_plan(
            self.items, mode, lambda item: batch_rows(item) * self.iter_size,
            (topology.num_hosts, topology.num_shards, topology.local_size), self.staleness, svb,
            self.clip is not None, announce, dedicated=topology.dedicated, update=update)
        for item in self.items:
            item.strategy = self.plan[item.index]
            item.fresh = start_clock
        # a device rank exchanges through pinned buffers (device_transfers.py); None on the CPU
        device_backend = on_device(self.items)
        self.transfers = None if device_backend is None else DeviceTransfers(
            device_backend, self.items, self.iter_size, self.workers, self.staleness + 2)
        self.clock = start_clock
        self.start_clock = start_clock
        self.strategies = {}       # name -> the open strategy, for the blobs the plan gave it
        for cls in registry.registered():
            opened = cls.open(self, [item for item in self.items if item.strategy == cls.name])
            if opened is not None:
                self.strategies[cls.name] = opened
        for item in self.items:
            if getattr(self.strategies[item.strategy], "device_apply", False):
                # its update runs on the device, with the solver's history there
                keep = getattr(rule, "keep_on_device", None)
                if keep is not None:
                    keep(item.index)
        fusing = {cls.name for cls in registry.registered() if cls.fuses}
        self.buckets = make_buckets(self.items, self.plan, fuse_bytes, fusing)
        # the lanes exchanges travel on: one per bucket (Poseidon gave every layer its own
        # sync thread), or as many as asked, no more than there are buckets to fill them
        channels = int(channels) if channels and int(channels) > 0 else len(self.buckets)
        channels = max(1, min(channels, len(self.buckets)))
        self.channels = [Channel.duplicate(k, topology, self.counters) for k in range(channels)]
        for bucket in self.buckets:
            bucket.channel = bucket.index % channels
        self.bucket_predicted = {b.name: sum(self.predicted[i.index] for i in b.items)
                                 for b in self.buckets}
        self.by_ready = {}
        self.by_first_use = {}
        for item in self.items:
            self.by_ready.setdefault(item.ready_layer, []).append(item)
            self.by_first_use.setdefault(item.first_use, []).append(item)
        self.payloads = {}
        self.submitted = set()
        self.dwbp = bool(dwbp)
        self.closed = False
        self.wait_seconds = 0.0        # the compute thread's waits for the communication
        self.capture_seconds = 0.0     # ... and its copies of gradients handed over
        self.failure_handler = None
        self.scheduler = Scheduler(self.exchange, self.transport, self.channels,
                                   self.on_comm_failure, thread_context=self.transfers,
                                   timeline=timeline)
        # work the offload thread finishes wakes the communication thread at once
        self.transport.offload.wake = self.scheduler.ring

    # -- compute-thread side: the net's hooks --------------------------------------------------
    def grad_ready(self, layer_index):
        items = self.by_ready.get(layer_index)
        if not items:
            return
        start = time.perf_counter()
        if self.transfers is None:
            for item in items:
                self._capture(item)
        else:
            self._capture_on_device(items)
        end = time.perf_counter()
        self.capture_seconds += end - start
        if self.timeline is not None:
            self.timeline.span_at("copy out layer %d" % layer_index, "sync", start, end, 0)

    def before_forward(self, layer_index):
        items = self.by_first_use.get(layer_index)
        if not items:
            return
        if not all(item.fresh >= self.clock for item in items):
            start = time.perf_counter()
            self.scheduler.wait_items(items, self.clock, "waiting for fresh weights of layer "
                                      "%d (iteration %d)" % (layer_index, self.clock))
            self._timed(start, time.perf_counter(), "wait layer %d" % layer_index, "wait")
        if self.transfers is not None:
            # the fresh weights (or factors) into the device, once, before the layer runs
            self.transfers.refresh(items, self.rule)

    def _capture(self, item):
        strategy = self.strategies[item.strategy]
        strategy.capture(item)
        item.passes += 1
        if item.passes < self.iter_size:
            return
        item.passes = 0
        self.payloads[item.index] = strategy.payload(item, self.clock)
        bucket = item.bucket
        if self.dwbp and all(i.index in self.payloads for i in bucket.items):
            self._submit(bucket)

    def _capture_on_device(self, items):
        """The device rank's capture: queue the copies out of the device (a strategy that
        keeps something of every pass, as sfb's factors, reads it through its item), record
        one event after them, and hand over each bucket now complete with that event as its
        trigger. Nothing here waits for the device."""
        complete = []
        for item in items:
            strategy = self.strategies[item.strategy]
            per_pass = type(strategy).capture is not Strategy.capture
            if per_pass:
                strategy.capture(item)
            item.passes += 1
            if item.passes < self.iter_size:
                continue
            item.passes = 0
            self.payloads[item.index] = (strategy.payload(item, self.clock) if per_pass
                                         else self.transfers.copy_gradient(item, self.clock))
            complete.append(item)
        if not complete:
            return
        ready = self.transfers.record()
        if not self.dwbp:
            return
        for item in complete:
            bucket = item.bucket
            if bucket.index not in self.submitted and all(i.index in self.payloads
                                                          for i in bucket.items):
                self._submit(bucket, ready)

    def _submit(self, bucket, ready=None):
        self.scheduler.submit(*self._task(bucket, ready))

    def _task(self, bucket, ready=None):
        payloads = [self.payloads.pop(i.index) for i in bucket.items]
        self.submitted.add(bucket.index)
        return bucket, self.clock, payloads, ready

    def after_backward(self):
        """All passes of this clock's backward are done: send what is left, and (without DWBP,
        or with global clipping) wait for the exchange before the update is taken."""
        start = time.perf_counter()
        tasks = []
        for bucket in self.buckets:
            if bucket.index in self.submitted:
                continue
            for item in bucket.items:
                if item.index not in self.payloads:
                    # its layer's backward did not run (in every pass): send what there is
                    item.passes = 0
                    strategy = self.strategies[item.strategy]
                    if self.transfers is None or type(strategy).capture is not Strategy.capture:
                        self.payloads[item.index] = strategy.payload(item, self.clock)
                    else:
                        self.payloads[item.index] = self.transfers.copy_gradient(item, self.clock)
            tasks.append(bucket)
        # on a device, one event after every copy queued so far starts them all
        ready = self.transfers.record() if tasks and self.transfers is not None else None
        tasks = [self._task(bucket, ready) for bucket in tasks]
        # handed over together: without DWBP every channel starts at once
        self.scheduler.submit_all(tasks)
        self.submitted.clear()
        clock = self.clock
        if tasks:
            self._timed(start, time.perf_counter(), "copy out", "sync", capture=True)
        if self.clip is not None or not self.dwbp:
            start = time.perf_counter()
            self.scheduler.wait_idle("waiting for the gradient exchange of iteration %d" % clock)
            self._timed(start, time.perf_counter(), "wait for the exchanges", "wait")
            if self.clip is not None:
                self._clip_and_update(clock)
        self.counters.end_iteration()
        if self.transfers is not None:
            self.transfers.end_iteration()
        self.clock = clock + 1

    def _timed(self, start, end, name, category, capture=False):
        if capture:
            self.capture_seconds += end - start
        else:
            self.wait_seconds += end - start
        if self.timeline is not None:
            self.timeline.span_at(name, category, start, end, 0)

    def _clip_and_update(self, clock):
        # the solver's global clipping, over the aggregated gradients
        sumsq = sum(float(np.dot(item.result, item.result)) for item in self.items)
        scale = updates.clip_scale(sumsq, self.clip)
        for item in self.items:
            diff = item.result
            if scale is not None:
                diff *= scale
            self.rule.apply(item.index, item.data_flat, diff, self.rule.history(item.index), clock)
            item.result = None
        self.scheduler.mark_fresh(self.items, clock)

    def sync_point(self):
        """Everything sent, every update applied, every replica current (tests, snapshots, end)."""
        self.scheduler.wait_idle("waiting for the exchanges to finish")
        if self.closed:            # close() left every replica current
            return
        clock = self.clock

        def catch_up():
            for strategy in self.strategies.values():
                strategy.wait(clock)
        self.scheduler.call(catch_up)
        if self.transfers is not None:
            self.transfers.refresh(self.items, self.rule)

    # -- communication-thread side ---------------------------------------------------------------
    def exchange(self, task, channel):
        """One bucket's exchange (a generator the scheduler drives on the communication
        thread): the strategy's steps on ``channel``, then the update of the items."""
        bucket, clock = task.bucket, task.clock
        what = "exchanging %s (iteration %d)" % (bucket.name, clock)
        inv = 1.0 / self.workers
        worker_rule = self.update == "worker"
        compute = self.transport.offload.computed    # the numeric work, off the polling thread
        if worker_rule:
            # the planner gave this bucket a strategy that carries update values
            def updates():
                for item, payload in zip(bucket.items, task.payloads):
                    self.rule.compute(item.index, item.data_flat, payload,
                                      self.rule.history(item.index), clock)
            yield from compute(updates, bucket.count)
        sums = yield from self.strategies[bucket.strategy].start(bucket, task.payloads, clock,
                                                                 what, channel)
        if sums is not None:       # None: the strategy left the fresh weights in the items
            def apply():
                for item, total in zip(bucket.items, sums):
                    if worker_rule:
                        item.data_flat[...] -= total     # the sum of the workers' updates
                        continue
                    total *= inv
                    self._local_update(item, total, clock)
            yield from compute(apply, bucket.count)
        if self.clip is None:
            self.scheduler.mark_fresh(bucket.items, clock)

    def _local_update(self, item, diff, clock):
        if self.clip is not None:
            item.result = diff
            return
        self.rule.apply(item.index, item.data_flat, diff, self.rule.history(item.index), clock)

    def on_comm_failure(self, exc):
        if self.failure_handler is not None:
            self.failure_handler(exc, "the communication thread")

    # -- reports -------------------------------------------------------------------------------
    def log_bytes(self, window=True):
        measured = self.counters.per_iteration(window)
        total_pred = total_meas = 0.0
        for bucket in self.buckets:
            row = measured.get(bucket.name, {})
            meas = row.get("sent", 0) + row.get("received", 0)
            local = row.get("local_sent", 0) + row.get("local_received", 0)
            pred = self.bucket_predicted[bucket.name]
            total_pred += pred
            total_meas += meas
            log.info("    Sync %s %s: %s off-host per iteration (predicted %s), %s on-host",
                     bucket.strategy, bucket.name, format_bytes(meas), format_bytes(pred),
                     format_bytes(local))
        log.info("    Sync total: %s off-host per iteration (predicted %s per host)",
                 format_bytes(total_meas), format_bytes(total_pred))
        moved = None if (window or self.transfers is None) else self.transfers.moved()
        if moved:
            n = moved["iterations"]
            log.info("    Device: per iteration %s in (%g copies), %s out (%g copies), %g host "
                     "waits", format_bytes(moved["htod_bytes"] / n), moved["htod_calls"] / n,
                     format_bytes(moved["dtoh_bytes"] / n), moved["dtoh_calls"] / n,
                     moved["host_syncs"] / n)
        if window:
            self.counters.reset_window()

    def stats(self):
        return {
            "rank": self.topology.rank, "host": self.topology.host,
            "is_leader": self.topology.is_leader, "iterations": self.counters.iterations,
            "plan": {item.name: item.strategy for item in self.items},
            "predicted": {b.name: self.bucket_predicted[b.name] for b in self.buckets},
            "measured": self.counters.per_iteration(window=False),
            "buckets": {b.name: [i.name for i in b.items] for b in self.buckets},
            "stale_reads": {self.items_by_index()[k].name: v
                            for strategy in self.strategies.values()
                            for k, v in strategy.stale_reads.items()},
            "staleness": self.staleness,
            "wait_seconds": self.wait_seconds,
            "capture_seconds": self.capture_seconds,
            "comm_seconds": self.scheduler.comm_busy,
            "channels": len(self.channels),
            "exchanges": self.scheduler.exchanges,
            "overlapped_exchanges": self.scheduler.overlapped,
            "in_flight_peak": self.scheduler.in_flight_peak,
            "comm_polls": self.scheduler.polls,
            "comm_cpu_seconds": self.scheduler.cpu_seconds,
            # a device rank's copies and host waits after its first iteration (device_transfers.py)
            "device_transfers": None if self.transfers is None else self.transfers.moved(),
        }

    def items_by_index(self):
        return {item.index: item for item in self.items}

    def close(self):
        self.sync_point()
        clock = self.clock

        def close_all():
            for strategy in self.strategies.values():
                strategy.close(clock)
            for channel in self.channels:
                channel.free()
        self.scheduler.call(close_all)
        self.scheduler.stop()
        self.transport.close()
        self.closed = True
