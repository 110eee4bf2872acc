"""Net: a NetParameter turned into a graph of layers, with Caffe's semantics.

Building a net (``Net.__init__``) follows Caffe's Net::Init step by step: rules filter the layers
for the net's phase, level and stages (``filtering``); split layers are inserted where one top
feeds several bottoms (``splits``); each layer is created, wired to its bottom and top blobs
(in place when a top names its own bottom), set up and shaped, and its loss weights and
parameter specs (sharing, lr_mult, decay_mult) are recorded (``wiring``); finally, which layers
and blobs need backward is worked out from the losses (``backward_plan``) and the memory the
blobs need is checked (``footprint``). Running, debug output, weights and pycaffe's view live
in the other modules of this package, one idea each, as the mixins of ``Net``.
"""
from .. import fillers, log, memory
from ..layers import check_types, create_layer
from ..layers.base import LayerError
from ..proto import caffe_pb2
from ..proto_values import describe_non_finite, non_finite_fields
from .backward_plan import BackwardPlan
from .debug import DebugOutput
from .diff_sharing import share_diffs
from .errors import NetError, NetMemoryError
from .execution import Execution
from .filtering import filter_net
from .footprint import MemoryFootprint
from .pycaffe import LAYER_CALLBACK_KINDS, PycaffeView
from .split_folding import SplitFolding
from .splits import insert_splits
from .weights import Weights
from .wiring import Wiring

TRAIN = caffe_pb2.TRAIN
TEST = caffe_pb2.TEST


class Net(Wiring, BackwardPlan, Execution, DebugOutput, Weights, MemoryFootprint,
          PycaffeView):
    """A net built from a NetParameter (or a prototxt path) for a phase, level and stages."""

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
            error = NetMemoryError if exc.out_of_memory else NetError
            raise error("%slayer %r: %s" % ("%s: " % self.source if self.source else "",
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
            from ..upgrade import upgrade_net
            upgrade_net(param)
            return param
        from ..io import read_net_param
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

        check_types(self.param.layer)          # every unknown type named at once
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
        inserted = ({l.name for l in self.param.layer if l.type == "Split"}
                    - {l.name for l in filtered.layer})
        self._split_folding = None
        self._diff_pool = None      # set by share_diffs
        if inserted and not self.layers[0].backend.on_device:
            self._split_folding = SplitFolding(self, inserted) or None
        self._check_memory()
        # Caffe collects the remaining blobs in a std::set: the outputs come by name
        self.output_blob_indices = [self.blob_name_to_index[n] for n in sorted(available)]
        for index in self.output_blob_indices:
            log.info("This network produces output %s", self.blob_names[index])
        self._learnable_final_at = self._learnable_param_finish_layers()
        log.info("Network initialization done.")

    def share_diffs(self):
        """Let blobs whose gradients are never needed at the same time share their diffs
        (net.diff_sharing): a trainer's choice, since intermediate diffs read after backward
        no longer hold their gradients. Once; a no-op on a device or a net with no backward.
        Returns the bytes the shared diffs take."""
        if self._diff_pool is None and self.layers and not self.layers[0].backend.on_device:
            before = self.memory_estimate()["diff"]
            self._diff_pool = share_diffs(self)
            after = self.memory_estimate()["diff"]
            if after < before:
                log.info("Blob diffs shared: %s instead of %s", memory.format_bytes(after),
                         memory.format_bytes(before))
        return 0 if self._diff_pool is None else self._diff_pool.nbytes

    def __repr__(self):
        return "<Net %r phase=%s layers=%d>" % (self.name, caffe_pb2.Phase.Name(self.phase),
                                               len(self.layers))
