"""Backward planning: which layers and bottoms need backward (a path from a learnable
parameter, or a blob that needs a gradient, to a loss), and at which layer each parameter's
gradient is complete."""
from .. import log


class BackwardPlan:
    """Part of ``Net``: works out ``layer_need_backward`` and ``bottom_need_backward``."""

    def _plan_backward(self):
        """Which layers need backward: those on a path from a learnable parameter (or a blob that
        needs a gradient) to a loss, as in Caffe's Net::Init."""
        n = len(self.layers)
        self.layer_need_backward = [False] * n
        need_blob = [False] * len(self._blobs)
        param_id = {where: pid for pid, where in enumerate(self.param_layer_indices)}
        for i, layer in enumerate(self.layers):
            lp = self.param.layer[i]
            need = False
            for j, bid in enumerate(self.bottom_ids[i]):
                nb = need_blob[bid]
                if lp.propagate_down and not lp.propagate_down[j]:
                    nb = False
                self.bottom_need_backward[i][j] = nb
                need = need or nb
            for j in range(len(layer.blobs)):
                pid = param_id[(i, j)]
                if self.params_lr[self.learnable_param_ids[pid]] != 0:
                    need = True
            need = need and layer.has_backward()
            self.layer_need_backward[i] = need
            for bid in self.top_ids[i]:
                need_blob[bid] = need_blob[bid] or need

        under_loss, skip_backprop = set(), set()
        for i in range(n - 1, -1, -1):
            lp = self.param.layer[i]
            contributes = any(w for _, w in self.layer_loss_weights[i]) or any(
                self.blob_names[b] in under_loss for b in self.top_ids[i])
            skip_propagate = all(self.blob_names[b] in skip_backprop for b in self.top_ids[i])
            if self.layer_need_backward[i] and skip_propagate:
                self.layer_need_backward[i] = False
                self.bottom_need_backward[i] = [False] * len(self.bottom_ids[i])
            if not contributes:
                self.layer_need_backward[i] = False
            if self.layer_need_backward[i]:
                log.info("%s needs backward computation.", lp.name)
            else:
                log.info("%s does not need backward computation.", lp.name)
            for j, bid in enumerate(self.bottom_ids[i]):
                name = self.blob_names[bid]
                if contributes:
                    under_loss.add(name)
                else:
                    self.bottom_need_backward[i][j] = False
                if not self.bottom_need_backward[i][j]:
                    skip_backprop.add(name)

        if self.param.force_backward:
            for i, layer in enumerate(self.layers):
                if not layer.has_backward():
                    continue
                self.layer_need_backward[i] = True
                for j in range(len(self.bottom_ids[i])):
                    self.bottom_need_backward[i][j] = (self.bottom_need_backward[i][j]
                                                       or layer.allow_force_backward(j))
                layer.param_propagate_down = [True] * len(layer.blobs)
        # a bottom the layer never writes a gradient for gets none asked (the layer's and its
        # producer's need stay Caffe's): a Split folding it in or a shared diff would add
        # another blob's gradient where Caffe's never-written diff holds zeros
        for i, layer in enumerate(self.layers):
            for j in layer.gradient_free_bottoms:
                if j < len(self.bottom_need_backward[i]):
                    self.bottom_need_backward[i][j] = False

    def _learnable_param_finish_layers(self):
        """For each layer, the learnable params whose gradient is complete once backward has
        passed it: a shared param is complete at the earliest layer that uses it."""
        first_use = {}
        for pid, (layer_index, _) in enumerate(self.param_layer_indices):
            lid = self.learnable_param_ids[pid]
            first_use[lid] = min(first_use.get(lid, layer_index), layer_index)
        final_at = [[] for _ in self.layers]
        for lid, layer_index in sorted(first_use.items()):
            final_at[layer_index].append(lid)
        return final_at

    def learnable_params_final_at(self, layer_index):
        return self._learnable_final_at[layer_index]
