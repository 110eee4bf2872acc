"""A lab: H hosts on one machine, each a network namespace whose ``eth0`` is one end of a veth
link; the other ends are ports of a bridge in a namespace of its own. Both ends of every link
are shaped (``shaping.py``). Addresses are 198.18.<n>.<host + 1>/24 (the benchmarking range,
RFC 2544), inside the lab only: the machine's own namespace has no leg on the bridge and no
route to them, and nothing in the lab routes out.

Every link sends one wire frame per packet (GSO off), so the links' byte counters count what
a NIC would put on a wire, less preamble and frame check (24 bytes a frame).
"""
import collections
import itertools
import json
import os
import shutil
import signal
import time

from . import shaping, state as saved, system
from .system import LabError
from .units import parse_delay, parse_rate

INTERFACE = "eth0"
BRIDGE = "br0"
NETWORK = "198.18"
MAX_HOSTS = 254
DEFAULT_PORT = 9999
DEFAULT_MTU = 1500                             # Ethernet's; 9000 for jumbo frames
MTU_RANGE = (1280, 9216)
STATE_ENV = "POSEIDON_NETLAB"                  # the state file of the lab a command runs in
HOSTFILE_ENV = "POSEIDON_NETLAB_HOSTFILE"

HostBytes = collections.namedtuple("HostBytes", "host address tx_bytes rx_bytes tx_packets "
                                                "rx_packets")

_sequence = itertools.count()


def namespaces():
    """The names ``ip netns list`` shows."""
    out = system.run("ip", "netns", "list", check=False) or ""
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def _unused_name():
    taken = set(saved.saved_labs()) | set(namespaces())
    while True:
        n = next(_sequence)
        name = "%s-%d-%d" % (saved.PREFIX, os.getpid(), n)
        if not any(t == name or t.startswith(name + "-") for t in taken):
            return name, n


def _check_counts(hosts, port, mtu):
    if not isinstance(hosts, int) or not 1 <= hosts <= MAX_HOSTS:
        raise LabError("--hosts %r: a lab has 1 to %d hosts" % (hosts, MAX_HOSTS))
    if not isinstance(port, int) or not 0 < port < 65536:
        raise LabError("port %r is out of range 1..65535" % (port,))
    if not isinstance(mtu, int) or not MTU_RANGE[0] <= mtu <= MTU_RANGE[1]:
        raise LabError("--mtu %r is out of range %d..%d" % ((mtu,) + MTU_RANGE))


class Lab:
    """One lab, made by ``create`` or found again by ``load``; ``destroy`` takes it down."""

    def __init__(self, state):
        self.state = state

    # -- what it is -----------------------------------------------------------------------------
    name = property(lambda self: self.state["name"])
    addresses = property(lambda self: list(self.state["addresses"]))
    host_namespaces = property(lambda self: list(self.state["host_namespaces"]))
    bridge_namespace = property(lambda self: self.state["bridge_namespace"])
    hostfile = property(lambda self: self.state["hostfile"])
    hook = property(lambda self: self.state["hook"])
    rate_bits = property(lambda self: self.state["rate_bits"])
    delay = property(lambda self: self.state["delay"])
    state_path = property(lambda self: os.path.join(self.state["dir"], saved.STATE_FILE))

    def all_namespaces(self):
        return self.host_namespaces + [self.bridge_namespace]

    # -- making and taking down -----------------------------------------------------------------
    @classmethod
    def create(cls, hosts, bandwidth, latency="0", hostfile=None, port=DEFAULT_PORT,
               mtu=DEFAULT_MTU, persistent=False, made=None):
        """Make a lab of ``hosts`` hosts whose links run at ``bandwidth`` with frames of ``mtu``
        bytes, and whose hosts are ``latency`` apart (one way). The input is checked before
        anything is made; a failure half way takes down what was made and raises LabError
        (UnitError for a rate or delay).
        ``persistent``: the lab outlives this process (``up``); otherwise a later ``down
        --stale`` removes it once this process is gone. ``made``: a list the lab is appended
        to before its first namespace, for a caller whose signal handler may interrupt this."""
        rate, delay = parse_rate(bandwidth), parse_delay(latency)
        _check_counts(hosts, port, mtu)
        system.require_root_and_tools()
        name, n = _unused_name()
        root = saved.state_root()
        folder = os.path.join(root, name)
        try:
            os.makedirs(root, mode=0o700, exist_ok=True)
            os.mkdir(folder, 0o700)
        except OSError as exc:
            raise LabError("cannot make the lab's state folder %s: %s; nothing was created"
                           % (folder, exc.strerror)) from None
        addresses = ["%s.%d.%d" % (NETWORK, n % 256, i + 1) for i in range(hosts)]
        state = {"name": name, "dir": folder, "pid": os.getpid(),
                 "pid_start": saved.process_start(os.getpid()), "persistent": bool(persistent),
                 "hosts": hosts, "rate_bits": rate, "delay": delay, "bandwidth": str(bandwidth),
                 "latency": str(latency), "interface": INTERFACE, "addresses": addresses,
                 "host_namespaces": ["%s-h%d" % (name, i) for i in range(hosts)],
                 "bridge_namespace": "%s-br" % name, "port": port, "mtu": mtu,
                 "hostfile": os.path.abspath(hostfile) if hostfile else
                 os.path.join(folder, "hosts"),
                 "hostfile_written": False, "hook": os.path.join(folder, "enter-host"),
                 "complete": False}
        saved.write(state)          # before the first namespace: down finds a half-made lab
        lab = cls(state)
        if made is not None:
            made.append(lab)
        try:
            lab._build()
        except BaseException:
            lab.destroy(quiet=True)
            raise
        return lab

    def _add_namespace(self, ns):
        system.run("ip", "netns", "add", ns)
        system.run("ip", "-n", ns, "link", "set", "lo", "up")
        # no IPv6: its neighbour and router chatter would run the counters without a job
        system.run("ip", "netns", "exec", ns, "/bin/sh", "-c",
                   "echo 1 > /proc/sys/net/ipv6/conf/all/disable_ipv6; "
                   "echo 1 > /proc/sys/net/ipv6/conf/default/disable_ipv6", check=False)

    def _build(self):
        br, rate, delay = self.bridge_namespace, self.rate_bits, self.delay
        mtu = self.state["mtu"]
        self._add_namespace(br)
        # no multicast snooping: its IGMP reports would reach every host with no job running
        system.run("ip", "-n", br, "link", "add", BRIDGE, "mtu", mtu, "type", "bridge",
                   "forward_delay", "0", "mcast_snooping", "0")
        system.run("ip", "-n", br, "link", "set", BRIDGE, "up")
        for i, (ns, address) in enumerate(zip(self.host_namespaces, self.addresses)):
            port = "h%d" % i
            self._add_namespace(ns)
            system.run("ip", "-n", br, "link", "add", port, "mtu", mtu, "type", "veth", "peer",
                       "name", INTERFACE, "netns", ns, "mtu", mtu)
            for where, device in ((ns, INTERFACE), (br, port)):
                # one frame per packet, as on a wire: no 64 KB segments through the counters
                system.run("ip", "-n", where, "link", "set", device, "gso_max_segs", "1")
                for command in shaping.link_commands(where, device, rate, delay):
                    _shape(command)
            system.run("ip", "-n", br, "link", "set", port, "master", BRIDGE, "up")
            system.run("ip", "-n", ns, "addr", "add", address + "/24", "dev", INTERFACE)
            system.run("ip", "-n", ns, "link", "set", INTERFACE, "up")
        hook = saved.hook_text(self.name, self.addresses, self.host_namespaces,
                               system.tool("ip"))
        _write(self.hook, hook, 0o700, "the lab's launch hook")
        _write(self.hostfile, saved.hostfile_text(self.addresses, self.state["port"]), 0o644,
               "host file")
        self.state["hostfile_written"] = self.state["complete"] = True
        saved.write(self.state)

    def destroy(self, quiet=False):
        """Stop what still runs in the lab, delete its namespaces (and with them its links),
        its host file and its state. LabError if a namespace outlives this (the state stays, so
        ``down`` can try again)."""
        mine = self.all_namespaces()
        _stop_processes(mine)
        for ns in mine:
            system.run("ip", "netns", "del", ns, check=False)
        left = sorted(set(mine) & set(namespaces()))
        if left:
            if quiet:
                return
            raise LabError("lab %s: namespaces %s could not be deleted (see `ip netns pids`); "
                           "try `netlab down %s` again" % (self.name, ", ".join(left), self.name))
        if self.state.get("hostfile_written") and \
                os.path.dirname(self.hostfile) != self.state["dir"]:
            try:
                os.remove(self.hostfile)
            except OSError:
                pass
        shutil.rmtree(self.state["dir"], ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.destroy(quiet=exc[0] is not None)

    # -- using it ---------------------------------------------------------------------------------
    def env(self, base=None):
        """The environment of a command run in the lab: mpiexec (hydra) starts each host's
        proxy through the lab's hook, inside that host's namespace, and MPICH talks TCP over
        ``eth0`` (UCX or libfabric, whichever netmod it picks); shared memory stays within a
        host."""
        env = dict(os.environ if base is None else base)
        env.update({STATE_ENV: self.state_path, HOSTFILE_ENV: self.hostfile,
                    "HYDRA_LAUNCHER": "ssh", "HYDRA_LAUNCHER_EXEC": self.hook,
                    "HYDRA_IFACE": INTERFACE,
                    "UCX_TLS": "tcp,self", "UCX_NET_DEVICES": INTERFACE,
                    "FI_PROVIDER": "tcp", "FI_TCP_IFACE": INTERFACE})
        return env

    def command(self, argv, host=0):
        """``argv`` run inside host ``host``'s namespace (``{hostfile}`` in an argument
        becomes the lab's host file)."""
        return [system.tool("ip") or "ip", "netns", "exec", self.host_namespaces[host]] + \
            [str(a).replace("{hostfile}", self.hostfile) for a in argv]

    def wire_bytes(self):
        """[HostBytes] now: what each host's eth0 has sent (tx) and received (rx) since the lab
        was made, Ethernet, IP and TCP headers included."""
        out = []
        for i, (ns, address) in enumerate(zip(self.host_namespaces, self.addresses)):
            text = system.run("ip", "-n", ns, "-s", "-j", "link", "show", "dev", INTERFACE)
            stats = json.loads(text)[0]["stats64"]
            out.append(HostBytes(i, address, stats["tx"]["bytes"], stats["rx"]["bytes"],
                                 stats["tx"]["packets"], stats["rx"]["packets"]))
        return out

    @classmethod
    def load(cls, name_or_path):
        """The lab a name or a state file names (LabError when there is none)."""
        if os.path.isfile(str(name_or_path)):
            return cls(saved.read(name_or_path))
        labs = saved.saved_labs()
        if name_or_path not in labs:
            raise LabError("no lab named %r (labs here: %s)"
                           % (name_or_path, ", ".join(sorted(labs)) or "none"))
        return cls(labs[name_or_path])


def difference(after, before):
    """[HostBytes] counted between two ``wire_bytes()`` readings."""
    return [HostBytes(a.host, a.address, a.tx_bytes - b.tx_bytes, a.rx_bytes - b.rx_bytes,
                      a.tx_packets - b.tx_packets, a.rx_packets - b.rx_packets)
            for a, b in zip(after, before)]


def _shape(command):
    try:
        system.run(*command)
    except LabError as exc:
        if "netem" in command and "unknown" in str(exc):
            raise LabError("--latency needs tc's netem queue, which this kernel lacks (it is "
                           "built without CONFIG_NET_SCH_NETEM, or sch_netem is not loaded): "
                           "leave --latency out or load the module") from None
        raise


def _write(path, text, mode, what):
    tmp = "%s.%d.tmp" % (path, os.getpid())
    try:
        with open(tmp, "w") as f:
            f.write(text)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except OSError as exc:
        try:
            os.remove(tmp)
        except OSError:
            pass
        raise LabError("cannot write the %s %s: %s" % (what, path, exc.strerror)) from None


def _stop_processes(names, grace=3.0):
    """TERM, then KILL after ``grace`` seconds, every process still inside these namespaces
    (ranks or proxies a failed command left behind)."""
    pids = set()
    for ns in names:
        out = system.run("ip", "netns", "pids", ns, check=False) or ""
        pids.update(int(p) for p in out.split() if p.isdigit() and int(p) != os.getpid())
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in list(pids):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pids.discard(pid)
        deadline = time.monotonic() + grace
        while pids and time.monotonic() < deadline:
            pids = {p for p in pids if saved.process_start(p) is not None
                    and not _is_zombie(p)}
            time.sleep(0.05)
        if not pids:
            return


def _is_zombie(pid):
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return True


def labs():
    """[Lab] of every lab with a state here."""
    return [Lab(s) for _, s in sorted(saved.saved_labs().items())]


def stale_labs():
    """Labs a ``run`` made whose process is gone (killed before it could take them down)."""
    return [lab for lab in labs() if not lab.state.get("persistent")
            and not saved.owner_alive(lab.state)]


def stray_namespaces():
    """Namespaces named like a lab's whose making process is gone and that no state names (a
    crash between ``ip netns add`` and the state write cannot happen, but an older state folder
    may have been removed by hand)."""
    known = {ns for lab in labs() for ns in lab.all_namespaces()}
    out = []
    for ns in namespaces():
        parts = ns.split("-")
        if ns in known or len(parts) < 4 or parts[0] != saved.PREFIX or not parts[1].isdigit():
            continue
        if saved.process_start(int(parts[1])) is None:
            out.append(ns)
    return out


def remove_namespaces(names):
    _stop_processes(names)
    for ns in names:
        system.run("ip", "netns", "del", ns, check=False)
