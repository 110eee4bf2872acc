"""Execution: forward and backward over ranges of layers, with the distributed engine's hooks
(grad-ready, before-forward, layer timing) and pycaffe's per-layer callbacks."""
import time

import numpy as np

from ..layers.base import LayerError
from .errors import (NetError, layer_failure, raise_if_device_failure, raise_if_out_of_memory,
                     reraise_user_error)


def _summed(values):
    """A loss top's sum in float64; a scalar's read as it is (numpy's sum of one value costs
    5 us, a tenth of a SoftmaxWithLoss forward)."""
    if values.size == 1:
        return float(values.reshape(-1)[0])
    return float(np.sum(values, dtype=np.float64))


class Execution:
    """Part of ``Net``: running its layers."""

    _split_folding = None     # a SplitFolding where the net has one (see split_folding)

    # -- hooks for the distributed engine (a plain run pays nothing) ---------------------------
    def set_grad_ready_hook(self, fn):
        """``fn(layer_index)`` runs in backward once that layer's parameter gradients are final
        (see ``learnable_params_final_at``)."""
        self._grad_ready_hook = fn

    def set_before_forward_hook(self, fn):
        """``fn(layer_index)`` runs before each layer that has parameters computes forward."""
        self._before_forward_hook = fn

    def set_layer_timing_hook(self, fn):
        """``fn(kind, layer_index, start, end)`` runs after every layer's forward or backward
        (kind "forward" / "backward", times from time.perf_counter), for timelines."""
        self._layer_timing_hook = fn

    # -- running -------------------------------------------------------------------------------
    def forward_from_to(self, start=0, end=None, read_loss=True):
        """Forward over layers start..end; returns the weighted sum of the loss tops, or None
        with ``read_loss`` False (on a device the losses then stay there: ``loss_tops``)."""
        end = len(self.layers) - 1 if end is None else end
        loss = 0.0 if read_loss else None
        hook = self._before_forward_hook
        timing = self._layer_timing_hook
        debug = self.param.debug_info
        before, after = (self._layer_callbacks["before_forward"],
                         self._layer_callbacks["after_forward"])
        for i in range(start, end + 1):
            for callback in before:
                callback(i)
            layer = self.layers[i]
            if hook is not None and layer.blobs:
                hook(i)
            bottoms, tops = self.bottom_vecs[i], self.top_vecs[i]
            try:
                layer.reshape(bottoms, tops)
            except (LayerError, NetError):
                raise
            except Exception as exc:
                reraise_user_error(layer.type, layer.name, "reshape", exc)
                raise_if_device_failure(layer, "reshape", exc)
                if isinstance(exc, MemoryError) or "array is too big" in str(exc):
                    raise layer_failure(layer, "reshape", exc) from exc
                if isinstance(exc, (ValueError, IndexError, TypeError)):
                    raise NetError("layer %r of type %s cannot take bottom shapes %s: %s"
                                   % (layer.name, layer.type, [list(b.shape) for b in bottoms],
                                      exc)) from exc
                raise
            try:
                if timing is None:
                    layer.forward(bottoms, tops)
                else:
                    start_time = time.perf_counter()
                    layer.forward(bottoms, tops)
                    timing("forward", i, start_time, time.perf_counter())
            except (MemoryError, ValueError) as exc:
                raise_if_out_of_memory(layer, "forward", exc)
                raise
            except Exception as exc:
                raise_if_device_failure(layer, "forward", exc)
                raise
            if read_loss:
                for j, weight in self.layer_loss_weights[i]:
                    # read only: on a device the top stays where the layer wrote it
                    loss += weight * _summed(tops[j].host_data)
            if debug:
                self._forward_debug_info(i)
            for callback in after:
                callback(i)
        return loss

    def backward_from_to(self, start=None, end=0, seeded=()):
        """Backward over layers start..end (descending). A loss top's diff is seeded with its
        loss weight, except for the blob indices in ``seeded``, whose diffs the caller set."""
        start = len(self.layers) - 1 if start is None else start
        hook = self._grad_ready_hook
        timing = self._layer_timing_hook
        folding = self._split_folding
        debug = self.param.debug_info
        before, after = (self._layer_callbacks["before_backward"],
                         self._layer_callbacks["after_backward"])
        for i in range(start, end - 1, -1):
            # as Caffe, the callbacks see every layer of the range, computing backward or not
            for callback in before:
                callback(i)
            if not self.layer_need_backward[i]:
                for callback in after:
                    callback(i)
                continue
            tops = self.top_vecs[i]
            for j, weight in self.layer_loss_weights[i]:
                if self.top_ids[i][j] not in seeded:
                    tops[j].diff[...] = weight
            start_time = time.perf_counter() if timing is not None else 0.0
            if folding is not None and folding.folds_split(i):
                folding.finish_split(i)     # its consumers have added their gradients
            else:
                if folding is not None:
                    folding.before_backward(i, self.bottom_vecs[i])
                try:
                    self.layers[i].backward(tops, self.bottom_need_backward[i],
                                            self.bottom_vecs[i])
                except (MemoryError, ValueError) as exc:
                    raise_if_out_of_memory(self.layers[i], "backward", exc)
                    raise
                except Exception as exc:
                    raise_if_device_failure(self.layers[i], "backward", exc)
                    raise
                if folding is not None:
                    folding.after_backward(i, self.bottom_vecs[i])
            if timing is not None:
                timing("backward", i, start_time, time.perf_counter())
            if debug:
                self._backward_debug_info(i)
            if hook is not None and self._learnable_final_at[i]:
                hook(i)
            for callback in after:
                callback(i)
        if debug:
            self._update_debug_summary()

    def forward_prefilled(self):
        return self.forward_from_to(0, len(self.layers) - 1)

    def forward_backward(self, read_loss=True):
        loss = self.forward_from_to(read_loss=read_loss)
        self.backward_from_to()
        return loss

    def loss_tops(self):
        """[(blob, loss weight)] of every loss top, in the order forward adds them up."""
        return [(self.top_vecs[i][j], weight) for i in range(len(self.layers))
                for j, weight in self.layer_loss_weights[i]]

    def reshape(self):
        for i, layer in enumerate(self.layers):
            layer.reshape(self.bottom_vecs[i], self.top_vecs[i])

    def clear_param_diffs(self):
        for blob in self.learnable_params:
            blob.zero_diff()
