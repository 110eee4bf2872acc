"""netlab: hosts on a real, shaped network on one machine. The rate and delay grammar; a lab
made and taken down with nothing left behind (by `up`/`down`, by `run` when its command
fails, when it gets SIGINT, when its setup fails half way, and by `down --stale` after a run
was killed); one clear line for a non-root user, a bad bandwidth and an unreachable host;
shaping that really holds a transfer to the rate; and a 2-host training job through
run_local.py whose links carried the planner's predicted bytes plus a measured overhead.

The tests that make namespaces need root and iproute2 (`ip`, `tc`) and skip otherwise."""
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import pytest

from poseidon_caffe import netlab
from poseidon_caffe.netlab import state as saved
from poseidon_caffe.launch.hosts import read_localserver
from poseidon_caffe.tools.netlab import main as netlab_main

PY = sys.executable
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NETLAB = [PY, os.path.join(ROOT, "scripts", "netlab.py")]


def env(**extra):
    e = dict(os.environ, POSEIDON_NO_PROGRESS="1", **extra)
    e["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p)
    return e


# -- the grammar ----------------------------------------------------------------------------------
@pytest.mark.parametrize("text, bits", [
    ("100mbit", 100 * 10 ** 6), ("1gbit", 10 ** 9), ("10gbit", 10 ** 10), ("500kbit", 500000),
    ("12.5MB/s", 100 * 10 ** 6), ("1Gbit/s", 10 ** 9), ("1.5mbit", 1500000), ("64bit", 64),
    (" 2tbit ", 2 * 10 ** 12), ("800KB/s", 6400000), ("1GB/s", 8 * 10 ** 9),
    (".5gbit", 5 * 10 ** 8), ("3B/s", 24)])
def test_rates_parse(text, bits):
    assert netlab.parse_rate(text) == bits


@pytest.mark.parametrize("text", ["100mbps", "fast", "", "-1gbit", "0mbit", "1e9bit",
                                  "12.5mb/s", "12.5MB", "mbit", "1,5mbit", "1gbit/h", "4bit",
                                  "100 Mb"])
def test_bad_rates_are_one_line_naming_the_string(text):
    with pytest.raises(netlab.UnitError) as error:
        netlab.parse_rate(text)
    message = str(error.value)
    assert "\n" not in message and repr(text) in message


@pytest.mark.parametrize("text, seconds", [("5ms", 0.005), ("0.5ms", 0.0005), ("200us", 0.0002),
                                           ("0", 0.0), ("1s", 1.0), ("0ms", 0.0)])
def test_delays_parse(text, seconds):
    assert netlab.parse_delay(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["5", "5 sec", "-1ms", "fast", "1h", "ms"])
def test_bad_delays_are_one_line_naming_the_string(text):
    with pytest.raises(netlab.UnitError) as error:
        netlab.parse_delay(text)
    assert "\n" not in str(error.value) and repr(text) in str(error.value)


@pytest.mark.parametrize("bits, text", [(10 ** 9, "1gbit"), (100 * 10 ** 6, "100mbit"),
                                        (1500000, "1500kbit"), (64, "64bit")])
def test_rates_are_written_as_tc_reads_them(bits, text):
    assert netlab.rate_text(bits) == text and netlab.parse_rate(text) == bits


def test_a_bandwidth_that_does_not_parse_is_one_line_and_makes_nothing(capsys):
    code = netlab_main(["run", "--hosts", "2", "--bandwidth", "100mbps", "--", "true"])
    err = capsys.readouterr().err
    assert code == 2
    assert err == ("netlab: bandwidth '100mbps' does not parse: expected a number and a unit, "
                   "e.g. 100mbit, 1gbit, 500kbit or 12.5MB/s\n")


def test_the_host_file_is_poseidons_and_the_hook_maps_every_address(tmp_path):
    addresses = ["198.18.3.1", "198.18.3.2", "198.18.3.3"]
    path = tmp_path / "hosts"
    path.write_text(saved.hostfile_text(addresses, 9999))
    assert read_localserver(str(path)) == [(0, "198.18.3.1", 9999), (1, "198.18.3.2", 9999),
                                           (2, "198.18.3.3", 9999)]
    # the hook, with `ip` replaced by echo: which namespace each host's command goes to
    hook = tmp_path / "hook"
    hook.write_text(saved.hook_text("lab", addresses, ["ns0", "ns1", "ns2"], "echo"))
    hook.chmod(0o700)
    out = subprocess.run([str(hook), "-x", "198.18.3.2", "hydra_pmi_proxy", "--proxy-id", "1"],
                         capture_output=True, text=True)
    assert out.returncode == 0
    assert out.stdout == "netns exec ns1 /bin/sh -c hydra_pmi_proxy --proxy-id 1\n"
    out = subprocess.run([str(hook), "-x", "198.18.3.9", "x"], capture_output=True, text=True)
    assert out.returncode == 255
    assert out.stderr == "netlab lab: 198.18.3.9 is not one of its hosts\n"


# -- labs made and taken down -------------------------------------------------------------------
def _can_make_namespaces():
    if os.geteuid() != 0:
        return "network namespaces need root"
    if not (netlab.system.tool("ip") and netlab.system.tool("tc")):
        return "iproute2's ip and tc are not installed"
    probe = "%s-probe-%d" % (saved.PREFIX, os.getpid())
    made = subprocess.run([netlab.system.tool("ip"), "netns", "add", probe], capture_output=True,
                          text=True)
    if made.returncode:
        return "ip netns add fails here: %s" % made.stderr.strip()
    subprocess.run([netlab.system.tool("ip"), "netns", "del", probe])
    return None


_WHY_NOT = _can_make_namespaces()
needs_root = pytest.mark.skipif(_WHY_NOT is not None, reason=_WHY_NOT or "")


def left_of(name):
    """What a lab of this name left behind: its namespaces and its state folder."""
    spaces = [ns for ns in netlab.namespaces() if ns.startswith(name + "-")]
    folders = [os.path.join(root, name) for root in saved.all_roots()
               if os.path.exists(os.path.join(root, name))]
    return spaces + folders


def running(pid):
    """Whether process ``pid`` exists and is not a zombie waiting for its parent."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def lab_name(text):
    return re.search(r"lab (%s-\d+-\d+)" % saved.PREFIX, text).group(1)


def mine():
    """Namespaces and state folders of labs this process made."""
    prefix = "%s-%d-" % (saved.PREFIX, os.getpid())
    return sorted([ns for ns in netlab.namespaces() if ns.startswith(prefix)] +
                  [name for root in saved.all_roots() if os.path.isdir(root)
                   for name in os.listdir(root) if name.startswith(prefix)])


@needs_root
def test_up_and_down_leave_nothing_behind_and_the_lab_has_no_way_out(capsys):
    before = set(netlab.namespaces())
    assert netlab_main(["up", "--hosts", "3", "--bandwidth", "1gbit"]) == 0
    name = lab_name(capsys.readouterr().out)
    try:
        assert set(netlab.namespaces()) - before >= {name + "-h0", name + "-h1", name + "-h2",
                                                     name + "-br"}
        lab = netlab.Lab.load(name)
        hosts = read_localserver(lab.hostfile)
        assert [ip for _, ip, _ in hosts] == lab.addresses and len(hosts) == 3
        assert all(ip.startswith("198.18.") for ip in lab.addresses)
        # the only route of a host is its lab's subnet: nothing leaves the lab
        routes = subprocess.run([netlab.system.tool("ip"), "-n", name + "-h0", "-4", "route"],
                                capture_output=True, text=True).stdout.splitlines()
        assert [r.split()[0] for r in routes] == [lab.addresses[0].rsplit(".", 1)[0] + ".0/24"]
        # exec runs in host 0, which reaches host 2 (a refused connection is an answer)
        probe = ("import socket\ntry:\n socket.create_connection((%r, 9), timeout=5)\n"
                 "except ConnectionRefusedError:\n print('answered')" % lab.addresses[2])
        out = subprocess.run(NETLAB + ["exec", "--lab", name, "--", PY, "-c", probe],
                             capture_output=True, text=True, env=env(), timeout=60)
        assert out.stdout == "answered\n", out.stderr
    finally:
        code = netlab_main(["down", name])
    assert code == 0 and capsys.readouterr().err == "netlab: lab %s taken down\n" % name
    assert left_of(name) == []


@needs_root
def test_run_takes_the_lab_down_when_the_command_fails(capfd):
    code = netlab_main(["run", "--hosts", "2", "--bandwidth", "10mbit", "--",
                        "sh", "-c", "cat {hostfile}; exit 3"])
    out, err = capfd.readouterr()
    assert code == 3
    name = lab_name(err)
    assert re.match(r"0 198\.18\.\d+\.1 9999\n1 198\.18\.\d+\.2 9999\n$", out)
    assert "lab %s taken down; sh exited with status 3" % name in err
    assert left_of(name) == []


@needs_root
def test_sigint_to_netlab_run_reaches_the_command_and_takes_the_lab_down():
    proc = subprocess.Popen(NETLAB + ["run", "--hosts", "2", "--bandwidth", "10mbit", "--",
                                      "sh", "-c", "echo started; sleep 60"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env())
    try:
        assert proc.stdout.readline() == "started\n"
        name = "%s-%d-0" % (saved.PREFIX, proc.pid)
        assert name + "-h1" in netlab.namespaces()
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 128 + signal.SIGINT, err
    assert "lab %s taken down" % name in err
    assert left_of(name) == []


@needs_root
def test_a_setup_that_fails_half_way_takes_down_what_it_made(tmp_path, capsys):
    before = mine()
    hostfile = tmp_path / "no_such_folder" / "hosts"       # written after the namespaces
    code = netlab_main(["run", "--hosts", "2", "--bandwidth", "1gbit", "--hostfile",
                        str(hostfile), "--", "true"])
    assert code == 1
    assert capsys.readouterr().err == ("netlab: cannot write the host file %s: No such file or "
                                       "directory\n" % hostfile)
    assert mine() == before


@needs_root
def test_down_stale_cleans_up_after_a_killed_run():
    proc = subprocess.Popen(NETLAB + ["run", "--hosts", "2", "--bandwidth", "10mbit", "--",
                                      "sh", "-c", "echo started; sleep 60"],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                            env=env())
    try:
        assert proc.stdout.readline() == "started\n"
    finally:
        proc.kill()                             # no chance to take anything down
        proc.wait()
    name = "%s-%d-0" % (saved.PREFIX, proc.pid)
    assert name + "-h0" in netlab.namespaces()
    sleeper = subprocess.run([netlab.system.tool("ip"), "netns", "pids", name + "-h0"],
                             capture_output=True, text=True).stdout.split()
    assert sleeper                              # the command outlived netlab
    down = subprocess.run(NETLAB + ["down", "--stale"], capture_output=True, text=True,
                          env=env(), timeout=60)
    assert down.returncode == 0 and "lab %s taken down" % name in down.stderr
    assert left_of(name) == []
    assert not [p for p in sleeper if running(int(p))]


# netlab's command run as user nobody (uid 65534): the project is loaded while still root, so
# the test holds wherever the checkout and its environment are closed to that user
AS_NOBODY = r"""
import os, sys
from poseidon_caffe.tools.netlab import main
os.setgroups([])
os.setgid(65534)
os.setuid(65534)                       # real and effective: no way back to root
sys.exit(main(sys.argv[1:]))
"""


@needs_root
def test_a_user_other_than_root_gets_one_line_and_nothing_is_made(tmp_path):
    before = set(netlab.namespaces())
    proc = subprocess.run([PY, "-c", AS_NOBODY, "up", "--hosts", "2", "--bandwidth", "1gbit"],
                          capture_output=True, text=True, env=env(), timeout=60,
                          cwd=str(tmp_path))
    assert proc.returncode == 1, proc.stderr
    assert proc.stderr == ("netlab: netlab needs root to make network namespaces (this process "
                           "runs as uid 65534); nothing was created\n")
    assert not [ns for ns in set(netlab.namespaces()) - before
                if ns.startswith("%s-%d-" % (saved.PREFIX, proc.pid))]


# -- shaping ------------------------------------------------------------------------------------
RECEIVER = r"""
import socket, sys
s = socket.socket(); s.bind((sys.argv[1], 5001)); s.listen(1)
print("listening", flush=True)
c, _ = s.accept(); n = 0
while True:
    b = c.recv(1 << 16)
    if not b: break
    n += len(b)
print(n, flush=True)
"""

SENDER = r"""
import socket, sys, time
c = socket.create_connection((sys.argv[1], 5001)); data = b"x" * int(sys.argv[2])
t = time.perf_counter(); c.sendall(data); c.shutdown(socket.SHUT_WR); c.recv(1)
print(time.perf_counter() - t)
"""


def _class_bytes(ns, device):
    """Bytes the rate class 1:1 on ``device`` has sent (tc's text: this tc writes no JSON for
    HTB classes)."""
    out = subprocess.run([netlab.system.tool("tc"), "-n", ns, "-s", "class", "show", "dev",
                          device], capture_output=True, text=True, check=True).stdout
    return int(re.search(r"class htb 1:1 .*?\n\s*Sent (\d+) bytes", out).group(1))


@needs_root
def test_shaping_holds_a_transfer_to_the_rate_at_both_ends_of_the_links():
    """2.5 MB from host 0 to host 1 at 20mbit takes at least a second (less is impossible on a
    link shaped to the rate, however loaded the machine; the figure itself goes to the report);
    the bytes went through the rate class on host 0's eth0 and on host 1's bridge port, and
    the links' counters count them with their headers."""
    payload = 2500000
    with netlab.Lab.create(2, "20mbit") as lab:
        receiver = subprocess.Popen(lab.command([PY, "-c", RECEIVER, lab.addresses[1]], host=1),
                                    stdout=subprocess.PIPE, text=True)
        try:
            assert receiver.stdout.readline() == "listening\n"
            before = lab.wire_bytes()
            sent = subprocess.run(lab.command([PY, "-c", SENDER, lab.addresses[1], str(payload)]),
                                  capture_output=True, text=True, timeout=120)
            assert sent.returncode == 0, sent.stderr
            assert int(receiver.stdout.readline()) == payload
        finally:
            receiver.kill()
            receiver.wait()
        wire = netlab.difference(lab.wire_bytes(), before)
        seconds = float(sent.stdout)
        floor = payload * 8 / 20e6
        assert seconds >= 0.9 * floor, "%.1f Mbit/s through a 20mbit link" % (
            payload * 8 / seconds / 1e6)
        # what host 0 sent is what host 1 received, payload and TCP/IP/Ethernet headers
        assert wire[0].tx_bytes == wire[1].rx_bytes
        assert payload < wire[0].tx_bytes < payload * 1.06
        assert _class_bytes(lab.host_namespaces[0], "eth0") >= payload
        assert _class_bytes(lab.bridge_namespace, "h1") >= payload


CONNECT = r"""
import socket, sys, time
t = time.perf_counter()
try:
    socket.create_connection((sys.argv[1], 9), timeout=10)
except ConnectionRefusedError:
    print(time.perf_counter() - t)
"""


@needs_root
def test_a_latency_delays_every_round_trip_or_is_refused_in_one_line_without_netem():
    """20ms one way: a TCP connection refused by host 1 takes a round trip, at least 40 ms
    (less is impossible through the delay, however loaded the machine). A kernel without
    netem (this project's CI machines among them) refuses the latency in one line, having
    taken down what it made."""
    before = mine()
    try:
        lab = netlab.Lab.create(2, "100mbit", "20ms")
    except netlab.LabError as exc:
        assert "netem" in str(exc) and "\n" not in str(exc)
        assert mine() == before
        return
    with lab:
        out = subprocess.run(lab.command([PY, "-c", CONNECT, lab.addresses[1]]),
                             capture_output=True, text=True, timeout=60)
        assert float(out.stdout) >= 0.04, out.stderr
    assert mine() == before


# -- across hosts -------------------------------------------------------------------------------
@needs_root
def test_a_host_file_naming_an_unreachable_host_is_one_line_before_mpiexec(tmp_path):
    with netlab.Lab.create(2, "100mbit") as lab:
        absent = lab.addresses[1].rsplit(".", 1)[0] + ".9"
        bad = tmp_path / "hosts"
        bad.write_text("0 %s 9999\n1 %s 9999\n" % (lab.addresses[0], absent))
        proc = subprocess.run(lab.command([PY, os.path.join(ROOT, "examples", "mnist",
                                                            "run_local.py"), str(bad)]),
                              capture_output=True, text=True, env=lab.env(env()), timeout=60)
    assert proc.returncode == 2
    assert proc.stdout == ""                   # mpiexec's command line is never printed
    assert re.fullmatch(r"%s: client 1's host %s is unreachable from here \([^\n]+\)\n"
                        % (re.escape(str(bad)), re.escape(absent)), proc.stderr), proc.stderr


RUN_LOCAL = """import sys
sys.path.insert(0, %r)
from poseidon_caffe.tools.launch import run_local_script
solver = %r
devices = [0]
svb = True
dataset = "lab"
use_gpu = False
sys.exit(run_local_script(globals(), %r))
"""

# LeNet's parameters: conv1 20x1x5x5 + 20, conv2 50x20x5x5 + 50, ip1 500x800 + 500, ip2 10x500 + 10
LENET_WEIGHTS = {"conv1": (25, 20), "conv2": (500, 50), "ip1": (800, 500), "ip2": (500, 10)}


def predicted_bytes_per_host(batch, hosts=2):
    """DESIGN.md's prices, with svb: ip1 and ip2 weights as sufficient factors, 2K(P-1)(M+N)
    floats; every other blob (conv weights, all biases) through the shards, one per host,
    2MN(P+S-2)/S floats."""
    P = S = hosts
    total = 0
    for name, (M, N) in LENET_WEIGHTS.items():
        if name.startswith("ip"):
            total += 2 * batch * (P - 1) * (M + N)
        else:
            total += 2 * M * N * (P + S - 2) / S
        total += 2 * N * (P + S - 2) / S             # the bias: N values
    return 4 * total


@needs_root
@pytest.mark.mpi
def test_two_hosts_train_through_run_local_and_the_links_carry_the_predicted_bytes(tmp_path):
    """LeNet, 8 iterations, 1 rank on each of 2 lab hosts, started by a run_local.py with the
    host file netlab wrote. Every host's link carried at least the planner's prediction for 8
    iterations, and at most that plus the overhead measured for this job: 5.6-6.6% per
    iteration (TCP/IP and Ethernet headers, 66 bytes a 1448-byte segment, acknowledgements,
    MPI's own headers), allowed 15%; and a fixed part measured at 1.9 MB (the weights sent
    once at start, shards gathered for the final snapshot, MPI's setup), allowed 2 x the
    weights + 512 KB."""
    from jobs import write_lenet_job
    from poseidon_caffe.data.mnist_embedded import ensure_mnist_lmdbs
    iters, batch = 8, 32
    train_db, test_db = ensure_mnist_lmdbs(str(tmp_path / "digits"))
    solver = write_lenet_job(tmp_path, "lenet", batch, train_db, test_db, max_iter=iters)
    script = tmp_path / "run_local.py"
    script.write_text(RUN_LOCAL % (ROOT, solver, str(tmp_path)))
    result = netlab.run_across(2, "1gbit", [PY, str(script), "{hostfile}"], env=env(),
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=240)
    assert result.returncode == 0, result.stdout[-4000:]
    assert left_of(result.name) == []
    out = tmp_path / "output" / "caffe.lab.S0.M2.T1"
    assert "Optimization Done." in result.stdout
    # two hosts as MPI sees them (no shared memory between them), one worker each
    stats = json.loads((out / "caffe_stats.yaml").read_text())["workers"]
    assert sorted(w["host"] for w in stats) == [0, 1]
    predicted = predicted_bytes_per_host(batch)
    assert all(sum(w["predicted"].values()) == predicted for w in stats)
    weights = 4 * sum(M * N + N for M, N in LENET_WEIGHTS.values())
    for host in result.wire:
        wire = host.tx_bytes + host.rx_bytes
        assert predicted * iters <= wire <= predicted * iters * 1.15 + 2 * weights + 512 * 1024, (
            "host %d: %d bytes on the wire, predicted %d for %d iterations"
            % (host.host, wire, predicted * iters, iters))
    # one link's sending is the other's receiving
    assert abs(result.wire[0].tx_bytes - result.wire[1].rx_bytes) < 4096
