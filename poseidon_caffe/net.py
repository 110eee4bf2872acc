"""Net: a NetParameter turned into a graph of layers, with Caffe's semantics.

Building a net (``Net.__init__``) follows Caffe's Net::Init step by step: rules filter the layers
for the net's phase, level and stages; split layers are inserted where one top feeds several
bottoms; each layer is created, wired to its bottom and top blobs (in place when a top names its
own bottom), set up and shaped; loss weights and parameter specs (sharing, lr_mult, decay_mult)
are recorded; finally, which layers and blobs need backward is worked out from the losses.
"""
import time
from collections import OrderedDict

import numpy as np

from . import fillers, log, memory
from .blob import Blob
from .layers import create_layer
from .layers.base import LayerError
from .proto import caffe_pb2
from .proto_values import describe_non_finite, non_finite_fields

TRAIN = caffe_pb2.TRAIN
TEST = caffe_pb2.TEST
LAYER_CALLBACK_KINDS = ("before_forward", "after_forward", "before_backward", "after_backward")


class NetError(ValueError):
    """A net that cannot be built as written; the message names the layer and blob."""


class NetMemoryError(NetError):
    """A net that does not fit in memory, found before allocating or where an allocation
    failed; the message names the net or the layer and the amounts."""


def _is_project_error(exc):
    return type(exc).__module__.split(".")[0] == __name__.split(".")[0]


def _reraise_user_error(layer_type, layer_name, what, exc):
    """A Python layer's own exception is the user's code speaking: it keeps its type, as
    pycaffe gives it, with a note naming the layer (out of memory is still the project's)."""
    if layer_type != "Python" or isinstance(exc, MemoryError) or _is_project_error(exc):
        return
    if hasattr(exc, "add_note"):
        exc.add_note("in %s of Python layer %r" % (what, layer_name))
    raise exc


def _raise_if_out_of_memory(layer, what, exc):
    if isinstance(exc, MemoryError) or "array is too big" in str(exc):
        raise _layer_failure(layer, what, exc) from exc


def _layer_failure(layer, what, exc):
    """A failure inside one layer as the project's error naming it (project errors pass)."""
    if _is_project_error(exc):
        return exc
    if isinstance(exc, MemoryError) or "array is too big" in str(exc):
        # numpy says "array is too big" when a shape's byte count overflows
        return NetMemoryError("layer %r of type %s: out of memory in %s (%s)"
                              % (layer.name, layer.type, what, str(exc) or "MemoryError"))
    return NetError("layer %r of type %s failed in %s: %s: %s"
                    % (layer.name, layer.type, what, type(exc).__name__, exc))


# -- rules and filtering ----------------------------------------------------------------------

def state_meets_rule(state, rule):
    """Caffe's StateMeetsRule: every condition the rule sets must hold for the state."""
    if rule.HasField("phase") and rule.phase != state.phase:
        return False
    if rule.HasField("min_level") and state.level < rule.min_level:
        return False
    if rule.HasField("max_level") and state.level > rule.max_level:
        return False
    stages = set(state.stage)
    if any(s not in stages for s in rule.stage):
        return False
    if any(s in stages for s in rule.not_stage):
        return False
    return True


def filter_net(net_param, state):
    """A copy of ``net_param`` holding only the layers that ``state`` includes."""
    filtered = caffe_pb2.NetParameter()
    filtered.CopyFrom(net_param)
    del filtered.layer[:]
    for layer in net_param.layer:
        if layer.include and layer.exclude:
            raise NetError("layer %r specifies both include and exclude rules; give one or the "
                           "other" % layer.name)
        if layer.include:
            keep = any(state_meets_rule(state, r) for r in layer.include)
        else:
            keep = not any(state_meets_rule(state, r) for r in layer.exclude)
        if keep:
            filtered.layer.add().CopyFrom(layer)
    return filtered


# -- split insertion --------------------------------------------------------------------------

def split_layer_name(blob_name, layer_name, top_index):
    return "%s_%s_%d_split" % (blob_name, layer_name, top_index)


def split_blob_name(blob_name, layer_name, top_index, split_index):
    return "%s_%s_%d_split_%d" % (blob_name, layer_name, top_index, split_index)


def insert_splits(net_param):
    """Caffe's InsertSplits: a top used by several bottoms (a loss counts as one use) feeds a
    Split layer whose outputs go one to each user, so that their gradients are summed."""
    producer = {}                      # blob name -> (layer index, top index) of latest producer
    uses = {}                          # (layer index, top index) -> number of consumers
    consumer_of = {}                   # (layer index, bottom index) -> producing (layer, top)
    for i, layer in enumerate(net_param.layer):
        for j, name in enumerate(layer.bottom):
            if name not in producer:
                raise NetError("Unknown bottom blob %r (layer %r, bottom index %d)"
                               % (name, layer.name, j))
            key = producer[name]
            consumer_of[(i, j)] = key
            uses[key] = uses.get(key, 0) + 1
        for j, name in enumerate(layer.top):
            producer[name] = (i, j)
    loss_weight_of = {}
    for i, layer in enumerate(net_param.layer):
        for j, weight in enumerate(layer.loss_weight):
            if weight:
                loss_weight_of[(i, j)] = weight
                uses[(i, j)] = uses.get((i, j), 0) + 1

    out = caffe_pb2.NetParameter()
    out.CopyFrom(net_param)
    del out.layer[:]
    split_taken = {}                   # (layer, top) -> next split output to hand out
    for i, layer in enumerate(net_param.layer):
        new_layer = out.layer.add()
        new_layer.CopyFrom(layer)
        for j, name in enumerate(layer.bottom):
            key = consumer_of[(i, j)]
            if uses.get(key, 0) > 1:
                k = split_taken.get(key, 0)
                split_taken[key] = k + 1
                src = net_param.layer[key[0]]
                new_layer.bottom[j] = split_blob_name(name, src.name, key[1], k)
        for j, name in enumerate(layer.top):
            count = uses.get((i, j), 0)
            if count <= 1:
                continue
            split = out.layer.add()
            split.name = split_layer_name(name, layer.name, j)
            split.type = "Split"
            split.bottom.append(name)
            for k in range(count):
                split.top.append(split_blob_name(name, layer.name, j, k))
            weight = loss_weight_of.get((i, j))
            if weight:
                # the loss use takes the first split output, as in Caffe
                split.loss_weight.append(weight)
                split.loss_weight.extend([0.0] * (count - 1))
                split_taken[(i, j)] = 1
                del new_layer.loss_weight[:]
                for jj in range(len(layer.top)):
                    new_layer.loss_weight.append(0.0 if jj == j
                                                 else loss_weight_of.get((i, jj), 0.0))
    return out


def _batch_part(value, valid):
    """The first ``valid`` items of a batch output; a scalar (a loss) is kept once per batch."""
    return value[None].copy() if value.ndim == 0 else value[:valid].copy()


# -- the net ----------------------------------------------------------------------------------

class Net:
    def __init__(self, network, phase=None, level=None, stages=(), weights=None):
        # pycaffe's call forms: Net(file, phase), Net(file, weights, phase),
        # Net(file, phase, level=, stages=, weights=)
        if isinstance(phase, str):
            if level is None:
                raise NetError("Net(%r, %r) needs a phase after the weights: "
                               "Net(file, weights, caffe.TEST)" % (network, phase))
            weights, phase, level = phase, level, 0
        if phase is None:
            raise NetError("Net needs a phase (TRAIN or TEST)")
        if isinstance(phase, bool) or phase not in (TRAIN, TEST):
            raise NetError("Net phase must be caffe.TRAIN or caffe.TEST, not %r" % (phase,))
        level = 0 if level is None else level
        self.source = network if isinstance(network, str) else None
        net_param = self._load_param(network)
        self.phase = int(phase)
        state = caffe_pb2.NetState()
        state.CopyFrom(net_param.state)
        state.phase = self.phase
        state.level = int(level)
        # as Caffe's Net(file, phase, level, stages): the given stages join those the
        # prototxt's state already names
        state.stage.extend(s for s in stages if s not in state.stage)
        try:
            # weights are drawn once the net is known to fit (see _check_memory)
            with fillers.deferred():
                self._init(net_param, state)
        except fillers.DeferredFillError as exc:
            raise NetError("%slayer %r: %s" % ("%s: " % self.source if self.source else "",
                                               self._layer_of_param(exc.blob), exc)) from exc
        except (NetError, LayerError) as exc:
            if self.source and self.source not in str(exc):
                # named after the file, as the readers name theirs
                raise type(exc)("%s: %s" % (self.source, exc)) from exc
            raise
        if weights:
            paths = [p for p in (weights.split(",") if isinstance(weights, str) else weights)
                     if p]
            copied = []
            for path in paths:
                copied += self.copy_from(path, report=False)
            self.warn_layers_without_weights(copied, paths)

    @staticmethod
    def _load_param(network):
        if isinstance(network, caffe_pb2.NetParameter):
            param = caffe_pb2.NetParameter()
            param.CopyFrom(network)
            from .upgrade import upgrade_net
            upgrade_net(param)
            return param
        from .io import read_net_param
        return read_net_param(network)

    # -- building ------------------------------------------------------------------------------
    def _init(self, net_param, state):
        self.name = net_param.name
        self.state = state
        filtered = filter_net(net_param, state)
        self.param = insert_splits(filtered)
        log.info("Initializing net from parameters: name %r, phase %s, %d layers",
                 self.name, caffe_pb2.Phase.Name(self.phase), len(self.param.layer))

        self.layers = []
        self.layer_names = []
        self.bottom_vecs, self.top_vecs = [], []
        self.bottom_ids, self.top_ids = [], []
        self.blob_names, self._blobs = [], []
        self.blob_loss_weight_list = []
        self.blob_name_to_index = {}
        self.input_blob_indices = []
        self.bottom_need_backward = []
        self.layer_loss_weights = []       # per layer: list of (top index, weight)
        self.params_list = []              # every param blob of every layer, in order
        self.param_display_names = []
        self.param_layer_indices = []      # (layer index, blob index) of each entry above
        self.param_owners = []             # -1 = owns, else index into params_list
        self.learnable_params = []
        self.learnable_param_ids = []      # params_list index -> learnable index
        self.params_lr, self.params_weight_decay = [], []
        self.has_params_lr, self.has_params_decay = [], []
        self._param_names_index = {}
        self._grad_ready_hook = None
        self._before_forward_hook = None
        self._layer_timing_hook = None
        # pycaffe's per-layer callbacks (Net.before_forward etc.): kind -> [fn(layer index)]
        self._layer_callbacks = {kind: [] for kind in LAYER_CALLBACK_KINDS}

        available = set()
        top_values = 0
        for layer_id, layer_param in enumerate(self.param.layer):
            if not layer_param.HasField("phase"):
                layer_param.phase = self.phase
            bad = non_finite_fields(layer_param, skip=("blobs",))
            if bad:
                raise NetError("layer %r of type %s: values must be finite numbers: %s"
                               % (layer_param.name, layer_param.type, describe_non_finite(bad)))
            try:
                layer = create_layer(layer_param, self.phase)
            except Exception as exc:
                if isinstance(exc, (NetError, LayerError)):
                    raise           # these name their layer already
                raise NetError("layer %r of type %s cannot be created: %s: %s"
                               % (layer_param.name, layer_param.type, type(exc).__name__,
                                  exc)) from exc
            self.layers.append(layer)
            self.layer_names.append(layer_param.name)
            log.info("Creating Layer %s", layer_param.name)
            if layer_param.propagate_down and len(layer_param.propagate_down) != len(
                    layer_param.bottom):
                raise NetError("layer %r: propagate_down must be given either 0 or %d times "
                               "(once per bottom)" % (layer_param.name, len(layer_param.bottom)))
            bottoms, bottom_ids = [], []
            for j, name in enumerate(layer_param.bottom):
                if name not in available:
                    raise NetError("Unknown bottom blob %r (layer %r, bottom index %d)"
                                   % (name, layer_param.name, j))
                index = self.blob_name_to_index[name]
                available.discard(name)
                bottoms.append(self._blobs[index])
                bottom_ids.append(index)
                log.info("%s <- %s", layer_param.name, name)
            tops, top_ids = [], []
            for j, name in enumerate(layer_param.top):
                index = self._append_top(layer_param, j, name, available)
                tops.append(self._blobs[index])
                top_ids.append(index)
                if layer_param.type == "Input":
                    self.input_blob_indices.append(index)
            wanted = max(layer.exact_tops or 0, layer.min_tops or 0)
            if layer.auto_tops:
                while len(tops) < wanted:
                    name = "(automatic)%s_%d" % (layer_param.name, len(tops))
                    index = self._append_top(layer_param, len(tops), name, available)
                    tops.append(self._blobs[index])
                    top_ids.append(index)
            self.bottom_vecs.append(bottoms)
            self.bottom_ids.append(bottom_ids)
            self.top_vecs.append(tops)
            self.top_ids.append(top_ids)
            self.bottom_need_backward.append([False] * len(bottoms))

            log.info("Setting up %s", layer_param.name)
            self._setup_layer(layer, layer_param, bottoms, tops)
            weights = self._loss_weights(layer, layer_param, len(tops))
            self.layer_loss_weights.append([(j, w) for j, w in enumerate(weights) if w])
            for j, top in enumerate(tops):
                self.blob_loss_weight_list[top_ids[j]] = weights[j]
                log.info("Top shape: %s", top.shape_string())
                if weights[j]:
                    log.info("    with loss weight %g", weights[j])
                top_values += top.count
            self._append_params(layer_id, layer, layer_param)
        log.info("Memory required for data: %d", top_values * 4)
        self._plan_backward()
        self._check_memory()
        self.output_blob_indices = [self.blob_name_to_index[n] for n in sorted(
            available, key=lambda n: self.blob_name_to_index[n])]
        for index in self.output_blob_indices:
            log.info("This network produces output %s", self.blob_names[index])
        self._learnable_final_at = self._learnable_param_finish_layers()
        log.info("Network initialization done.")

    def _layer_of_param(self, blob):
        for name, layer in zip(self.layer_names, self.layers):
            if any(b is blob for b in layer.blobs):
                return name
        return "?"

    # -- memory ----------------------------------------------------------------------------
    def memory_estimate(self):
        """Bytes the net's blobs need once running: {"data", "diff", "workspace", "total",
        "layers": {layer name: bytes}}. Each storage counts once (in-place tops, shared data,
        shared parameters), under the layer that makes it; a blob gets a diff where backward
        writes one; parameters have diffs in a TRAIN net; workspaces are those the layers'
        plans report (im2col columns and padded inputs)."""
        needs_diff = set()
        for i in range(len(self.layers)):
            if self.layer_need_backward[i]:
                needs_diff.update(self.top_ids[i])
            needs_diff.update(bid for j, bid in enumerate(self.bottom_ids[i])
                              if self.bottom_need_backward[i][j])
        per_layer = OrderedDict((name, 0) for name in self.layer_names)
        totals = {"data": 0, "diff": 0, "workspace": 0}
        counted = set()

        def count(layer_name, blob, with_diff):
            if id(blob) in counted:
                return
            counted.add(id(blob))
            data = 0 if blob.shares_data else blob.nbytes
            diff = blob.nbytes if with_diff and not blob.shares_diff else 0
            totals["data"] += data
            totals["diff"] += diff
            per_layer[layer_name] += data + diff

        for i, name in enumerate(self.layer_names):
            for bid in self.top_ids[i]:
                count(name, self._blobs[bid], bid in needs_diff)
            for blob in self.layers[i].blobs:
                count(name, blob, self.phase == TRAIN)
            workspace = getattr(self.layers[i], "workspace_bytes", None)
            if workspace is not None:
                nbytes = int(workspace())
                totals["workspace"] += nbytes
                per_layer[name] += nbytes
        totals["total"] = totals["data"] + totals["diff"] + totals["workspace"]
        totals["layers"] = per_layer
        return totals

    def memory_summary(self, estimate=None):
        """One line: the total, its parts and the largest layer."""
        est = estimate or self.memory_estimate()
        line = "%s (data %s, diff %s, workspaces %s)" % (
            memory.format_bytes(est["total"]), memory.format_bytes(est["data"]),
            memory.format_bytes(est["diff"]), memory.format_bytes(est["workspace"]))
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
            _reraise_user_error(layer_param.type, layer_param.name, "setup", exc)
            if isinstance(exc, MemoryError) or "array is too big" in str(exc):
                raise _layer_failure(layer, "setup", exc) from exc
            if isinstance(exc, (ValueError, IndexError, TypeError, KeyError, ArithmeticError)):
                raise NetError("layer %r of type %s could not be set up for bottom shapes %s: %s"
                               % (layer_param.name, layer_param.type,
                                  [list(s) for s in shapes], exc)) from exc
            raise _layer_failure(layer, "setup", exc) from exc

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

    # -- hooks for the distributed engine ------------------------------------------------------
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

    def learnable_params_final_at(self, layer_index):
        return self._learnable_final_at[layer_index]

    # -- running -------------------------------------------------------------------------------
    def forward_from_to(self, start=0, end=None):
        end = len(self.layers) - 1 if end is None else end
        loss = 0.0
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
                _reraise_user_error(layer.type, layer.name, "reshape", exc)
                if isinstance(exc, MemoryError) or "array is too big" in str(exc):
                    raise _layer_failure(layer, "reshape", exc) from exc
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
                _raise_if_out_of_memory(layer, "forward", exc)
                raise
            for j, weight in self.layer_loss_weights[i]:
                loss += weight * float(np.sum(tops[j].data, dtype=np.float64))
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
            try:
                if timing is None:
                    self.layers[i].backward(tops, self.bottom_need_backward[i],
                                            self.bottom_vecs[i])
                else:
                    start_time = time.perf_counter()
                    self.layers[i].backward(tops, self.bottom_need_backward[i],
                                            self.bottom_vecs[i])
                    timing("backward", i, start_time, time.perf_counter())
            except (MemoryError, ValueError) as exc:
                _raise_if_out_of_memory(self.layers[i], "backward", exc)
                raise
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

    def forward_backward(self):
        loss = self.forward_from_to()
        self.backward_from_to()
        return loss

    def reshape(self):
        for i, layer in enumerate(self.layers):
            layer.reshape(self.bottom_vecs[i], self.top_vecs[i])

    def clear_param_diffs(self):
        for blob in self.learnable_params:
            blob.diff[...] = 0

    # -- debug info, as Caffe's debug_info logs it -------------------------------------------
    @staticmethod
    def _mean_abs(array):
        return float(np.abs(array).mean()) if array.size else 0.0

    def _forward_debug_info(self, i):
        for bid in self.top_ids[i]:
            log.info("    [Forward] Layer %s, top blob %s data: %g", self.layer_names[i],
                     self.blob_names[bid], self._mean_abs(self._blobs[bid].data))
        for j, blob in enumerate(self.layers[i].blobs):
            log.info("    [Forward] Layer %s, param blob %d data: %g", self.layer_names[i], j,
                     self._mean_abs(blob.data))

    def _backward_debug_info(self, i):
        for j, bid in enumerate(self.bottom_ids[i]):
            if self.bottom_need_backward[i][j]:
                log.info("    [Backward] Layer %s, bottom blob %s diff: %g", self.layer_names[i],
                         self.blob_names[bid], self._mean_abs(self._blobs[bid].diff))
        for j, blob in enumerate(self.layers[i].blobs):
            if self.layers[i].param_propagate_down[j]:
                log.info("    [Backward] Layer %s, param blob %d diff: %g",
                         self.layer_names[i], j, self._mean_abs(blob.diff))

    def _update_debug_summary(self):
        data = sum(float(np.abs(b.data).sum()) for b in self.learnable_params)
        diff = sum(float(np.abs(b.diff).sum()) for b in self.learnable_params)
        log.info("    [Backward] All net params (data, diff): L1 norm = (%g, %g)", data, diff)

    # -- weights in and out --------------------------------------------------------------------
    def copy_trained_layers_from(self, source, report=True, require_match=True):
        """Copy parameters layer by layer, by name, from a NetParameter or a .caffemodel path
        (Caffe's CopyTrainedLayersFrom, with its messages). Returns the names of the layers
        that received parameters. A source that gives no parameter to a net that has some is
        an error naming it (``require_match``); with ``report``, the layers left without
        weights are named in one warning."""
        from .io import blobproto_to_array, read_net_weights
        if isinstance(source, str):
            source_name = source
            source, arrays = read_net_weights(source)
        else:
            source_name = "the given NetParameter"
            arrays = {l.name: [blobproto_to_array(b) for b in l.blobs] for l in source.layer}
        by_name = {name: i for i, name in enumerate(self.layer_names)}
        copied = []
        for src in source.layer:
            if src.name not in by_name:
                log.info("Ignoring source layer %s", src.name)
                continue
            target = self.layers[by_name[src.name]]
            log.info("Copying source layer %s Type:%s #blobs=%d", src.name, src.type,
                     len(src.blobs))
            if len(src.blobs) != len(target.blobs):
                raise NetError("Incompatible number of blobs for layer %s: the source %s has %d, "
                               "the net has %d" % (src.name, source_name, len(src.blobs),
                                                   len(target.blobs)))
            for j, (blob_proto, array) in enumerate(zip(src.blobs, arrays.get(src.name, []))):
                blob = target.blobs[j]
                if array.shape != blob.shape:
                    # a legacy (num, channels, height, width) blob matches when it is the
                    # target's shape padded with leading 1s, as Caffe's ShapeEquals
                    legacy_ok = (not blob_proto.shape.dim and blob.num_axes <= 4 and
                                 array.shape == (1,) * (4 - blob.num_axes) + blob.shape)
                    if not legacy_ok:
                        raise NetError(
                            "Cannot copy param %d weights from layer '%s'; shape mismatch.  "
                            "Source param shape is %s (%d); target param shape is %s. To learn "
                            "this layer's parameters from scratch rather than copying from a "
                            "saved net, rename the layer." % (
                                j, src.name, " ".join(map(str, array.shape)), array.size,
                                blob.shape_string()))
                blob.data[...] = array.reshape(blob.shape)
            if target.blobs:
                copied.append(src.name)
        if require_match:
            self.check_weights_matched(copied, source_name,
                                       [l.name for l in source.layer if l.blobs])
        if report:
            self.warn_layers_without_weights(copied, [source_name])
        return copied

    def layers_needing_weights(self):
        """Names of the layers that own at least one parameter (a layer whose parameters are
        all shared from another layer takes its weights through that layer)."""
        names = []
        for pid, (layer_index, _) in enumerate(self.param_layer_indices):
            name = self.layer_names[layer_index]
            if self.param_owners[pid] == -1 and name not in names:
                names.append(name)
        return names

    def check_weights_matched(self, copied, source_name, source_layers):
        """A weights source that copied nothing into a net with parameters is almost always the
        wrong file (or the wrong net): say so instead of training or scoring random weights."""
        needing = self.layers_needing_weights()
        if copied or not needing:
            return
        shown = ", ".join(source_layers[:8]) + (", ..." if len(source_layers) > 8 else "")
        raise NetError("%s: no parameter copied into net %r: none of the file's layers with "
                       "parameters (%s) is a layer of the net with parameters (%s)"
                       % (source_name, self.name, shown or "none",
                          ", ".join(needing[:8]) + (", ..." if len(needing) > 8 else "")))

    def warn_layers_without_weights(self, copied, source_names, skip=()):
        """One warning naming every layer with parameters that no weights source filled."""
        done = set(copied) | set(skip)
        missing = [name for name in self.layers_needing_weights() if name not in done]
        if missing:
            log.warning("%d layer(s) with parameters got no weights from %s and keep their "
                        "initial values: %s", len(missing), ", ".join(source_names),
                        ", ".join(missing))
        return missing

    copy_from = copy_trained_layers_from

    def share_trained_layers_with(self, other):
        """Make this net's parameters the same storage as ``other``'s, layer by layer by name
        (test nets see the training net's weights without copying them)."""
        by_name = {name: i for i, name in enumerate(other.layer_names)}
        for i, name in enumerate(self.layer_names):
            if name not in by_name:
                continue
            source = other.layers[by_name[name]]
            target = self.layers[i]
            if len(source.blobs) != len(target.blobs):
                raise NetError("Incompatible number of blobs for layer %s" % name)
            for j, blob in enumerate(source.blobs):
                if blob.shape != target.blobs[j].shape:
                    raise NetError("Cannot share param %d weights from layer '%s'; shape "
                                   "mismatch: %s vs %s" % (j, name, blob.shape_string(),
                                                           target.blobs[j].shape_string()))
                target.blobs[j].share_data(blob)

    share_with = share_trained_layers_with

    def to_proto(self, write_diff=False):
        from .io import fill_blobproto
        out = caffe_pb2.NetParameter()
        out.CopyFrom(self.param)
        out.ClearField("layer")
        out.state.CopyFrom(self.state)
        for layer, layer_param in zip(self.layers, self.param.layer):
            lp = out.layer.add()
            lp.CopyFrom(layer_param)
            del lp.blobs[:]
            for blob in layer.blobs:
                fill_blobproto(lp.blobs.add(), blob.data, blob.diff if write_diff else None)
        return out

    def save(self, path, write_diff=False):
        """Write the net and its weights as a .caffemodel (atomically)."""
        from .io import write_net_binary, write_net_weights
        if write_diff:
            write_net_binary(self.to_proto(write_diff=True), path)
            return
        structure = caffe_pb2.NetParameter()
        structure.CopyFrom(self.param)
        structure.state.CopyFrom(self.state)
        for layer_param in structure.layer:
            del layer_param.blobs[:]
        weights = {name: [b.data for b in layer.blobs]
                   for name, layer in zip(self.layer_names, self.layers) if layer.blobs}
        write_net_weights(structure, weights, path)

    # -- pycaffe's view --------------------------------------------------------------------
    @property
    def blobs(self):
        return OrderedDict((n, b) for n, b in zip(self.blob_names, self._blobs))

    @property
    def blob_loss_weights(self):
        return OrderedDict(zip(self.blob_names, self.blob_loss_weight_list))

    @property
    def params(self):
        return OrderedDict((name, layer.blobs) for name, layer in zip(self.layer_names,
                                                                       self.layers)
                           if layer.blobs)

    @property
    def layer_dict(self):
        return OrderedDict(zip(self.layer_names, self.layers))

    @property
    def inputs(self):
        return [self.blob_names[i] for i in self.input_blob_indices]

    @property
    def outputs(self):
        return [self.blob_names[i] for i in self.output_blob_indices]

    @property
    def output_blobs(self):
        return [self._blobs[i] for i in self.output_blob_indices]

    @property
    def input_blobs(self):
        return [self._blobs[i] for i in self.input_blob_indices]

    @property
    def top_names(self):
        return OrderedDict((n, [self.blob_names[b] for b in ids])
                           for n, ids in zip(self.layer_names, self.top_ids))

    @property
    def bottom_names(self):
        return OrderedDict((n, [self.blob_names[b] for b in ids])
                           for n, ids in zip(self.layer_names, self.bottom_ids))

    def _layer_index(self, name, what):
        try:
            return self.layer_names.index(name)
        except ValueError:
            raise NetError("%s layer %r is not in net %r" % (what, name, self.name)) from None

    def forward(self, blobs=None, start=None, end=None, **kwargs):
        """pycaffe's Net.forward: set inputs from keyword arrays, run, return the outputs."""
        if blobs is None:
            blobs = []
        start_ind = 0 if start is None else self._layer_index(start, "start")
        if end is not None:
            end_ind = self._layer_index(end, "end")
            outputs = set(self.top_names[end] + list(blobs))
        else:
            end_ind = len(self.layers) - 1
            outputs = set(self.outputs + list(blobs))
        if kwargs:
            if set(kwargs) != set(self.inputs):
                raise NetError("Input blob arguments do not match net inputs: given %s, the net "
                               "takes %s" % (sorted(kwargs), self.inputs))
            for name, array in kwargs.items():
                array = np.asarray(array)
                blob = self.blobs[name]
                if array.shape[:1] != blob.shape[:1]:
                    raise NetError("Input %r is not batch sized: got shape %s, blob is %s"
                                   % (name, array.shape, blob.shape))
                blob.data[...] = array
        self.forward_from_to(start_ind, end_ind)
        named = self.blobs
        return {out: named[out].data for out in outputs}

    def backward(self, diffs=None, start=None, end=None, **kwargs):
        """pycaffe's Net.backward: seed output diffs from keyword arrays, run, return the input
        diffs (and any blobs named in ``diffs``)."""
        if diffs is None:
            diffs = []
        start_ind = len(self.layers) - 1 if start is None else self._layer_index(start, "start")
        if end is not None:
            end_ind = self._layer_index(end, "end")
            outputs = set(self.bottom_names[end] + list(diffs))
        else:
            end_ind = 0
            outputs = set(self.inputs + list(diffs))
        if kwargs:
            if set(kwargs) != set(self.outputs):
                raise NetError("Top diff arguments do not match net outputs: given %s, the net "
                               "has %s" % (sorted(kwargs), self.outputs))
            for name, array in kwargs.items():
                array = np.asarray(array)
                blob = self.blobs[name]
                if array.shape[:1] != blob.shape[:1]:
                    raise NetError("Diff %r is not batch sized: got shape %s, blob is %s"
                                   % (name, array.shape, blob.shape))
                blob.diff[...] = array
        self.backward_from_to(start_ind, end_ind,
                              seeded={self.blob_name_to_index[name] for name in kwargs})
        named = self.blobs
        return {out: named[out].diff for out in outputs}

    def _batches(self, arrays):
        num = len(next(iter(arrays.values()))) if arrays else 0
        batch = self._blobs[self.input_blob_indices[0]].shape[0] if self.input_blob_indices \
            else 1
        for b in range(0, num, batch):
            chunk = {}
            for name, array in arrays.items():
                part = np.asarray(array[b:b + batch])
                if len(part) < batch:
                    pad = np.zeros((batch - len(part),) + part.shape[1:], part.dtype)
                    part = np.concatenate([part, pad])
                chunk[name] = part
            yield chunk, min(batch, num - b)

    def forward_all(self, blobs=None, **kwargs):
        """Run forward over inputs of any length, batch by batch; outputs concatenated."""
        collected = {out: [] for out in set(self.outputs + list(blobs or []))}
        for chunk, valid in self._batches(kwargs):
            outs = self.forward(blobs=blobs, **chunk)
            for name, value in outs.items():
                collected[name].append(_batch_part(value, valid))
        if not kwargs:
            outs = self.forward(blobs=blobs)
            return {n: v.copy() for n, v in outs.items()}
        return {n: np.concatenate(v) for n, v in collected.items()}

    def forward_backward_all(self, blobs=None, diffs=None, **kwargs):
        forward_in = {k: v for k, v in kwargs.items() if k in self.inputs}
        backward_in = {k: v for k, v in kwargs.items() if k in self.outputs}
        all_outs = {out: [] for out in set(self.outputs + list(blobs or []))}
        all_diffs = {d: [] for d in set(self.inputs + list(diffs or []))}
        back_batches = list(self._batches(backward_in)) if backward_in else None
        for index, (chunk, valid) in enumerate(self._batches(forward_in)):
            outs = self.forward(blobs=blobs, **chunk)
            bchunk = back_batches[index][0] if back_batches else {}
            grads = self.backward(diffs=diffs, **bchunk)
            for name, value in outs.items():
                all_outs[name].append(_batch_part(value, valid))
            for name, value in grads.items():
                all_diffs[name].append(_batch_part(value, valid))
        return ({n: np.concatenate(v) for n, v in all_outs.items()},
                {n: np.concatenate(v) for n, v in all_diffs.items()})

    def set_input_arrays(self, data, labels):
        """pycaffe's set_input_arrays: feed a MemoryData first layer."""
        layer = self.layers[0]
        if layer.type != "MemoryData":
            raise NetError("set_input_arrays needs the net's first layer to be MemoryData, not %s"
                           % layer.type)
        layer.set_input_arrays(data, labels)

    # -- pycaffe conveniences: callbacks, HDF5 weights, and the underscore internals ---------
    # (the names pycaffe's own Python code and BVLC's python/caffe/test suite reach for)
    def _add_layer_callback(self, kind, fn):
        if not callable(fn):
            raise TypeError("Net.%s takes a callable fn(layer_index), not %s"
                            % (kind, type(fn).__name__))
        self._layer_callbacks[kind].append(fn)

    def before_forward(self, fn):
        """Call ``fn(layer_index)`` before each layer computes forward."""
        self._add_layer_callback("before_forward", fn)

    def after_forward(self, fn):
        """Call ``fn(layer_index)`` after each layer computes forward."""
        self._add_layer_callback("after_forward", fn)

    def before_backward(self, fn):
        """Call ``fn(layer_index)`` before each layer of a backward range (needed or not)."""
        self._add_layer_callback("before_backward", fn)

    def after_backward(self, fn):
        """Call ``fn(layer_index)`` after each layer of a backward range; an ``NCCL`` object
        given here reduces that layer's gradients (layer-wise reduce)."""
        self._add_layer_callback("after_backward", fn)

    def save_hdf5(self, path):
        """Write the weights as Caffe's HDF5 model (groups data/<layer>/<param index>)."""
        from . import net_hdf5
        net_hdf5.save(self, path)

    def load_hdf5(self, path):
        """Copy weights by layer name from a Caffe HDF5 model file."""
        from . import net_hdf5
        net_hdf5.load(self, path)

    @property
    def _layer_names(self):
        return list(self.layer_names)

    @property
    def _blob_names(self):
        return list(self.blob_names)

    @property
    def _inputs(self):
        return list(self.input_blob_indices)

    @property
    def _outputs(self):
        return list(self.output_blob_indices)

    @property
    def _blob_loss_weights(self):
        return self.blob_loss_weight_list

    def _bottom_ids(self, layer_index):
        return list(self.bottom_ids[layer_index])

    def _top_ids(self, layer_index):
        return list(self.top_ids[layer_index])

    def _forward(self, start, end):
        """Forward over layers start..end (indices, both included); returns the loss."""
        return self.forward_from_to(int(start), int(end))

    def _backward(self, start, end):
        """Backward over layers start down to end (indices, both included)."""
        self.backward_from_to(int(start), int(end))

    def _set_input_arrays(self, data, labels):
        """Feed a MemoryData first layer: data N x C x H x W, labels N x 1 x 1 x 1, both
        float32 and C-contiguous (the arrays are kept by reference, not copied)."""
        if isinstance(labels, np.ndarray) and labels.ndim != 4:
            raise NetError("labels array must be 4-d (N x 1 x 1 x 1); its shape is %s "
                           "(Net.set_input_arrays also takes N labels)" % (labels.shape,))
        self.set_input_arrays(data, labels)

    def __repr__(self):
        return "<Net %r phase=%s layers=%d>" % (self.name, caffe_pb2.Phase.Name(self.phase),
                                               len(self.layers))
