"""``poseidon-caffe``: Caffe's command-line brew (train, test, time, device_query) and the
project's tools, with Caffe's flags and defaults, one dash or two. ``COMMAND -help`` (or
``--help``, or ``help COMMAND``) prints any command's usage and flags.

This module finds the command; each lives in its own module of this package, imported only
when asked for.
"""
import importlib
import inspect
import sys

from .. import log
from . import flags as gflags
from .caffe_tool import ALL_FLAGS, COMMAND_USAGE, COMMANDS, CommandError

USAGE = """command line brew
usage: poseidon-caffe <command> <args>
       poseidon-caffe <command> -help     (that command's usage and flags)

commands:
  train              train or finetune a model
  test               score a model
  device_query       show the compute devices (the CPU backend, and GPUs when available)
  time               benchmark model execution time
  alias              install|remove|status: make `import caffe` load poseidon-caffe (opt-in)
  upgrade-net        upgrade a legacy net prototxt / caffemodel
  upgrade-solver     upgrade a legacy solver prototxt
  convert_imageset   convert a set of images to an LMDB of Datum records
  compute_image_mean compute the mean image of a database
  make_partitions    split a dataset into per-worker partitions
  draw_net           draw a net's graph (PNG, SVG, PDF or DOT)
  parse_log          a training log -> LOG.train and LOG.test tables
  plot               plot loss, accuracy and learning rate of training logs
  extract_features   write chosen blobs of a trained net's forward passes to LMDB
  upgrade_net_proto_binary  upgrade a legacy binary .caffemodel
  simulate           predict iteration time and speedup on clusters of any size
  calibrate          measure simulate's link and host-CPU figures (under mpiexec, a rank a node)
"""

# The tools, each a main(argv) in its module here.
TOOLS = {
    "alias": ("poseidon_caffe.tools.alias", "alias_main"),
    "upgrade_net": ("poseidon_caffe.tools.upgrade", "upgrade_net_main"),
    "upgrade_solver": ("poseidon_caffe.tools.upgrade", "upgrade_solver_main"),
    "convert_imageset": ("poseidon_caffe.tools.datasets", "convert_imageset_main"),
    "compute_image_mean": ("poseidon_caffe.tools.datasets", "compute_image_mean_main"),
    "make_partitions": ("poseidon_caffe.tools.datasets", "make_partitions_main"),
    "draw_net": ("poseidon_caffe.tools.draw_net", "draw_net_main"),
    "parse_log": ("poseidon_caffe.tools.training_log", "parse_log_main"),
    "plot": ("poseidon_caffe.tools.plot_log", "plot_main"),
    "extract_features": ("poseidon_caffe.tools.extract_features", "extract_features_main"),
    "upgrade_net_proto_binary": ("poseidon_caffe.tools.upgrade", "upgrade_net_proto_binary_main"),
    "simulate": ("poseidon_caffe.tools.simulate", "simulate_main"),
    "calibrate": ("poseidon_caffe.tools.calibrate", "calibrate_main"),
}


def _load_tool(name):
    module_name, function_name = TOOLS[name]
    try:
        module = importlib.import_module(module_name)
        return getattr(module, function_name)
    except (ImportError, AttributeError) as exc:
        raise CommandError("the %s command is unavailable: %s.%s cannot be loaded (%s)"
                           % (name, module_name, function_name, exc)) from None


def _run_tool(name, argv):
    result = _load_tool(name)(argv)
    return 0 if result is None else int(result)


def _summary(command):
    """The command's line in USAGE, or its name."""
    names = {command, command.replace("-", "_"), command.replace("_", "-")}
    for line in USAGE.splitlines():
        words = line.split(None, 1)
        if len(words) == 2 and words[0] in names:
            return words[1]
    return ""


def command_help(command):
    """What ``poseidon-caffe COMMAND -help`` prints: the command's usage, then its flags.

    A tool's text is the ``usage`` its main function was ``documented`` with, else the
    function's docstring; so a tool added to TOOLS answers -help without more work."""
    if command in COMMANDS:
        synopsis, flag_list = COMMAND_USAGE[command]
        text = "usage: poseidon-caffe " + synopsis
    else:
        function = _load_tool(command.replace("-", "_"))
        flag_list = getattr(function, "flags", ())
        text = getattr(function, "usage", None) or (
            "usage: poseidon-caffe %s ...\n%s" % (command, inspect.getdoc(function)
                                                   or _summary(command)))
    text = text.rstrip("\n") + "\n"
    if flag_list:
        text += "\nflags:\n" + gflags.usage(flag_list) + "\n"
    return text


def main(argv=None):
    from ..solver.solver import TrainingDiverged
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in gflags.HELP_ARGS or argv == ["help"]:
        sys.stdout.write(USAGE + "\nflags:\n" + gflags.usage(ALL_FLAGS) + "\n")
        return 0 if argv else 1
    command, rest = argv[0], argv[1:]
    if command == "help":                           # ``help COMMAND``, as ``COMMAND -help``
        command, rest = rest[0], ["-help"]
    tool = command.replace("-", "_")
    try:
        if gflags.wants_help(rest) and (tool in TOOLS or command in COMMANDS):
            sys.stdout.write(command_help(command))
            return 0
        if tool in TOOLS:
            return _run_tool(tool, rest)
        if command not in COMMANDS:
            sys.stderr.write("unknown command %r\n\n%s" % (command, USAGE))
            return 1
        values, positional = gflags.parse(rest, ALL_FLAGS)
        if positional:
            raise CommandError("%s takes only flags; unexpected argument(s): %s"
                               % (command, " ".join(positional)))
        values["_argv"] = rest
        return COMMANDS[command](values)
    except TrainingDiverged:
        return 1                    # the solver has logged the iteration and last snapshot
    except (ValueError, RuntimeError, OSError) as exc:
        log.error("%s", exc)
        return 1
    except MemoryError as exc:
        # outside a net's layers (those name themselves): the solver's history, data buffers
        log.error("out of memory: %s", str(exc) or "an allocation failed")
        return 1
    except KeyboardInterrupt:
        log.error("Interrupted.")
        return 130


if __name__ == "__main__":
    sys.exit(main())
