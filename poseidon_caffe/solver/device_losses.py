"""The training losses of a net on a device, kept there until someone reads them.

Reading a loss to the host each iteration is a copy and a wait for the device. Instead each
forward pass copies the net's loss tops, device to device, into the next row of a small
device array; ``read()`` brings every row written since the last read to the host in one copy
and adds them up exactly as the host path does (``weight * sum(top)`` per top in float64, over
the ``iter_size`` passes, divided by ``iter_size``), so the solver's smoothed loss and what it
prints are the same numbers. The solver reads on display iterations, when the rows are full,
and at the end of a step (its NaN check runs then). A loss top whose layer wrote it on the
host (the losses that sum there) is kept in a host row instead: copying it up would be a
transfer of its own.
"""
import numpy as np

ROWS = 100                 # iterations kept on the device between reads


class DeviceLosses:
    def __init__(self, net, iter_size, rows=ROWS):
        self.net = net
        self.iter_size = int(iter_size)
        self.rows = max(int(rows), 1)
        self._store = None
        self._host_rows = None     # values of tops already on the host, and where they are
        self._on_host = None
        self._backend = None
        self._layout = None        # [(weight, offset, count)] of the loss tops in a pass
        self._width = 0
        self.pending = []          # iterations whose rows hold losses not yet read

    @property
    def full(self):
        return len(self.pending) >= self.rows

    def _prepare(self, tops):
        layout, offset = [], 0
        for blob, weight in tops:
            layout.append((weight, offset, blob.count))
            offset += blob.count
        if layout != self._layout:
            if self.pending:
                raise RuntimeError("the loss tops changed shape with losses unread")
            self._layout, self._width = layout, offset
            self._backend = tops[0][0].backend if tops else None
            width = max(self.iter_size * offset, 1)
            self._store = self._backend.empty((self.rows, width)) if tops else None
            self._host_rows = np.zeros((self.rows, width), np.float32)
            self._on_host = np.zeros((self.rows, width), bool)

    def record(self, iteration, pass_index):
        """Keep the loss tops of the forward pass just run (pass ``pass_index`` of the
        iteration) where they are: on the device, or on the host."""
        tops = self.net.loss_tops()
        if pass_index == 0:
            self._prepare(tops)
            self.pending.append(int(iteration))
        if self._store is None:
            return
        index = len(self.pending) - 1
        row = self._store.rows(index, index + 1).ravel()
        base = pass_index * self._width
        backend = self._backend
        for (blob, _), (_, offset, count) in zip(tops, self._layout):
            start = base + offset
            on_host = blob.data_on_host
            self._on_host[index, start:start + count] = on_host
            if on_host:
                self._host_rows[index, start:start + count] = blob.host_data.ravel()
            else:
                backend.copy(blob.dev_data.ravel(),
                             backend.view(row.ptr + 4 * start, (count,), row.owner))

    def read(self):
        """[(iteration, loss)] of every iteration recorded since the last read, in order (one
        copy to the host)."""
        if not self.pending:
            return []
        n = len(self.pending)
        if self._store is None:
            values = np.zeros((n, 0), np.float32)
        else:
            values = self._host_rows[:n].copy()
            if not self._on_host[:n].all():
                values = np.where(self._on_host[:n], values,
                                  self._backend.to_host(self._store.rows(0, n)))
        result = []
        for iteration, row in zip(self.pending, values):
            loss = 0.0
            for p in range(self.iter_size):
                pass_loss = 0.0
                base = p * self._width
                for weight, offset, count in self._layout:
                    part = row[base + offset:base + offset + count]
                    pass_loss += weight * float(np.sum(part, dtype=np.float64))
                loss += float(pass_loss)
            loss /= self.iter_size
            result.append((iteration, loss))
        self.pending = []
        return result
