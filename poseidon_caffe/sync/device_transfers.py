"""Level 1 on a device rank: what crosses the bus between the device and the exchanges.

A rank whose net lives on a device (the CUDA backend) exchanges through page-locked host
buffers, one set per exchanged blob, and never through the blob's host arrays (``blob.data``,
``blob.diff`` would make the host the head of Caffe's SyncedMemory and copy synchronously on
whichever thread touched them). Per iteration:

- out: when backward makes a layer's gradients final (the grad-ready hook, compute thread),
  the device -> pinned copy of each gradient (or, for a blob that travels as sufficient
  factors, of the layer's top diff and bottom data rows) is queued on a copy stream and an
  event is recorded after it. The exchange starts on the communication thread once that event
  has completed; the compute thread never waits for the copy;
- in: before the layer's next forward (the before-forward hook, after the freshness wait) the
  fresh weights go pinned -> device, into the blob's device memory, whose head stays on the
  device. A blob that travelled as factors instead gets the stacked factors of every worker:
  its summed gradient is rebuilt there by one GEMM and the solver's own device update applies
  it (the same kernels, history and order as a single-device solver).

All device work runs on the compute thread; the communication thread reads and writes pinned
host memory only and asks the copy events whether they are done.
"""
import dataclasses
import typing

import numpy as np

from .dwbp import SyncError


def on_device(items):
    """The backend the items' blobs live on, when that is a device; else None."""
    for item in items:
        if item.blob.backend.on_device:
            return item.blob.backend
    return None


@dataclasses.dataclass(eq=False)
class _Slot:
    """What the transfers keep of one item: its pinned buffers and where its device copy stands."""
    device_version: int                 # the clock whose weights the device holds
    grads: typing.Optional[list] = None   # pinned gradient buffers, made on first use: a
    #                                       blob sent as factors needs none
    staged: typing.Optional[tuple] = None  # a factor blob's pinned rows of every pass:
    #                                        (top diffs, bottom data)
    stacked: typing.Any = None          # every worker's factors, stacked for one upload
    passes_read: int = 0
    factors_in: typing.Optional[int] = None   # rows of stacked factors waiting for the device


class DeviceTransfers:
    """The pinned buffers, the copy stream and the copies of one device rank's items."""

    def __init__(self, backend, items, iter_size=1, workers=1, depth=2):
        self.backend = backend
        self.stream = backend.stream()
        self.iter_size = int(iter_size)
        self.workers = int(workers)
        # a gradient buffer is reused ``depth`` clocks later: by then its exchange has ended
        self.depth = max(2, int(depth))
        pinned = backend.pinned_empty
        self.slots = {}
        for item in items:
            # the weights as the exchanges see them; the same bytes as the device's at start
            item.host_data = pinned((item.count,), np.float32)
            item.host_data[...] = item.blob.synced_data.cpu_data()
            slot = self.slots[item.index] = _Slot(device_version=item.fresh)
            if item.sfb is not None and item.sfb.device_blobs is not None:
                self._stage_factors(item, slot)
        # what crossed the bus from the end of the first iteration (which makes the buffers)
        # to the end of the latest: the job's statistics report it per iteration
        self._first_mark = self._last_mark = None
        self._marked = 0

    def _stage_factors(self, item, slot):
        source = item.sfb
        rows = self.iter_size * int(source.rows_per_pass)
        pinned = self.backend.pinned_empty
        slot.staged = (pinned((rows, source.N), np.float32),
                       pinned((rows, source.M), np.float32))
        # every worker's factors, stacked as [all top diffs | all bottom data]: one upload
        slot.stacked = pinned((self.workers * rows * (source.N + source.M),), np.float32)

    # -- the factors of a blob sent as sufficient factors (the sfb strategy asks) -----------
    def staged_factors(self, item):
        """The pinned rows every pass of this iteration was copied into, in order."""
        return self.slots[item.index].staged

    def stacked_factors(self, item):
        """The pinned buffer the exchange leaves every worker's factors in."""
        return self.slots[item.index].stacked

    def factors_arrived(self, item, rows):
        """``rows`` rows of every worker's factors are in the stacked buffer (communication
        thread): the next refresh rebuilds the gradient from them on the device."""
        self.slots[item.index].factors_in = rows

    # -- the communication thread ----------------------------------------------------------
    def enter_thread(self):
        """Make the device current on the communication thread, which queries the copy
        events (a CUDA driver call needs a current context there)."""
        self.backend.enter_thread()

    def leave_thread(self):
        self.backend.leave_thread()

    # -- out (compute thread) ----------------------------------------------------------------
    def copy_gradient(self, item, clock):
        """Queue the copy of ``item``'s device gradient into its pinned buffer for ``clock``;
        returns that buffer (complete once the next recorded event has)."""
        slot = self.slots[item.index]
        if slot.grads is None:
            slot.grads = [self.backend.pinned_empty((item.count,), np.float32)
                          for _ in range(self.depth)]
        buf = slot.grads[clock % self.depth]
        self.backend.copy_to_host(buf, item.blob.dev_diff, self.stream)
        return buf

    def copy_factors(self, item):
        """Queue the copy of this pass's factor rows (top diff, bottom data) into the pinned
        rows of the pass; returns views of them (complete once the next event has)."""
        source, slot = item.sfb, self.slots[item.index]
        bottom, top = source.device_blobs
        m = int(source.rows_per_pass)
        if top.count != m * source.N or bottom.count != m * source.M:
            raise SyncError("%s: the layer now runs %d rows, not the %d its factors were "
                            "staged for" % (item.name, top.count // source.N, m))
        p = slot.passes_read % self.iter_size
        slot.passes_read += 1
        diff_rows = slot.staged[0][p * m:(p + 1) * m]
        data_rows = slot.staged[1][p * m:(p + 1) * m]
        self.backend.copy_to_host(diff_rows, top.dev_diff, self.stream)
        self.backend.copy_to_host(data_rows, bottom.dev_data, self.stream)
        return diff_rows, data_rows

    def record(self):
        """An event after every copy queued so far: the exchanges' trigger."""
        event = self.backend.event()
        event.record(self.stream)
        return event

    # -- what crossed ------------------------------------------------------------------------
    def end_iteration(self):
        """Mark the end of an iteration (compute thread, after its gradients were queued)."""
        now = self.backend.transfers_now()
        if self._first_mark is None:
            self._first_mark = now
        else:
            self._marked += 1
        self._last_mark = now

    def moved(self):
        """The device's copies and host waits over the iterations after the first: a dict of
        ``Transfers``' counts (the prefetch thread's batches included) and ``iterations``;
        None before two iterations have ended."""
        if not self._marked:
            return None
        return dict(self._last_mark.since(self._first_mark).__dict__, iterations=self._marked)

    # -- in (compute thread) -----------------------------------------------------------------
    def refresh(self, items, rule):
        """Bring the device's copy of ``items`` to the freshest clock the exchanges left."""
        for item in items:
            fresh, slot = item.fresh, self.slots[item.index]
            if fresh <= slot.device_version:
                continue
            if slot.factors_in is not None:
                self._apply_factors(item, slot, rule, fresh - 1)
            else:
                device = item.blob.mutable_dev_data
                self.backend.upload(item.host_data, device)
            slot.device_version = fresh

    def _apply_factors(self, item, slot, rule, clock):
        """The summed gradient from every worker's factors, rebuilt on the device by one GEMM
        over the stacked rows (the product one device of the whole batch computes), then the
        solver's update of that clock on the device."""
        source, be = item.sfb, self.backend
        rows = slot.factors_in
        slot.factors_in = None
        n = rows * (source.N + source.M)
        stacked = be.empty((n,))
        be.upload(slot.stacked[:n], stacked)
        D = stacked.rows(0, rows * source.N).reshape(rows, source.N)
        A = stacked.rows(rows * source.N, n).reshape(rows, source.M)
        # the blob's diff holds nothing of use until backward: it lends its memory here and
        # is cleared again, so backward accumulates from zero as always
        diff = item.blob.mutable_dev_diff.reshape(-1)
        grad = diff.reshape(source.M, source.N) if source.transpose else \
            diff.reshape(source.N, source.M)
        if source.transpose:
            be.gemm(A, D, trans_a=True, alpha=1.0 / self.workers, out=grad)
        else:
            be.gemm(D, A, trans_a=True, alpha=1.0 / self.workers, out=grad)
        rule.apply_on_device(item.index, item.blob.mutable_dev_data.reshape(-1), diff, clock)
        be.fill(diff, 0.0)
