"""Pictures of nets, as pycaffe's ``caffe.draw``: a NetParameter becomes a graphviz graph of
layers (boxes) and blobs (octagons), written as DOT text or, through graphviz's ``dot`` program,
as PNG, SVG, PDF ...

The graph is built with pydot (``pip install 'poseidon-caffe[draw]'``); DOT text needs nothing
more, every rendered format needs graphviz installed.  ``poseidon-caffe draw_net`` is the
command-line face (``tools/draw_net.py``).
"""
import os
import shutil
import subprocess

try:
    import pydot
except ImportError:                  # pragma: no cover - depends on the installation
    raise ImportError("poseidon_caffe.draw needs pydot: pip install 'poseidon-caffe[draw]'") \
        from None

from .proto import caffe_pb2

__all__ = ["LAYER_STYLE_DEFAULT", "NEURON_LAYER_STYLE", "BLOB_STYLE", "GraphvizError",
           "get_pooling_types_dict", "get_edge_label", "get_layer_lr_mult", "get_layer_label",
           "choose_color_by_layertype", "get_pydot_graph", "render", "draw_net", "draw_net_to_file"]

LAYER_STYLE_DEFAULT = {"shape": "record", "fillcolor": "#6495ED", "style": "filled"}
NEURON_LAYER_STYLE = {"shape": "record", "fillcolor": "#90EE90", "style": "filled"}
BLOB_STYLE = {"shape": "octagon", "fillcolor": "#E0E0E0", "style": "filled"}

_TYPE_COLORS = {"Convolution": "#FF5050", "Deconvolution": "#FF5050", "Pooling": "#FF9900",
                "InnerProduct": "#CC33FF"}
_LEARNING_TYPES = ("Convolution", "Deconvolution", "InnerProduct")
# formats that are the graph's own text: written without running graphviz
_TEXT_FORMATS = ("dot", "gv", "raw")


class GraphvizError(RuntimeError):
    """Graphviz's ``dot`` is missing or refused to render; the message says what to do."""


def get_pooling_types_dict():
    """PoolingParameter's pool method number -> name (0 -> 'MAX', ...)."""
    enum = caffe_pb2.PoolingParameter.PoolMethod.DESCRIPTOR
    return {value.number: name for name, value in enum.values_by_name.items()}


def get_edge_label(layer):
    """What an edge out of ``layer`` says: the batch size of a Data layer, the number of outputs
    of a Convolution, Deconvolution or InnerProduct layer, nothing otherwise ('""')."""
    if layer.type == "Data":
        return "Batch %d" % layer.data_param.batch_size
    if layer.type in ("Convolution", "Deconvolution"):
        return str(layer.convolution_param.num_output)
    if layer.type == "InnerProduct":
        return str(layer.inner_product_param.num_output)
    return '""'


def get_layer_lr_mult(layer):
    """(weight lr_mult, bias lr_mult) of a Convolution, Deconvolution or InnerProduct layer;
    1.0 where the layer gives no ParamSpec."""
    if layer.type not in _LEARNING_TYPES:
        raise ValueError("%s layers do not have a learning rate multiplier" % layer.type)
    if len(layer.param) > 2:
        raise ValueError("layer %s: %d param specs, a %s layer has at most 2 (weights, bias)"
                         % (layer.name, len(layer.param), layer.type))
    mults = [spec.lr_mult for spec in layer.param] + [1.0] * (2 - len(layer.param))
    return tuple(mults)


def _spatial(values, fallback):
    """One number, or HxW when the axes differ (kernel 3x5)."""
    values = [int(v) for v in values] or [fallback]
    if len(set(values)) == 1:
        return "%d" % values[0]
    return "x".join("%d" % v for v in values)


def _spatial_descriptors(layer):
    if layer.type == "Pooling":
        p = layer.pooling_param
        kernel = [p.kernel_h, p.kernel_w] if p.HasField("kernel_h") else [p.kernel_size]
        stride = [p.stride_h, p.stride_w] if p.HasField("stride_h") else [p.stride]
        pad = [p.pad_h, p.pad_w] if p.HasField("pad_h") else [p.pad]
    else:
        p = layer.convolution_param
        kernel = [p.kernel_h, p.kernel_w] if p.HasField("kernel_h") else list(p.kernel_size)
        stride = [p.stride_h, p.stride_w] if p.HasField("stride_h") else list(p.stride)
        pad = [p.pad_h, p.pad_w] if p.HasField("pad_h") else list(p.pad)
    return ["kernel size: %s" % _spatial(kernel, 1), "stride: %s" % _spatial(stride, 1),
            "pad: %s" % _spatial(pad, 0)]


def _escape(text):
    """Layer and blob names inside a record label: graphviz treats {}|<> as structure."""
    for char in '\\{}|<>"':
        text = text.replace(char, "\\" + char)
    return text


def get_layer_label(layer, rankdir, display_lrm=False):
    """A layer's node label: name, (type), kernel/stride/pad for spatial layers and, with
    ``display_lrm``, the learning rate multipliers. Words go on separate lines when the graph
    runs left to right (vertical room), on one line when it runs top to bottom."""
    separator = " " if rankdir in ("TB", "BT") else r"\n"
    if layer.type == "Pooling":
        kind = "(Pooling %s)" % get_pooling_types_dict()[layer.pooling_param.pool]
    else:
        kind = "(%s)" % layer.type
    parts = [_escape(layer.name), _escape(kind)]
    if layer.type in ("Convolution", "Deconvolution", "Pooling"):
        parts.append(separator.join(_spatial_descriptors(layer)))
    if display_lrm and layer.type in _LEARNING_TYPES:
        weights, bias = get_layer_lr_mult(layer)
        if weights or bias:
            parts.append("lr mult: %.1f, %.1f" % (weights, bias))
    return '"%s"' % separator.join(parts)


def choose_color_by_layertype(layertype):
    """Fill colour of a layer's box: convolutions red, pooling orange, inner products purple."""
    return _TYPE_COLORS.get(layertype, LAYER_STYLE_DEFAULT["fillcolor"])


def _rule_matches(rule, phase):
    # only the phase is drawn for: a rule without a phase matches every phase
    return not rule.HasField("phase") or rule.phase == phase


def _in_phase(layer, phase):
    """Caffe's include/exclude rules, judged by phase alone."""
    if phase is None:
        return True
    if layer.include and layer.exclude:
        raise ValueError("layer %s has both include and exclude specified" % layer.name)
    if layer.include:
        return any(_rule_matches(rule, phase) for rule in layer.include)
    return not any(_rule_matches(rule, phase) for rule in layer.exclude)


def get_pydot_graph(caffe_net, rankdir, label_edges=True, phase=None, display_lrm=False):
    """A pydot.Dot of ``caffe_net`` (a NetParameter): one node per layer (keyed by name and
    type, so a layer defined once per phase is drawn once), one node per blob, edges from
    bottoms to layers to tops. ``phase`` (caffe TRAIN or TEST) keeps only that phase's layers;
    None draws them all."""
    graph = pydot.Dot(caffe_net.name or "Net", graph_type="digraph", rankdir=rankdir)
    nodes = {}
    edges = []
    for layer in caffe_net.layer:
        if not _in_phase(layer, phase):
            continue
        layer_id = "layer %s %s" % (layer.name, layer.type)
        in_place = (len(layer.bottom) == 1 and len(layer.top) == 1
                    and layer.bottom[0] == layer.top[0])
        style = dict(NEURON_LAYER_STYLE if in_place else LAYER_STYLE_DEFAULT)
        if not in_place:
            style["fillcolor"] = choose_color_by_layertype(layer.type)
        nodes[layer_id] = pydot.Node(layer_id, label=get_layer_label(layer, rankdir, display_lrm),
                                     **style)
        out_label = get_edge_label(layer) if label_edges else '""'
        for bottom in layer.bottom:
            edges.append(("blob " + bottom, layer_id, '""'))
        for top in layer.top:
            edges.append((layer_id, "blob " + top, out_label))
        for blob in list(layer.bottom) + list(layer.top):
            nodes.setdefault("blob " + blob, pydot.Node("blob " + blob,
                                                        label='"%s"' % _escape(blob),
                                                        **BLOB_STYLE))
    for node in nodes.values():
        graph.add_node(node)
    for src, dst, label in edges:
        graph.add_edge(pydot.Edge(nodes[src], nodes[dst], label=label))
    return graph


def render(graph, ext):
    """The graph as bytes in format ``ext``: DOT text directly, anything else through dot."""
    ext = ext.lower()
    text = graph.to_string()
    if ext in _TEXT_FORMATS:
        return text.encode("utf-8")
    program = shutil.which("dot")
    if program is None:
        raise GraphvizError("drawing a net as %s needs graphviz's 'dot' program, which is not "
                            "on PATH: install graphviz (e.g. apt-get install graphviz, brew "
                            "install graphviz), or write a .dot file" % ext.upper())
    proc = subprocess.run([program, "-T" + ext], input=text.encode("utf-8"),
                          capture_output=True)
    if proc.returncode != 0:
        detail = proc.stderr.decode("utf-8", "replace").strip().splitlines()
        raise GraphvizError("graphviz's dot could not write format %r: %s"
                            % (ext, detail[0] if detail else "exit status %d" % proc.returncode))
    return proc.stdout


def draw_net(caffe_net, rankdir, ext="png", phase=None, display_lrm=False):
    """The drawing of ``caffe_net`` as bytes in format ``ext`` ('png', 'svg', 'pdf', 'dot' ...)."""
    return render(get_pydot_graph(caffe_net, rankdir, phase=phase, display_lrm=display_lrm), ext)


def draw_net_to_file(caffe_net, filename, rankdir="LR", phase=None, display_lrm=False):
    """Draw ``caffe_net`` into ``filename`` in the format its extension names ('.raw' and
    '.dot' write the DOT text, for graphviz by hand)."""
    from .io import atomic_write
    ext = os.path.splitext(filename)[1][1:] or "png"
    atomic_write(filename, draw_net(caffe_net, rankdir, ext, phase, display_lrm))
