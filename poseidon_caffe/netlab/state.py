"""Where a lab writes down what it made, so that ``down`` and the cleanup of a crashed run
find every namespace of it: one folder per lab (``state.json``, the host file, the launch
hook), under ``/run/poseidon-netlab`` (``POSEIDON_NETLAB_DIR`` elsewhere).

The state is written before the first namespace is made and removed after the last one is
gone, so a lab is never out of reach of ``down``.
"""
import json
import os

PREFIX = "pcnl"                  # every lab's namespaces start with it: pcnl-<pid>-<n>-...
STATE_FILE = "state.json"
DIR_ENV = "POSEIDON_NETLAB_DIR"
# the launch hook is executed by mpiexec, so the folder must allow it (/run often does not)
_ROOTS = ("/run/poseidon-netlab", "/var/tmp/poseidon-netlab")


def _executable_here(folder):
    probe = folder
    while not os.path.exists(probe):
        probe = os.path.dirname(probe)
    return not os.statvfs(probe).f_flag & getattr(os, "ST_NOEXEC", 8)


def state_root():
    """The folder that holds every lab's state folder."""
    if os.environ.get(DIR_ENV):
        return os.environ[DIR_ENV]
    for root in _ROOTS:
        if _executable_here(root):
            return root
    return _ROOTS[-1]


def all_roots():
    chosen = state_root()
    return [chosen] + [r for r in _ROOTS if r != chosen]


def process_start(pid):
    """The start time of process ``pid`` (clock ticks since boot), or None if it is gone: with
    the pid it names one process, even after the pid is used again."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return int(fields[19])
    except (OSError, IndexError, ValueError):
        return None


def write(state):
    path = os.path.join(state["dir"], STATE_FILE)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(state, f, indent=1, sort_keys=True)
    os.replace(tmp, path)
    return path


def read(path):
    with open(path) as f:
        return json.load(f)


def saved_labs():
    """{name: state} of every lab with a state folder."""
    found = {}
    for root in all_roots():
        try:
            names = sorted(os.listdir(root))
        except OSError:
            continue
        for name in names:
            path = os.path.join(root, name, STATE_FILE)
            try:
                found.setdefault(name, read(path))
            except (OSError, ValueError):
                continue
    return found


def owner_alive(state):
    """Whether the process that made a lab for its own run still runs."""
    return process_start(state["pid"]) == state.get("pid_start")


def hostfile_text(addresses, port):
    """Poseidon's host file: ``<client_id> <ip> <port>``, one lab host a line."""
    return "".join("%d %s %d\n" % (i, address, port) for i, address in enumerate(addresses))


def hook_text(name, addresses, namespaces, ip_path):
    """The program mpiexec's ssh launcher runs as ``HOOK [-x] HOST COMMAND...``: COMMAND in
    HOST's namespace, through a shell, as ssh runs it on a real machine."""
    cases = "".join("  %s) ns=%s ;;\n" % (a, ns) for a, ns in zip(addresses, namespaces))
    return ("#!/bin/sh\n"
            "# netlab %s: hydra's ssh launcher calls this as HOOK [-x] HOST COMMAND...\n"
            "while :; do case \"$1\" in -x|-T|-q|-n) shift ;; -o|-l|-i|-p) shift 2 ;;"
            " *) break ;; esac; done\n"
            "host=$1; shift\n"
            "case \"$host\" in\n%s"
            "  *) echo \"netlab %s: $host is not one of its hosts\" >&2; exit 255 ;;\n"
            "esac\n"
            "exec %s netns exec \"$ns\" /bin/sh -c \"$*\"\n"
            % (name, cases, name, ip_path))
