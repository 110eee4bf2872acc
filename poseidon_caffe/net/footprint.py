"""Memory footprint: the bytes a net's blobs, diffs, workspaces and data layers' batches in
flight need, counted before anything is allocated or read, and the check that stops a net that
cannot fit."""
from collections import OrderedDict

from .. import log, memory
from ..proto import caffe_pb2
from .errors import NetMemoryError


class MemoryFootprint:
    """Part of ``Net``: the memory its blobs need."""

    def memory_estimate(self):
        """Bytes the net's blobs need once running: {"data", "diff", "workspace", "prefetch",
        "total", "layers": {layer name: bytes}}. Each storage counts once (in-place tops, shared
        data, shared parameters), under the layer that makes it; a blob gets a diff where backward
        writes one; parameters have diffs in a TRAIN net; workspaces are those the layers'
        plans report (im2col columns and padded inputs); prefetch is the batches a data
        layer's reader holds (``prefetch_bytes()``)."""
        needs_diff = set()
        for i in range(len(self.layers)):
            if self.layer_need_backward[i]:
                needs_diff.update(self.top_ids[i])
            needs_diff.update(bid for j, bid in enumerate(self.bottom_ids[i])
                              if self.bottom_need_backward[i][j])
        per_layer = OrderedDict((name, 0) for name in self.layer_names)
        totals = {"data": 0, "diff": 0, "workspace": 0, "prefetch": 0}
        counted = set()

        def count(layer_name, blob, with_diff):
            if id(blob) in counted:
                return
            counted.add(id(blob))
            data = 0 if blob.shares_data else blob.nbytes
            # no blob takes another's diff (a shared parameter is one Blob in every layer);
            # a pooled diff (split folding, diff sharing) counts once, with its pool, below
            diff = blob.nbytes if with_diff and not blob.borrows_diff else 0
            totals["data"] += data
            totals["diff"] += diff
            per_layer[layer_name] += data + diff

        scratch_of = (0, None)      # the threads' scratch: the largest layer's, once
        for i, name in enumerate(self.layer_names):
            for bid in self.top_ids[i]:
                count(name, self._blobs[bid], bid in needs_diff)
            for blob in self.layers[i].blobs:
                count(name, blob, self.phase == caffe_pb2.TRAIN)
            workspace = getattr(self.layers[i], "workspace_bytes", None)
            if workspace is not None:
                nbytes = int(workspace())
                totals["workspace"] += nbytes
                per_layer[name] += nbytes
            batches = getattr(self.layers[i], "prefetch_bytes", None)
            if batches is not None:
                nbytes = int(batches())
                totals["prefetch"] += nbytes
                per_layer[name] += nbytes
            scratch = getattr(self.layers[i], "shared_workspace_bytes", None)
            if scratch is not None and int(scratch()) > scratch_of[0]:
                scratch_of = (int(scratch()), name)
        if scratch_of[1] is not None:
            totals["workspace"] += scratch_of[0]
            per_layer[scratch_of[1]] += scratch_of[0]
        folding = getattr(self, "_split_folding", None)
        if folding is not None:
            totals["diff"] += folding.pool.nbytes
        shared = getattr(self, "_diff_pool", None)
        if shared is not None:
            totals["diff"] += shared.nbytes
        totals["total"] = (totals["data"] + totals["diff"] + totals["workspace"]
                           + totals["prefetch"])
        totals["layers"] = per_layer
        return totals

    def memory_summary(self, estimate=None):
        """One line: the total, its parts and the largest layer."""
        est = estimate or self.memory_estimate()
        parts = [("data", "data"), ("diff", "diff"), ("workspaces", "workspace")]
        if est.get("prefetch"):                   # only nets with data layers have it
            parts.append(("prefetch", "prefetch"))
        line = "%s (%s)" % (memory.format_bytes(est["total"]), ", ".join(
            "%s %s" % (word, memory.format_bytes(est[key])) for word, key in parts))
        if est["layers"]:
            name, nbytes = max(est["layers"].items(), key=lambda item: item[1])
            line += "; largest: layer %s, %s" % (name, memory.format_bytes(nbytes))
        return line

    def _check_memory(self):
        """Stop before allocating a net that cannot fit (see poseidon_caffe.memory)."""
        est = self.memory_estimate()
        self.memory_needed = est["total"]
        log.info("Memory required for blobs: %s", self.memory_summary(est))
        limit, has = memory.available_memory()
        if limit is None or est["total"] <= limit:
            return
        name, nbytes = max(est["layers"].items(), key=lambda item: item[1])
        raise NetMemoryError("net %s needs %s for blobs (largest: layer %s, %s); %s"
                             % (self.name or "(unnamed)", memory.format_bytes(est["total"]),
                                name, memory.format_bytes(nbytes), has))
