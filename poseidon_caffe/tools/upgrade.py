"""``upgrade-net``, ``upgrade_net_proto_binary`` and ``upgrade-solver``: a legacy file in, the
current format out. Files are read as written (io's readers with ``upgrade=False``) and
upgraded by ``poseidon_caffe.upgrade``, which logs each step as Caffe does.
"""
import sys

from .. import io, log
from ..upgrade import UpgradeError, net_needs_upgrade, upgrade_net, upgrade_solver
from . import flags

_BINARY_SUFFIXES = (".caffemodel", ".binaryproto", ".pb")


_USAGE = ("usage: poseidon-caffe %s IN OUT\n"
          "  Reads %s in any legacy format and writes it in the current one.\n")
NET_USAGE = _USAGE % ("upgrade-net", "a net prototxt or a binary .caffemodel")
SOLVER_USAGE = _USAGE % ("upgrade-solver", "a solver prototxt")
BINARY_USAGE = _USAGE % ("upgrade_net_proto_binary", "a binary NetParameter (.caffemodel)")


def _usage(text):
    sys.stderr.write(text)
    return 2


def _upgrade_net_file(command, src, dst, binary):
    """Read a net as written, upgrade it if it is legacy, write it in the same encoding."""
    try:
        raw = io.read_net_binary(src, upgrade=False) if binary else \
            io.read_net_param(src, upgrade=False)
        if not net_needs_upgrade(raw):
            log.error("File already in latest proto format: %s", src)
        else:
            upgrade_net(raw, src)
        if binary:
            io.write_net_binary(raw, dst)
        else:
            io.write_text_proto(raw, dst)
    except (io.ProtoFileError, UpgradeError) as e:
        sys.stderr.write("%s: %s\n" % (command, e))
        return 1
    log.info("Wrote upgraded NetParameter %s proto to %s", "binary" if binary else "text", dst)
    return 0


@flags.documented(NET_USAGE)
def upgrade_net_main(argv):
    """``upgrade-net IN OUT``: text prototxt in, text out; a binary .caffemodel in, binary out."""
    if len(argv) != 2 or any(a in ("-h", "--help") for a in argv):
        return _usage(NET_USAGE)
    src, dst = argv
    return _upgrade_net_file("upgrade-net", src, dst, src.endswith(_BINARY_SUFFIXES))


@flags.documented(BINARY_USAGE)
def upgrade_net_proto_binary_main(argv):
    """``upgrade_net_proto_binary IN OUT``, as Caffe's tool: a binary NetParameter (a
    .caffemodel of any age, whatever its file name) in, the upgraded binary out."""
    if len(argv) != 2 or any(a in ("-h", "-help", "--help") for a in argv):
        return _usage(BINARY_USAGE)
    src, dst = argv
    return _upgrade_net_file("upgrade_net_proto_binary", src, dst, binary=True)


@flags.documented(SOLVER_USAGE)
def upgrade_solver_main(argv):
    """``upgrade-solver IN OUT``: a solver prototxt with solver_type -> one with type."""
    if len(argv) != 2 or any(a in ("-h", "--help") for a in argv):
        return _usage(SOLVER_USAGE)
    src, dst = argv
    try:
        solver = io.read_solver_param(src, upgrade=False)
        if not solver.HasField("solver_type"):
            log.error("File already in latest proto format: %s", src)
        else:
            upgrade_solver(solver, src)
        io.write_text_proto(solver, dst)
    except (io.ProtoFileError, UpgradeError) as e:
        sys.stderr.write("upgrade-solver: %s\n" % e)
        return 1
    log.info("Wrote upgraded SolverParameter text proto to %s", dst)
    return 0
