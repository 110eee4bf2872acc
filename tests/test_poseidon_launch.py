"""Poseidon's way of launching, on real files and real mpiexec runs over loopback:
``run_local.py <client_id> <hostfile>`` once per host (and ``poseidon-caffe train -hostfile
-client_id`` as Poseidon's train scripts run caffe_main), joined into one MPI job; caffe_main's
flags; Poseidon's output folder (per-client log folders, stats file, .netoutputs); and each
client reading its data partition <source>_<client_id>."""
import json
import os
import socket
import subprocess
import sys

import numpy as np
import pytest

from poseidon_caffe import cli
from poseidon_caffe.io import read_net_weights
from poseidon_caffe.launch import join
from poseidon_caffe.launch.hosts import read_localserver
from poseidon_caffe.tools import launch

from jobs import write_float_db

PY = sys.executable
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MPIEXEC = os.path.join(os.path.dirname(PY), "mpiexec")
ENV = dict(os.environ, POSEIDON_NO_PROGRESS="1", POSEIDON_JOIN_TIMEOUT="60")
X = np.array([[0.5, -1.0, 2.0], [1.5, 0.25, -0.5], [-1.0, 1.0, 0.5], [0.0, 2.0, 1.0]],
             dtype=np.float32)
LR, ITERS = 0.05, 3

NET = """name: "tiny"
layer { name: "data" type: "Data" top: "x" top: "y"
        data_param { source: "%s" batch_size: 1 backend: LMDB } }
layer { name: "ip" type: "InnerProduct" bottom: "x" top: "p"
        inner_product_param { num_output: 1
          weight_filler { type: "constant" value: 0.2 }
          bias_filler { type: "constant" value: 0 } } }
layer { name: "loss" type: "EuclideanLoss" bottom: "p" bottom: "y" top: "loss" }
"""


def free_port():
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


@pytest.fixture
def job(tmp_path):
    """A tiny job whose two clients have their own partitions (labels 0.. and 10.., so the
    weights tell which partition each client read) and a two-client loopback host file."""
    write_float_db(tmp_path / "db", X, [0, 0, 0, 0])
    write_float_db(tmp_path / "db_0", X, [1, 2, 3, 4])
    write_float_db(tmp_path / "db_1", X, [5, 6, 7, 8])
    (tmp_path / "net.prototxt").write_text(NET % (tmp_path / "db"))
    (tmp_path / "solver.prototxt").write_text(
        'net: "%s"\nbase_lr: %g lr_policy: "fixed"\nmax_iter: %d display: 1\n'
        'snapshot_prefix: "%s"\n' % (tmp_path / "net.prototxt", LR, ITERS, tmp_path / "m"))
    (tmp_path / "hosts").write_text("0 127.0.0.1 %d\n1 localhost %d\n" % (free_port(),
                                                                         free_port()))
    return tmp_path


def expected_weights():
    """Plain SGD on the averaged gradient; client c reads its partition in order."""
    labels = [np.array([1, 2, 3, 4.]), np.array([5, 6, 7, 8.])]
    w, b = np.full(3, 0.2), 0.0
    for it in range(ITERS):
        gw, gb = np.zeros(3), 0.0
        for c in range(2):
            err = X[it] @ w + b - labels[c][it]
            gw, gb = gw + err * X[it] / 2, gb + err / 2
        w, b = w - LR * gw, b - LR * gb
    return w, b


def check_trained(tmp_path):
    _, weights = read_net_weights(str(tmp_path / ("m_iter_%d.caffemodel" % ITERS)))
    w, b = expected_weights()
    np.testing.assert_allclose(weights["ip"][0].ravel(), w, rtol=1e-5)
    np.testing.assert_allclose(weights["ip"][1].ravel(), [b], rtol=1e-5, atol=1e-6)


def run_clients(commands, cwd):
    """Start client 1 first (it waits for client 0, as Poseidon's name node), then client 0."""
    follower = subprocess.Popen(commands[1], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, cwd=cwd, env=ENV)
    leader = subprocess.run(commands[0], capture_output=True, text=True, timeout=120, cwd=cwd,
                            env=ENV)
    out1, _ = follower.communicate(timeout=60)
    return leader, follower.returncode, out1


RUN_LOCAL = """import sys
sys.path.insert(0, %r)
from poseidon_caffe.tools.launch import run_local
# ---- settings, with Poseidon's names ----
solver = %r
snapshot = ""
devices = [0]
table_staleness = 0
svb = False
num_table_threads = len(devices) + 1
num_rows_per_table = 1
num_comm_channels_per_client = 1
consistency_model = "SSPPush"
init_thread_access_table = True
sys.exit(run_local(dict(solver=solver, snapshot=snapshot, devices=devices,
                        table_staleness=table_staleness, svb=svb,
                        num_table_threads=num_table_threads,
                        num_rows_per_table=num_rows_per_table,
                        num_comm_channels_per_client=num_comm_channels_per_client,
                        consistency_model=consistency_model,
                        init_thread_access_table=init_thread_access_table,
                        dataset="tiny", use_gpu=False), repo_root=%r))
"""


@pytest.mark.mpi
@pytest.mark.parametrize("second", ["localhost", "127.0.0.1"])
def test_run_local_once_per_host_joins_one_job(job, second):
    script = job / "run_local.py"
    script.write_text(RUN_LOCAL % (ROOT, str(job / "solver.prototxt"), str(job)))
    hosts = job / "hosts"
    hosts.write_text(hosts.read_text().replace("localhost", second))
    leader, rc1, out1 = run_clients([[PY, str(script), "0", str(hosts)],
                                     [PY, str(script), "1", str(hosts)]], job)
    assert leader.returncode == 0, leader.stderr[-3000:] + leader.stdout[-3000:]
    assert rc1 == 0, out1[-3000:]
    assert "-launcher manual -hosts 127.0.0.1:1,%s:1 " % second in leader.stdout
    if second == "localhost":
        assert "Client 1 of 2: starting this host's ranks" in out1
    else:
        # hydra gives a host named twice one proxy: client 0's starts both clients' ranks
        assert "Client 1: an earlier client on this address starts its ranks" in out1
    check_trained(job)
    out = job / "output" / "caffe.tiny.S0.M2.T1"
    # Poseidon's layout: logs.<client_id>/, <dataset>.netoutputs, caffe_stats.yaml
    log0 = (out / "logs.0" / "caffe.rank0.log").read_text()
    log1 = (out / "logs.1" / "caffe.rank1.log").read_text()
    assert "Worker rank 1 of 2" in log1 and "db_1" in log1 and "db_0" in log0
    for text in (log0, log1):
        assert text.count("Bösen tuning flags accepted, no effect here: -num_table_threads=2 "
                          "-num_rows_per_table=1 -num_comm_channels_per_client=1 "
                          "-init_thread_access_table=true") == 1
    rows = (out / "tiny.netoutputs").read_text().splitlines()
    assert rows[0] == "iteration,seconds,smoothed_loss,loss" and len(rows) == 1 + ITERS
    stats = json.loads((out / "caffe_stats.yaml").read_text())
    assert [w["client_id"] for w in stats["workers"]] == [0, 1]
    assert all(w["iterations"] == ITERS for w in stats["workers"])


@pytest.mark.mpi
def test_train_with_hostfile_and_client_id_joins_like_caffe_main(job):
    base = [PY, "-m", "poseidon_caffe.cli", "train", "--solver", str(job / "solver.prototxt"),
            "--hostfile", str(job / "hosts"), "--num_clients", "2", "--table_staleness", "0",
            "--svb=false", "--consistency_model", "SSPPush"]
    leader, rc1, out1 = run_clients(
        [base + ["--client_id", "0", "--net_outputs", str(job / "out" / "tiny"),
                 "--stats_path", str(job / "out" / "caffe_stats.yaml")],
         base + ["--client_id", "1"]], job)
    assert leader.returncode == 0, leader.stderr[-3000:]
    assert rc1 == 0, out1[-3000:]
    check_trained(job)
    assert (job / "out" / "tiny.netoutputs").exists()
    assert len(json.loads((job / "out" / "caffe_stats.yaml").read_text())["workers"]) == 2


def test_per_host_dry_runs_show_the_leader_command_and_the_join(job, capsys):
    settings = dict(solver="s.prototxt", devices=[0], table_staleness=1, svb=True,
                    num_rows_per_table=256, dataset="imagenet", use_gpu=False)
    hosts = str(job / "hosts")
    port = int((job / "hosts").read_text().split()[2])
    assert launch.run_local(settings, ["0", hosts, "false", "--dry-run"], str(job)) == 0
    lead = capsys.readouterr().out
    assert " -launcher manual -hosts 127.0.0.1:1,localhost:1 " in lead
    assert lead.count("-client_id=0") == 1 and lead.count("-client_id=1") == 1
    assert lead.count("-staleness=1 ") == 2 and lead.count("-svb=true") == 2
    assert "-num_rows_per_table=256" in lead
    out = os.path.join(str(job), "output", "caffe.imagenet.S1.M2.T1")
    assert "-net_outputs=%s" % os.path.join(out, "imagenet") in lead
    assert "-stats_path=%s" % os.path.join(out, "caffe_stats.yaml") in lead
    assert launch.run_local(settings, ["1", hosts, "--dry-run"], str(job)) == 0
    assert capsys.readouterr().out == "client 1 joins client 0 at 127.0.0.1:%d\n" % port


@pytest.mark.parametrize("argv, message", [
    (["zero", "hosts"], "client id 'zero' is not an integer"),
    (["0", "hosts", "maybe"], "use-yarn is true or false"),
    (["7", "hosts"], "client id 7 is not in"),
    (["0", "hosts", "true", "x"], "expected at most 3 arguments, got 4: 0 "),
    (["--dry_run"], "unknown option '--dry_run' (the only option is --dry-run)"),
])
def test_run_local_argument_errors(job, capsys, argv, message):
    argv = [str(job / a) if a == "hosts" else a for a in argv]
    assert launch.run_local(dict(solver="s"), argv, str(job)) == 2
    err = capsys.readouterr().err
    assert message in err.splitlines()[-1]       # the last line says what was wrong


def test_run_local_help_prints_the_two_forms(capsys):
    assert launch.run_local(dict(solver="s"), ["--help"]) == 0
    out = capsys.readouterr().out
    assert "run_local.py [HOSTFILE]" in out and "run_local.py <client_id> <hostfile>" in out


def test_a_bad_join_timeout_is_one_line_naming_the_variable(job, monkeypatch, capsys):
    monkeypatch.setenv("POSEIDON_JOIN_TIMEOUT", "soon")
    assert launch.run_local(dict(solver="s.prototxt", use_gpu=False),
                              ["1", str(job / "hosts")], str(job)) == 1
    assert capsys.readouterr().err == ("POSEIDON_JOIN_TIMEOUT='soon' is not a number of seconds "
                                       "(expected a positive number, e.g. 120)\n")


def test_a_client_without_its_leader_names_the_address(job, monkeypatch):
    monkeypatch.setenv("POSEIDON_JOIN_TIMEOUT", "0.5")
    hosts = read_localserver(str(job / "hosts"))
    with pytest.raises(join.JoinError, match=r"client 1: client 0 does not answer at "
                                             r"127\.0\.0\.1:%d within 0\.5 s" % hosts[0][2]):
        join.run_client(1, hosts, ["mpiexec"])


def processes_naming(text):
    """The processes of this machine whose command line contains ``text``."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open("/proc/%s/cmdline" % pid, "rb") as f:
                line = f.read().decode(errors="replace")
            with open("/proc/%s/stat" % pid) as f:
                zombie = f.read().rsplit(")", 1)[1].split()[0] == "Z"
        except OSError:
            continue
        if text in line and not zombie:
            found.append(line.replace("\0", " "))
    return found


@pytest.mark.mpi
def test_a_client_that_never_joins_is_named_and_the_leader_ends(job):
    script = job / "run_local.py"
    script.write_text(RUN_LOCAL % (ROOT, str(job / "solver.prototxt"), str(job)))
    port = read_localserver(str(job / "hosts"))[0][2]
    # a bound for a hang, not a speed figure: the leader gives up after 3 s
    leader = subprocess.run([PY, str(script), "0", str(job / "hosts")], capture_output=True,
                            text=True, timeout=60, cwd=job,
                            env=dict(ENV, POSEIDON_JOIN_TIMEOUT="3"))
    assert leader.returncode == 1
    assert leader.stderr == ("clients 1 (localhost) did not join within 3 s (they connect to "
                             "client 0 at 127.0.0.1:%d)\n" % port)
    # mpiexec, waiting for the proxy that never connected, is ended with nothing of it left
    assert processes_naming(str(job / "solver.prototxt")) == []


def test_a_proxy_command_is_checked_before_it_runs():
    assert os.path.basename(join.local_proxy(["/x/hydra_pmi_proxy", "--proxy-id", "1",
                                              "--usize", "-1"])[0]) == "hydra_pmi_proxy"
    for bad in (["/bin/sh", "-c", "true"], ["hydra_pmi_proxy", "-c", "x"]):
        with pytest.raises(join.JoinError, match="not a hydra_pmi_proxy command"):
            join.local_proxy(bad)


def test_clients_on_one_address_share_its_proxy():
    hosts = [(0, "10.0.0.1", 1), (1, "10.0.0.2", 1), (2, "10.0.0.1", 1), (3, "10.0.0.3", 1)]
    assert join.proxy_owners(hosts) == {0: 0, 1: 1, 3: 2}
    # client 0 leads (Poseidon's name node) wherever its line is
    assert join.leader([(1, "10.0.0.2", 5), (0, "10.0.0.1", 7)]) == (0, "10.0.0.1", 7)


def flag_values(*argv):
    from poseidon_caffe.tools import flags
    values, _ = flags.parse(list(argv), cli.ALL_FLAGS)
    return values


def test_caffe_main_flags_parse_and_fold_into_this_projects():
    values = flag_values("--hostfile", "h", "--client_id", "1", "--num_clients", "2",
                         "--table_staleness", "3", "--svb=true", "--net_outputs", "o/x",
                         "--stats_path", "o/s.yaml", "--num_table_threads", "2",
                         "--num_rows_per_table", "256", "--num_comm_channels_per_client", "8",
                         "--consistency_model", "SSP", "--svb_timeout_ms", "10",
                         "--init_thread_access_table=true", "-ps_update=worker")
    notes = cli.poseidon_flags(values)
    assert values["staleness"] == 3 and values["svb"] is True
    assert values["client_id"] == 1 and values["num_clients"] == 2
    assert values["ps_update"] == "worker"
    assert notes == ["-consistency_model=SSP is served as SSPPush (the servers push fresh rows "
                     "to every client)",
                     "Bösen tuning flags accepted, no effect here: -num_table_threads=2 "
                     "-num_rows_per_table=256 -num_comm_channels_per_client=8 "
                     "-svb_timeout_ms=10 -init_thread_access_table=true"]
    assert cli.poseidon_flags(flag_values("-consistency_model=BSP")) == []


@pytest.mark.parametrize("argv, message", [
    (["-consistency_model=BSP", "-table_staleness=2"], "BSP is bulk-synchronous, but the "
                                                       "staleness is 2"),
    (["-consistency_model=LocalOOC"], "-consistency_model takes SSPPush, SSP, SSPAggr, BSP"),
    (["-staleness=1", "-table_staleness=2"], "-staleness=1 and -table_staleness=2 disagree"),
    (["-ps_update=average"], "-ps_update takes server or worker"),
    (["-table_staleness=-1"], "-staleness must be 0 or more"),
])
def test_caffe_main_flag_errors_are_one_line(argv, message, tmp_path, caplog):
    solver = tmp_path / "s.prototxt"
    solver.write_text('net: "n.prototxt" base_lr: 0.1\n')
    assert cli.main(["train", "-solver=%s" % solver] + argv) == 1
    errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert len(errors) == 1 and message in errors[0] and "\n" not in errors[0]


@pytest.mark.mpi
def test_table_staleness_and_outputs_act_under_mpiexec(job):
    proc = subprocess.run(
        [MPIEXEC, "-n", "2", PY, "-m", "poseidon_caffe.cli", "train",
         "--solver", str(job / "solver.prototxt"), "--table_staleness", "1",
         "--consistency_model", "SSPPush", "--net_outputs", str(job / "o" / "tiny"),
         "--stats_path", str(job / "o" / "caffe_stats.yaml"), "--num_clients", "1",
         "--svb_timeout_ms", "10"],
        capture_output=True, text=True, timeout=120, cwd=job, env=ENV)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stderr.count("no effect here: -svb_timeout_ms=10") == 1
    stats = json.loads((job / "o" / "caffe_stats.yaml").read_text())["workers"]
    assert [w["staleness"] for w in stats] == [1, 1]
    assert set(stats[0]["plan"].values()) == {"ps"}
    assert len((job / "o" / "tiny.netoutputs").read_text().splitlines()) == 1 + ITERS
    bad = subprocess.run(
        [MPIEXEC, "-n", "2", PY, "-m", "poseidon_caffe.cli", "train",
         "--solver", str(job / "solver.prototxt"), "--num_clients", "3"],
        capture_output=True, text=True, timeout=120, cwd=job, env=ENV)
    assert bad.returncode != 0
    assert "-num_clients=3, but the job runs on 1 hosts" in bad.stderr


def test_caffe_main_job_flags_act_in_a_single_process_run(job):
    """Without mpiexec, -net_outputs/-stats_path/-svb/-num_clients still act: the process
    runs as a one-worker job instead of dropping them silently."""
    base = [PY, "-m", "poseidon_caffe.cli", "train", "--solver", str(job / "solver.prototxt")]
    proc = subprocess.run(base + ["--net_outputs", str(job / "o" / "tiny"), "--svb=true",
                                  "--stats_path", str(job / "o" / "caffe_stats.yaml")],
                          capture_output=True, text=True, timeout=120, cwd=job, env=ENV)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = (job / "o" / "tiny.netoutputs").read_text().splitlines()
    # one name per column: the smoothed loss, then the train net's own "loss" output
    assert rows[0] == "iteration,seconds,smoothed_loss,loss" and len(rows) == 1 + ITERS
    stats = json.loads((job / "o" / "caffe_stats.yaml").read_text())["workers"]
    assert len(stats) == 1
    assert proc.stderr.count("-svb=true has no effect") == 1
    bad = subprocess.run(base + ["--num_clients", "2"], capture_output=True, text=True,
                         timeout=120, cwd=job, env=ENV)
    assert bad.returncode == 1 and "-num_clients=2, but the job runs on 1 hosts" in bad.stderr
    # one line: a one-rank job has no peers to end, so no abort notice follows it
    assert [line for line in bad.stderr.splitlines() if not line.startswith("I")] == [
        line for line in bad.stderr.splitlines() if "-num_clients=2" in line]


def test_a_client_id_missing_from_the_host_file_is_one_line(job):
    (job / "one_host").write_text("0 127.0.0.1 %d\n" % free_port())
    bad = subprocess.run([PY, "-m", "poseidon_caffe.cli", "train", "--solver",
                          str(job / "solver.prototxt"), "--hostfile", str(job / "one_host"),
                          "--client_id", "3"],
                         capture_output=True, text=True, timeout=120, cwd=job, env=ENV)
    assert bad.returncode != 0
    assert ("-client_id=3 is not in -hostfile=%s (its clients are 0)" % (job / "one_host")
            in bad.stderr)
    assert "Traceback" not in bad.stderr and not (job / "m_iter_3.caffemodel").exists()


def test_num_app_threads_is_poseidons_name_for_ranks_per_host(job, monkeypatch):
    values = flag_values("--num_app_threads", "2")
    cli.poseidon_flags(values)
    assert values["ranks_per_host"] == 2
    with pytest.raises(cli.CommandError, match="-ranks_per_host=3 and -num_app_threads=2 "
                                                "disagree"):
        cli.poseidon_flags(flag_values("--num_app_threads=2", "--ranks_per_host=3"))
    # a client started host by host runs that many CPU ranks on every host
    from poseidon_caffe.tools import join_client
    started = []
    monkeypatch.setattr(join, "run_client", lambda cid, hosts, args: started.append(args) or 0)
    argv = ["--solver", "s", "--hostfile", str(job / "hosts"), "--num_app_threads=2"]
    values = flag_values(*argv)
    assert join_client.train_client(values, argv) == 0
    args = started[0]
    assert args[2].endswith(":2") and args[2].count(":2") == 2
    assert args.count("-ranks_per_host=2") == 4
    values["gpu"] = "0,1,2"
    with pytest.raises(join.JoinError, match="-num_app_threads=2, but -gpu=0,1,2 names 3"):
        join_client.train_client(values, argv)
