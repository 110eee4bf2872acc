"""``poseidon-caffe draw_net [FLAGS] NET.prototxt OUTPUT``: a net's graph as PNG, SVG, PDF or
DOT (``draw.py``; pydot needed, graphviz for every format but DOT).
"""
import sys

from .. import log
from ..draw import GraphvizError, draw_net_to_file
from ..io import ProtoFileError, read_net_param
from ..proto import caffe_pb2
from . import flags as flagmod

DRAW_FLAGS = [
    flagmod.Flag("rankdir", "LR", "Direction of the layout: LR (left to right), TB (top to "
                 "bottom), RL or BT"),
    flagmod.Flag("phase", "ALL", "Which layers to draw: TRAIN, TEST, or ALL (every layer, "
                 "whatever its phase)"),
    flagmod.Flag("display_lrm", False, "Show the learning rate multipliers of Convolution, "
                 "Deconvolution and InnerProduct layers"),
]

DRAW_USAGE = """Draw a net's graph.
Usage:
    draw_net [FLAGS] NET.prototxt OUTPUT.{png,svg,pdf,dot}
The format follows the output's extension; .dot (DOT text) needs no graphviz, the others need
graphviz's dot program.
"""


@flagmod.documented(DRAW_USAGE, DRAW_FLAGS)
def draw_net_main(argv):
    if any(a in ("-h", "-help", "--help") for a in argv):
        sys.stdout.write("%s\nFlags:\n%s\n" % (DRAW_USAGE, flagmod.usage(DRAW_FLAGS)))
        return 0
    try:
        values, args = flagmod.parse(argv, DRAW_FLAGS)
        if len(args) != 2:
            raise flagmod.FlagError("draw_net takes NET.prototxt OUTPUT_FILE, got %d argument(s)"
                                    % len(args))
        phases = {"TRAIN": caffe_pb2.TRAIN, "TEST": caffe_pb2.TEST, "ALL": None}
        if values["phase"] not in phases:
            raise flagmod.FlagError("-phase takes TRAIN, TEST or ALL, not %r" % values["phase"])
        if values["rankdir"] not in ("LR", "RL", "TB", "BT"):
            raise flagmod.FlagError("-rankdir takes LR, RL, TB or BT, not %r" % values["rankdir"])
    except flagmod.FlagError as exc:
        log.error("draw_net: %s", exc)
        return 1
    net_path, out_path = args
    try:
        net = read_net_param(net_path)
        log.info("Drawing net to %s", out_path)
        draw_net_to_file(net, out_path, values["rankdir"], phases[values["phase"]],
                         values["display_lrm"])
    except (ProtoFileError, GraphvizError, ValueError, OSError) as exc:
        log.error("draw_net: %s", exc)
        return 1
    return 0

