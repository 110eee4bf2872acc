"""Diff sharing: blobs whose gradients are never needed at the same time keep them in shared
buffers, as a trainer that reads no intermediate gradient can afford.

Caffe keeps a diff for every blob for the net's whole life, so a pycaffe user can read any
gradient after ``backward``; a training run reads none of them. In backward, a blob's diff
is needed only from the layer that first writes it (its consumer; a loss top's seed) to its
producer's backward, which reads it last: GoogLeNet at batch 32 has 820 MB of blob diffs but
never more than 150 MB of them needed at once. ``share_diffs(net)`` works out each blob's span
in backward order and gives blobs whose spans do not overlap views into one buffer
(``DiffPool``), chosen best-fit by size. The numbers are those of separate diffs: each layer
computes the same values in the same order, only into other memory.

A blob keeps a diff of its own where its first use in backward is not a full write: a diff
its producer reads although no consumer writes it (Caffe's untouched zeros), a blob a Python
layer touches (user code may leave a diff alone or read it later), and the net's inputs and
outputs (what a caller reads). After backward, a shared blob's ``diff`` holds whatever used
its buffer last. ``poseidon-caffe train`` and ``time`` share; a net built through pycaffe
keeps Caffe's one-diff-per-blob unless the caller asks (``net.share_diffs()``). CPU nets only,
like split folding.
"""
import numpy as np


class DiffPool:
    """Buffers handed out as the diffs of blobs that never need theirs at the same time as
    another blob of the same slot."""

    def __init__(self, dtype=np.float32):
        self.dtype = np.dtype(dtype)
        self._buffers = {}
        self.sizes = {}             # slot -> the most values a blob of it has asked for

    def reserve(self, slot, count):
        self.sizes[slot] = max(self.sizes.get(slot, 0), int(count))

    def take(self, slot, shape):
        """A zeroed-at-first view of ``shape`` into the slot's buffer."""
        count = int(np.prod(shape, dtype=np.int64)) if shape else 1
        self.reserve(slot, count)
        buf = self._buffers.get(slot)
        if buf is None or buf.size < count:
            # a larger reshape: blobs holding views of the old buffer keep them
            buf = np.zeros(self.sizes[slot], dtype=self.dtype)
            self._buffers[slot] = buf
        return buf[:count].reshape(shape)

    def fill(self, value):
        """Every buffer made so far set to ``value`` (tests poison them with NaN)."""
        for buf in self._buffers.values():
            buf[...] = value

    @property
    def nbytes(self):
        return sum(self.sizes.values()) * self.dtype.itemsize


def diff_spans(net):
    """{blob id: (first, last)} in backward steps (0 = the last layer's backward) for every
    blob whose diff can be shared: written in full before anything reads it."""
    steps = len(net.layers)
    events = {}                 # blob id -> [(step, writes)] in backward order
    barred = set(net.input_blob_indices) | set(net.output_blob_indices)
    folding = net._split_folding
    for i in range(steps - 1, -1, -1):
        if not net.layer_need_backward[i]:
            continue
        step = steps - 1 - i
        tops = net.top_ids[i]
        touched = []
        # a loss top's diff is seeded with its weight before the layer reads it
        touched += [(tops[j], True) for j, _ in net.layer_loss_weights[i]]
        if folding is not None:
            # a consumer of a folded Split output adds into the Split's input afterwards
            touched += [(net.bottom_ids[s][0], True) for _, s in folding.folds.get(i, ())]
        touched += [(bid, bid not in tops) for j, bid in enumerate(net.bottom_ids[i])
                    if net.bottom_need_backward[i][j]]
        touched += [(bid, False) for bid in tops]
        if net.layers[i].type == "Python":
            barred.update(bid for bid, _ in touched)
        for bid, writes in touched:
            events.setdefault(bid, []).append((step, writes))
    spans = {}
    for bid, seen in events.items():
        blob = net._blobs[bid]
        if bid in barred or blob.borrows_diff or not seen[0][1]:
            continue
        spans[bid] = (seen[0][0], seen[-1][0])
    return spans


def share_diffs(net):
    """Give the blobs of ``diff_spans`` views into a pool's buffers, best fit by size among
    the buffers free when each span opens. Returns the pool (``nbytes``: what they take)."""
    pool = DiffPool(net.layers[0].backend.dtype if net.layers else np.float32)
    free_after = []             # slot -> the last step of its latest span
    spans = diff_spans(net)
    for bid in sorted(spans, key=lambda b: spans[b]):
        first, last = spans[bid]
        need = net._blobs[bid].count
        free = [s for s, end in enumerate(free_after) if end < first]
        fits = [s for s in free if pool.sizes[s] >= need]
        if fits:
            slot = min(fits, key=lambda s: pool.sizes[s])
        elif free:
            slot = max(free, key=lambda s: pool.sizes[s])     # grows the least
        else:
            slot = len(free_after)
            free_after.append(-1)
        free_after[slot] = last
        pool.reserve(slot, need)
        net._blobs[bid].borrow_diff(pool, slot)
    if net._split_folding is not None:
        net._split_folding.relink()           # Split inputs' diffs may have moved
    return pool
