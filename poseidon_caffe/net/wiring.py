"""Wiring and sharing: each layer's bottoms and tops as blobs of the net (in place when a top
names its own bottom), its set-up, its loss weights, and its parameters with their specs
(sharing by name, lr_mult, decay_mult)."""
from .. import fillers, log
from ..blob import Blob
from ..layers.base import LayerError
from ..proto import caffe_pb2
from .errors import NetError, layer_failure, reraise_user_error


class Wiring:
    """Part of ``Net``: the graph of layers and blobs, and who owns which parameter."""

    def _append_top(self, layer_param, top_index, name, available):
        in_place = (top_index < len(layer_param.bottom) and layer_param.bottom[top_index] == name)
        if in_place:
            log.info("%s -> %s (in-place)", layer_param.name, name)
            index = self.blob_name_to_index[name]
        elif name in self.blob_name_to_index:
            raise NetError("Top blob %r produced by multiple sources (layer %r, top index %d)"
                           % (name, layer_param.name, top_index))
        else:
            log.info("%s -> %s", layer_param.name, name)
            index = len(self._blobs)
            self._blobs.append(Blob())
            self.blob_names.append(name)
            self.blob_name_to_index[name] = index
            self.blob_loss_weight_list.append(0.0)
        available.add(name)
        return index

    def _setup_layer(self, layer, layer_param, bottoms, tops):
        shapes = [b.shape for b in bottoms]
        try:
            layer.check_blob_counts(bottoms, tops)
            layer.setup(bottoms, tops)
            layer.reshape(bottoms, tops)
        except (LayerError, NetError, fillers.DeferredFillError):
            raise           # a deferred fill is named after its own layer by __init__
        except Exception as exc:
            reraise_user_error(layer_param.type, layer_param.name, "setup", exc)
            if isinstance(exc, MemoryError) or "array is too big" in str(exc):
                raise layer_failure(layer, "setup", exc) from exc
            if isinstance(exc, (ValueError, IndexError, TypeError, KeyError, ArithmeticError)):
                raise NetError("layer %r of type %s could not be set up for bottom shapes %s: %s"
                               % (layer_param.name, layer_param.type,
                                  [list(s) for s in shapes], exc)) from exc
            raise layer_failure(layer, "setup", exc) from exc

    def _loss_weights(self, layer, layer_param, num_tops):
        if layer_param.loss_weight:
            if len(layer_param.loss_weight) != num_tops:
                raise NetError("layer %r: loss_weight must be given either 0 or %d times "
                               "(once per top)" % (layer_param.name, num_tops))
            return list(layer_param.loss_weight)
        return [layer.default_loss_weight(j) for j in range(num_tops)]

    def _append_params(self, layer_id, layer, layer_param):
        num = len(layer.blobs)
        if len(layer_param.param) > num:
            raise NetError("layer %r has %d parameter blobs but %d param specs"
                           % (layer_param.name, num, len(layer_param.param)))
        for j in range(num):
            spec = layer_param.param[j] if j < len(layer_param.param) else caffe_pb2.ParamSpec()
            pid = len(self.params_list)
            name = spec.name
            self.param_display_names.append(name or str(pid))
            self.param_layer_indices.append((layer_id, j))
            if not name or name not in self._param_names_index:
                if name:
                    self._param_names_index[name] = pid
                self.param_owners.append(-1)
                self.params_list.append(layer.blobs[j])
                self.learnable_param_ids.append(len(self.learnable_params))
                self.learnable_params.append(layer.blobs[j])
                self.has_params_lr.append(spec.HasField("lr_mult"))
                self.has_params_decay.append(spec.HasField("decay_mult"))
                self.params_lr.append(spec.lr_mult)
                self.params_weight_decay.append(spec.decay_mult)
                layer.param_propagate_down[j] = spec.lr_mult != 0
                continue
            owner = self._param_names_index[name]
            owner_blob = self.params_list[owner]
            mine = layer.blobs[j]
            if spec.share_mode == caffe_pb2.ParamSpec.PERMISSIVE:
                if owner_blob.count != mine.count:
                    raise NetError("Cannot share param %r owned by layer %r with layer %r; count "
                                   "mismatch: owner has %s, sharer has %s"
                                   % (name, self.layer_names[self.param_layer_indices[owner][0]],
                                      layer_param.name, owner_blob.shape_string(),
                                      mine.shape_string()))
            elif owner_blob.shape != mine.shape:
                raise NetError("Cannot share param %r owned by layer %r with layer %r; shape "
                               "mismatch: owner has %s, sharer has %s"
                               % (name, self.layer_names[self.param_layer_indices[owner][0]],
                                  layer_param.name, owner_blob.shape_string(),
                                  mine.shape_string()))
            learnable = self.learnable_param_ids[owner]
            self.param_owners.append(owner)
            self.learnable_param_ids.append(learnable)
            if spec.HasField("lr_mult"):
                if self.has_params_lr[learnable] and self.params_lr[learnable] != spec.lr_mult:
                    raise NetError("Shared param %r has mismatched lr_mult (layer %r)"
                                   % (name, layer_param.name))
                self.has_params_lr[learnable] = True
                self.params_lr[learnable] = spec.lr_mult
            if spec.HasField("decay_mult"):
                if (self.has_params_decay[learnable]
                        and self.params_weight_decay[learnable] != spec.decay_mult):
                    raise NetError("Shared param %r has mismatched decay_mult (layer %r)"
                                   % (name, layer_param.name))
                self.has_params_decay[learnable] = True
                self.params_weight_decay[learnable] = spec.decay_mult
            # sharing the Blob object shares data and diff: both layers add into one gradient
            layer.blobs[j] = owner_blob
            layer.param_propagate_down[j] = self.params_lr[learnable] != 0

    def _layer_of_param(self, blob):
        for name, layer in zip(self.layer_names, self.layers):
            if any(b is blob for b in layer.blobs):
                return name
        return "?"

    # -- what the distributed engine reads ------------------------------------------------------
    def param_uses(self):
        """For each learnable parameter (an index into ``learnable_params``), the places that
        use it as (layer index, index into that layer's blobs), in net order: one place, or
        several when layers share the parameter by name."""
        uses = [[] for _ in self.learnable_params]
        for pid, place in enumerate(self.param_layer_indices):
            uses[self.learnable_param_ids[pid]].append(place)
        return uses

    def layer_blobs(self, layer_index):
        """(bottom blobs, top blobs) a layer runs with: the net's own Blob objects."""
        return list(self.bottom_vecs[layer_index]), list(self.top_vecs[layer_index])
