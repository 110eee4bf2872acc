"""Split folding: the gradients of an inserted Split's outputs are added into its input's
gradient as each consumer's backward writes them, so the outputs' diffs can share storage.

Caffe keeps one diff per output of every Split that InsertSplits adds and sums them all in the
Split's backward; an Inception module's output split four ways holds four copies of that
gradient until then (GoogLeNet at batch 32: 500 MB of a 2.3 GB net). Here, right after a
consumer's backward has written its bottom's diff (a Split output), the net adds that diff into
the Split input's diff (the first contribution of a pass is copied), and the Split's own
backward only closes the pass. The outputs' diffs are then needed only between a consumer's
backward and the add that follows it, so they are views into a few buffers (``DiffPool``) --
one per bottom position of a consumer, since one layer may read several Split outputs.

The first consumer in backward order (the last in the net) writes its gradient straight into
the Split input's diff: its output's diff is the input's (``Blob.borrow_diff_of``), so the
first contribution costs no copy (GoogLeNet: an inception output's 12.8 MB, nine times a
pass). Each later one is added; a layer that can add its gradient into a bottom's diff as
cheaply as write it (``Layer.adds_to_bottoms``: AVE pooling, GoogLeNet's auxiliary heads) is
given the input's diff too and adds there, with no pass of its own.

The sum is the same; its order is the consumers' backward order rather than the outputs'
order, which changes the last bits only. A folded output's ``diff`` read after backward holds
whatever used that buffer last (these blobs are the ones the net named ``*_split_K``, not the
user's). Left as Caffe has them: Splits written in the prototxt, outputs that carry a loss
weight (their diff holds the weight), outputs a layer computes in place, and every Split on a
device backend.
"""
import numpy as np

from .diff_sharing import DiffPool


class SplitFolding:
    """Which consumers fold into which Split input, and the per-pass state of each Split."""

    def __init__(self, net, inserted):
        self.pool = DiffPool(net.layers[0].backend.dtype if net.layers else np.float32)
        self.folds = {}             # consumer layer -> [(bottom index, split layer)]
        self.split_input = {}       # folded split layer -> its bottom blob
        self.started = {}           # folded split layer -> a contribution arrived this pass
        self.zero_first = set()     # consumers that may leave a bottom diff unwritten
        # Split output blob -> its Split, where the output's diff is the Split input's: the
        # first consumer in backward writes into it, and a layer that can adds into it
        self.into_input = {}
        self.adding = {}            # consumer layer -> [(bottom index, split layer)] it adds
        made_by = {}                # blob id -> layers that write it as a top
        for i, ids in enumerate(net.top_ids):
            for bid in ids:
                made_by.setdefault(bid, []).append(i)
        out_of = {}                 # split output blob id -> split layer
        for s, layer in enumerate(net.layers):
            if (layer.type != "Split" or net.layer_names[s] not in inserted
                    or not net.layer_need_backward[s]):
                continue
            tops = net.top_ids[s]
            if any(w for _, w in net.layer_loss_weights[s]):
                continue
            if any(len(made_by.get(bid, ())) > 1 for bid in tops):
                continue            # an output computed in place: its diff lives longer
            self.split_input[s] = net.bottom_vecs[s][0]
            self.started[s] = False
            for bid in tops:
                out_of[bid] = s
        for i, ids in enumerate(net.bottom_ids):
            for j, bid in enumerate(ids):
                if bid in out_of and net.bottom_need_backward[i][j]:
                    self.folds.setdefault(i, []).append((j, out_of[bid]))
            if i in self.folds and net.param.layer[i].type == "Python":
                self.zero_first.add(i)      # a user's backward may leave a diff alone
        self.layers = net.layers
        first = {}                  # split layer -> its last consumer, the first in backward
        for i in sorted(self.folds):
            for j, s in self.folds[i]:
                first[s] = None if i in self.zero_first else (i, j)
        for i in sorted(self.folds):
            if i in self.zero_first:
                continue
            adds = self.layers[i].adds_to_bottoms()
            for j, s in self.folds[i]:
                if sum(1 for _, t in self.folds[i] if t == s) > 1:
                    continue        # two bottoms of one Split: each needs its own diff
                blob = net._blobs[net.bottom_ids[i][j]]
                if first[s] == (i, j):
                    self.into_input[blob] = s
                elif j in adds:
                    self.into_input[blob] = s
                    self.adding.setdefault(i, []).append((j, s))
        for i, ids in enumerate(net.bottom_ids):
            slot = 0
            for bid in ids:
                if bid not in out_of:
                    continue
                blob = net._blobs[bid]
                if blob in self.into_input:
                    continue
                blob.borrow_diff(self.pool, slot)
                self.pool.reserve(slot, blob.count)
                slot += 1
        self.relink()

    def relink(self):
        """(Again, once a Split input's diff has moved: net.diff_sharing) let the consumers
        that write or add into a Split's input have its diff for their bottom's."""
        for blob, s in self.into_input.items():
            blob.borrow_diff_of(self.split_input[s])

    def __bool__(self):
        return bool(self.split_input)

    def before_backward(self, i, bottoms):
        """A consumer that may skip writing a bottom's diff finds it zeroed (as Caffe's
        untouched Split output would be); one that adds into a Split's input does where a
        contribution came before it this pass, and writes it where none did."""
        if i in self.zero_first:
            for j, _ in self.folds[i]:
                bottoms[j].diff[...] = 0
        adding = self.adding.get(i)
        if adding:
            self.layers[i].adding_bottoms = frozenset(j for j, s in adding if self.started[s])

    def after_backward(self, i, bottoms):
        """Add the Split outputs this consumer's backward just wrote into their Splits' input."""
        for j, s in self.folds.get(i, ()):
            source = bottoms[j]
            target = self.split_input[s]
            be = source.backend
            if self.into_input.get(source) == s:
                self.started[s] = True      # it wrote or added into the input's diff
            elif self.started[s]:
                be.axpby(1.0, source.dev_diff, 1.0, target.mutable_dev_diff)
            else:
                be.copy(source.dev_diff, target.mutable_dev_diff)
                self.started[s] = True

    def folds_split(self, s):
        return s in self.split_input

    def finish_split(self, s):
        """The Split's backward: its input's gradient is complete; with no consumer having
        contributed this pass it is zero (the sum of untouched outputs)."""
        if not self.started[s]:
            self.split_input[s].zero_diff()
        self.started[s] = False
