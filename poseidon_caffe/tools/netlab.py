"""``python scripts/netlab.py``: hosts on a real, shaped network on one machine (root needed).

    run  --hosts H --bandwidth RATE [--latency L] [--mtu N] [--hostfile PATH] [--json PATH]
         -- CMD ...      make a lab, run CMD in host 0 (``{hostfile}`` in CMD is the lab's host
                         file), print the bytes each host's link carried, take the lab down
    up   --hosts H --bandwidth RATE [...]   make a lab that stays up
    exec [--lab NAME] [--host K] -- CMD ...  run CMD in a lab's host, with the lab's environment
    down [NAME ... | --stale | --all]       take labs down (--stale: those whose run was killed)
    list                                    the labs here

RATE: 100mbit, 1gbit, 10gbit, 500kbit or 12.5MB/s (bits: bit kbit mbit gbit tbit; bytes: B/s
KB/s MB/s GB/s). L: the one-way delay between two hosts, 5ms, 200us (needs tc's netem).
"""
import argparse
import json
import os
import sys

from ..netlab import (STATE_ENV, Lab, LabError, UnitError, labs, rate_text, remove_namespaces,
                      run_across, stale_labs, stray_namespaces)
from ..netlab.lab import DEFAULT_MTU, DEFAULT_PORT

PROG = "netlab"


def _say(text, stream=None):
    (stream or sys.stderr).write("%s: %s\n" % (PROG, text))


def _lab_options(parser):
    parser.add_argument("--hosts", type=int, required=True, help="how many hosts (1..254)")
    parser.add_argument("--bandwidth", required=True,
                        help="each host link's rate, both ways: 100mbit, 1gbit, 12.5MB/s ...")
    parser.add_argument("--latency", default="0",
                        help="one-way delay between two hosts: 5ms, 200us (default 0)")
    parser.add_argument("--mtu", type=int, default=DEFAULT_MTU,
                        help="frame size of the links (default 1500; 9000: jumbo frames)")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT,
                        help="the port written in the host file (default %d)" % DEFAULT_PORT)
    parser.add_argument("--hostfile", default=None,
                        help="where to write the host file (default: in the lab's state "
                             "folder); removed with the lab")


def _parser():
    parser = argparse.ArgumentParser(prog="python scripts/netlab.py", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="verb", required=True, metavar="run|up|exec|down|list")
    run = sub.add_parser("run", help="run a command across a fresh lab")
    _lab_options(run)
    run.add_argument("--json", default=None, help="write the exit status and per-host bytes")
    run.add_argument("cmd", nargs=argparse.REMAINDER, help="-- CMD ...")
    up = sub.add_parser("up", help="make a lab that stays up")
    _lab_options(up)
    ex = sub.add_parser("exec", help="run a command in a lab's host")
    ex.add_argument("--lab", default=None, help="the lab's name (default: the only one)")
    ex.add_argument("--host", type=int, default=0, help="which host (default 0)")
    ex.add_argument("cmd", nargs=argparse.REMAINDER, help="-- CMD ...")
    down = sub.add_parser("down", help="take labs down")
    down.add_argument("names", nargs="*")
    which = down.add_mutually_exclusive_group()
    which.add_argument("--stale", action="store_true",
                       help="labs (and stray namespaces) whose making process is gone")
    which.add_argument("--all", action="store_true", help="every lab here")
    sub.add_parser("list", help="the labs here")
    return parser


def _command(words):
    words = list(words)
    if words and words[0] == "--":
        words = words[1:]
    return words


def _describe(lab):
    latency = lab.state.get("latency", "0")
    return ("lab %s: %d hosts (%s .. %s), links at %s%s, mtu %d, host file %s"
            % (lab.name, len(lab.addresses), lab.addresses[0], lab.addresses[-1],
               rate_text(lab.rate_bits),
               "" if lab.delay == 0 else ", %s one way" % latency, lab.state["mtu"],
               lab.hostfile))


def _only_lab(name):
    if name:
        return Lab.load(name)
    if os.environ.get(STATE_ENV):
        return Lab.load(os.environ[STATE_ENV])
    found = labs()
    if not found:
        raise LabError("no lab is up here")
    if len(found) > 1:
        raise LabError("%d labs are up (%s): name one"
                       % (len(found), ", ".join(lab.name for lab in found)))
    return found[0]


def _run(a):
    cmd = _command(a.cmd)
    if not cmd:
        raise LabError("run: no command given: netlab run --hosts H --bandwidth RATE -- CMD ...")
    result = run_across(a.hosts, a.bandwidth, cmd, a.latency, hostfile=a.hostfile,
                        port=a.port, mtu=a.mtu, on_ready=lambda lab: _say(_describe(lab)))
    if result.wire is None:
        _say("stopped by signal %d while the lab was being made; it was taken down"
             % (result.returncode - 128))
        return result.returncode
    for h in result.wire:
        _say("host %d %s: sent %d bytes (%d frames), received %d bytes (%d frames)"
             % (h.host, h.address, h.tx_bytes, h.tx_packets, h.rx_bytes, h.rx_packets))
    _say("lab %s taken down; %s exited with status %d after %.1f s"
         % (result.name, cmd[0], result.returncode, result.seconds))
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"lab": result.name, "returncode": result.returncode,
                       "seconds": result.seconds,
                       "hosts": [h._asdict() for h in result.wire]}, f, indent=1)
    return result.returncode


def _up(a):
    lab = Lab.create(a.hosts, a.bandwidth, a.latency, hostfile=a.hostfile, port=a.port,
                     mtu=a.mtu, persistent=True)
    out = sys.stdout
    out.write("%s\nlab %s is up\n" % (_describe(lab), lab.name))
    out.write("run in it:  python scripts/netlab.py exec --lab %s -- CMD ...   (e.g. python "
              "examples/mnist/run_local.py %s)\n" % (lab.name, lab.hostfile))
    out.write("take down:  python scripts/netlab.py down %s\n" % lab.name)
    return 0


def _exec(a):
    cmd = _command(a.cmd)
    if not cmd:
        raise LabError("exec: no command given: netlab exec [--lab NAME] -- CMD ...")
    lab = _only_lab(a.lab)
    if not 0 <= a.host < len(lab.addresses):
        raise LabError("lab %s has hosts 0..%d, not %d" % (lab.name, len(lab.addresses) - 1,
                                                           a.host))
    if not lab.state.get("complete"):
        raise LabError("lab %s is not complete (its making failed or goes on)" % lab.name)
    argv = lab.command(cmd, a.host)
    sys.stdout.flush()
    os.execve(argv[0], argv, lab.env())


def _down(a):
    if a.stale or a.all:
        chosen = labs() if a.all else stale_labs()
        strays = stray_namespaces()
    else:
        chosen = [Lab.load(n) for n in a.names] if a.names else [_only_lab(None)]
        strays = []
    for lab in chosen:
        lab.destroy()
        _say("lab %s taken down" % lab.name)
    if strays:
        remove_namespaces(strays)
        _say("stray namespaces deleted: %s" % ", ".join(strays))
    if not chosen and not strays:
        _say("nothing to take down")
    return 0


def _list(a):
    for lab in labs():
        kind = "up" if lab.state.get("persistent") else "run by pid %d" % lab.state["pid"]
        sys.stdout.write("%s  (%s)\n" % (_describe(lab), kind))
    return 0


def main(argv=None):
    a = _parser().parse_args(sys.argv[1:] if argv is None else argv)
    try:
        return {"run": _run, "up": _up, "exec": _exec, "down": _down, "list": _list}[a.verb](a)
    except (LabError, UnitError) as exc:
        _say(str(exc))
        return 2 if isinstance(exc, UnitError) else 1


if __name__ == "__main__":
    sys.exit(main())
