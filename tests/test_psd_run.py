"""poseidon-run, Poseidon's psd_run for this project: the cluster config (keys only, clear
one-line errors), the exact ssh and mpiexec commands of a dry run, the one line that names an
unreachable node, the logs a run leaves, and a real training job of 2 workers and 1 dedicated
server spread over network namespaces, whose weights equal one worker's of twice the batch.

No sshd runs here: POSEIDON_RUN_SSH names a stand-in for ssh that receives exactly ssh's
arguments and runs the remote command locally, or inside the namespace of the node's address."""
import json
import os
import re
import shlex
import shutil
import stat
import subprocess
import sys
import uuid

import numpy as np
import pytest

from poseidon_caffe.launch import poseidon_run as runner
from poseidon_caffe.tools.poseidon_run import main as poseidon_run_main

PY = sys.executable
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MPIEXEC = os.path.join(os.path.dirname(PY), "mpiexec")
# the virtualenv the tests run in, when they run in one
VENV = sys.prefix if os.path.exists(os.path.join(sys.prefix, "bin", "activate")) else ""


def env(**extra):
    e = dict(os.environ, POSEIDON_NO_PROGRESS="1", **extra)
    e["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p)
    return e


def write_config(tmp_path, **keys):
    path = tmp_path / "cluster.json"
    path.write_text(json.dumps(keys))
    return str(path)


def key_file(tmp_path, mode=0o600):
    path = tmp_path / "cluster.pem"
    path.write_text("-----BEGIN OPENSSH PRIVATE KEY-----\n")
    path.chmod(mode)
    return str(path)


def main_here(args, cwd, monkeypatch, capsys, ssh=None):
    """poseidon-run's main in this process: (exit status, stdout, stderr)."""
    monkeypatch.chdir(cwd)
    if ssh:
        monkeypatch.setenv(runner.SSH_OVERRIDE_ENV, ssh)
    code = poseidon_run_main(args)
    out, err = capsys.readouterr()
    return code, out, err


def poseidon_run(args, cwd, **extra_env):
    return subprocess.run([PY, "-m", "poseidon_caffe.tools.poseidon_run"] + args, cwd=str(cwd),
                          capture_output=True, text=True, timeout=180, env=env(**extra_env))


# A stand-in for ssh, called with ssh's arguments: it records them, fails like ssh for the
# nodes in DEAD, and otherwise runs the remote command with sh -c, as sshd would.
LOCAL_SSH = r'''#!/bin/sh
echo "$*" >> "%(calls)s"
while [ $# -gt 0 ]; do case "$1" in -x|-T|-q) shift ;; -*) shift 2 ;; *) break ;; esac; done
node=$1; shift
case " %(dead)s " in *" $node "*)
  echo "ssh: connect to host $node port 22: Connection timed out" >&2; exit 255 ;; esac
%(enter)s sh -c "$*"
'''


def stand_in_ssh(tmp_path, dead=(), namespaces=None):
    calls = tmp_path / "ssh_calls.log"
    enter = ""
    if namespaces:
        cases = " ".join("%s) ns=%s ;;" % (ip, ns) for ip, ns in namespaces.items())
        enter = 'case "$node" in %s *) echo "no route to $node" >&2; exit 255 ;; esac\n' \
                'exec ip netns exec "$ns"' % cases
    path = tmp_path / "ssh"
    path.write_text(LOCAL_SSH % {"calls": calls, "dead": " ".join(dead), "enter": enter or "exec"})
    path.chmod(0o755)
    return str(path), calls


# -- the config -----------------------------------------------------------------------------------
def test_help_names_the_options_and_keys(capsys):
    with pytest.raises(SystemExit) as exit_:
        poseidon_run_main(["-h"])
    assert exit_.value.code == 0
    text = capsys.readouterr().out
    assert "usage: poseidon-run" in text and "-c CLUSTER_CONFIG" in text
    assert "-o OUTPUT_FOLDER" in text and "--dry-run" in text
    for key in ("virtualenv", "username", "pem_file", "master_node", "worker_nodes",
                "server_nodes"):
        assert key in text


@pytest.mark.parametrize("argv", [["-help"], ["--help"], ["-c", "cluster.json", "-help"],
                                  ["-c", "c.json", "-o", "out", "-helpfull"]])
def test_help_in_every_spelling_prints_usage(argv, capsys):
    with pytest.raises(SystemExit) as exit_:
        poseidon_run_main(argv)
    assert exit_.value.code == 0
    assert capsys.readouterr().out.startswith("usage: poseidon-run")


def test_a_commands_own_help_flag_is_passed_on():
    from poseidon_caffe.tools.poseidon_run import _parser, _with_argparse_help
    argv = ["-c", "c.json", "poseidon-caffe", "train", "-help"]
    assert _with_argparse_help(argv) == argv
    args = _parser().parse_args(_with_argparse_help(argv))
    assert args.cmd == ["poseidon-caffe", "train", "-help"]


def test_config_reads_psd_run_keys(tmp_path):
    pem = key_file(tmp_path)
    config = runner.load_config(write_config(
        tmp_path, virtualenv="/opt/venv/", username="ubuntu", pem_file=pem,
        master_node="192.168.1.10", worker_nodes=["192.168.1.11", "192.168.1.15"],
        server_nodes=["192.168.1.11"]))
    assert config.workers == ["192.168.1.11", "192.168.1.15"]
    assert config.servers == ["192.168.1.11"]
    assert config.nodes == ["192.168.1.11", "192.168.1.15"]
    assert (config.virtualenv, config.username, config.pem_file, config.master) == \
        ("/opt/venv", "ubuntu", pem, "192.168.1.10")


def test_a_password_in_the_config_is_refused_before_anything_runs(tmp_path, monkeypatch,
                                                                   capsys):
    ssh, calls = stand_in_ssh(tmp_path)
    config = write_config(tmp_path, worker_nodes=["10.0.0.1"], server_nodes=[],
                          password="hunter2")
    code, out, err = main_here(["-c", config, "poseidon-caffe train -solver=s.prototxt"],
                               tmp_path, monkeypatch, capsys, ssh)
    assert code == 2
    assert err.splitlines() == [
        "poseidon-run: %s: key 'password' is refused: poseidon-run logs in with ssh keys only "
        "(pem_file or ssh-agent), never with passwords; remove it" % config]
    assert not calls.exists(), "ssh ran although the config was refused"
    assert "hunter2" not in (tmp_path / "poseidon_run.log").read_text()
    assert "is refused" in (tmp_path / "poseidon_run.log").read_text()
    assert not [p for p in os.listdir(tmp_path) if p.startswith("poseidon_log_")]


@pytest.mark.parametrize("key", ["ssh_password", "Passwd", "passphrase", "pass", "secret"])
def test_every_spelling_of_a_password_is_refused(tmp_path, key):
    config = write_config(tmp_path, worker_nodes=["10.0.0.1"], server_nodes=[], **{key: "x"})
    with pytest.raises(runner.ConfigError, match=r"key %r is refused" % key):
        runner.load_config(config)


def test_a_password_nested_anywhere_is_refused(tmp_path):
    config = write_config(tmp_path, worker_nodes=["10.0.0.1"], server_nodes=[])
    data = json.loads(open(config).read())
    data["server_nodes"] = [{"host": "10.0.0.2", "password": "x"}]
    open(config, "w").write(json.dumps(data))
    with pytest.raises(runner.ConfigError, match=r"key 'server_nodes.password' is refused"):
        runner.load_config(config)


@pytest.mark.parametrize("keys, message", [
    ({"server_nodes": []}, r"'worker_nodes' is missing: list the nodes' addresses"),
    ({"worker_nodes": ["a"]}, r"'server_nodes' is missing"),
    ({"worker_nodes": [], "server_nodes": []}, r"worker_nodes is empty"),
    ({"worker_nodes": "10.0.0.1", "server_nodes": []},
     r"worker_nodes must be a list of node addresses, not \"10.0.0.1\""),
    ({"worker_nodes": ["10.0.0.1", 7], "server_nodes": []},
     r"worker_nodes\[1\] must be a non-empty string, not 7"),
    ({"worker_nodes": ["-oProxyCommand=x"], "server_nodes": []},
     r"worker_nodes\[0\] '-oProxyCommand=x' is not a valid node address"),
    ({"worker_nodes": ["a b"], "server_nodes": []}, r"worker_nodes\[0\] 'a b' is not a valid"),
    ({"worker_nodes": ["ubuntu@a"], "server_nodes": []}, r"worker_nodes\[0\] 'ubuntu@a' is not a valid"),
    ({"worker_nodes": ["a"], "server_nodes": [], "workers": 2},
     r"unknown key 'workers' \(the keys are virtualenv, username, pem_file, master_node, "
     r"worker_nodes, server_nodes\)"),
    ({"worker_nodes": ["a"], "server_nodes": [], "virtualenv": "venv"},
     r"virtualenv must be the absolute path of the virtualenv on the nodes"),
    ({"worker_nodes": ["a"], "server_nodes": [], "pem_file": "/no/such.pem"},
     r"pem_file /no/such.pem does not exist"),
    ({"worker_nodes": ["a"], "server_nodes": [], "username": "-l"}, r"username '-l' is not"),
])
def test_config_errors_name_the_file_and_key(tmp_path, keys, message):
    path = write_config(tmp_path, **keys)
    with pytest.raises(runner.ConfigError, match=re.escape(path) + ": " + message):
        runner.load_config(path)


def test_a_key_open_to_others_is_refused_as_ssh_would(tmp_path):
    pem = key_file(tmp_path, mode=0o644)
    path = write_config(tmp_path, worker_nodes=["a"], server_nodes=[], pem_file=pem)
    with pytest.raises(runner.ConfigError,
                       match=r"pem_file %s is open to others \(mode 644\) and ssh refuses such "
                             r"keys: chmod 600" % re.escape(pem)):
        runner.load_config(path)


def test_broken_json_is_named(tmp_path):
    path = tmp_path / "cluster.json"
    path.write_text('{"worker_nodes": ["a",]}')
    with pytest.raises(runner.ConfigError, match=r"cluster.json: not valid JSON: .*line 1"):
        runner.load_config(str(path))


def test_servers_need_a_train_command_and_agree_with_its_flag(tmp_path):
    config = runner.load_config(write_config(tmp_path, worker_nodes=["a", "b"],
                                              server_nodes=["c"]))
    assert runner.rank_command(config, ["poseidon-caffe", "train", "-solver=s"], "/L") == \
        ["poseidon-caffe", "train", "-solver=s", "-server_ranks=1", "-output_dir=/L"]
    assert runner.rank_command(config, ["python", "-m", "poseidon_caffe.cli", "train",
                                         "--server_ranks", "1", "--output_dir=o"], "/L") == \
        ["python", "-m", "poseidon_caffe.cli", "train", "--server_ranks", "1", "--output_dir=o"]
    with pytest.raises(runner.ConfigError, match=r"the command says -server_ranks=2 but .* "
                                                  r"lists 1 server_nodes"):
        runner.rank_command(config, ["poseidon-caffe", "train", "-server_ranks=2"], "/L")
    with pytest.raises(runner.ConfigError, match=r"'python train.py' is not a poseidon-caffe "
                                                  r"train command"):
        runner.rank_command(config, ["python", "train.py"], "/L")
    no_servers = runner.load_config(write_config(tmp_path, worker_nodes=["a"], server_nodes=[]))
    assert runner.rank_command(no_servers, ["python", "train.py"], "/L") == ["python", "train.py"]


# -- the commands -----------------------------------------------------------------------------------
def test_dry_run_prints_the_exact_ssh_and_mpiexec_commands_and_writes_nothing(tmp_path):
    pem = key_file(tmp_path)
    config = write_config(tmp_path, virtualenv="/opt/poseidon/venv", username="ubuntu",
                          pem_file=pem, master_node="192.168.1.10",
                          worker_nodes=["192.168.1.11", "192.168.1.15"],
                          server_nodes=["192.168.1.15", "192.168.1.70"])
    out = str(tmp_path / "logs")
    proc = poseidon_run(["-c", config, "-o", out, "--dry-run",
                         "poseidon-caffe train --solver=lenet_solver.prototxt -sync=ps"],
                        tmp_path)
    assert proc.returncode == 0, proc.stderr
    ssh = ("ssh -i %s -l ubuntu -o BatchMode=yes -o ConnectTimeout=5 "
           "-o StrictHostKeyChecking=accept-new" % pem)
    check = shlex.quote("cd %s && . /opt/poseidon/venv/bin/activate && %s"
                        % (tmp_path, runner._VIRTUALENV_READY))
    proxy = "'. /opt/poseidon/venv/bin/activate && exec hydra_pmi_proxy <proxy arguments>'"
    expected = [
        "# check every node over ssh (one command per node)",
        "%s 192.168.1.11 %s" % (ssh, check),
        "%s 192.168.1.15 %s" % (ssh, check),
        "%s 192.168.1.70 %s" % (ssh, check),
        "# %s/machinefile" % out,
        "192.168.1.11:1",
        "192.168.1.15:2",          # worker 1 and server 0 share the node: one proxy
        "192.168.1.70:1",
        "# %s/remote_shell: mpiexec starts its proxy on each node with" % out,
        "%s -x 192.168.1.11 %s" % (ssh, proxy),
        "%s -x 192.168.1.15 %s" % (ssh, proxy),
        "%s -x 192.168.1.70 %s" % (ssh, proxy),
        "# the job",
        "%s -launcher ssh -launcher-exec %s/remote_shell -f %s/machinefile "
        "-localhost 192.168.1.10 -wdir %s -outfile-pattern %s/rank%%r.log "
        "-errfile-pattern %s/rank%%r.log -genv VIRTUAL_ENV /opt/poseidon/venv "
        "-genv PATH %s -n 4 /opt/poseidon/venv/bin/python -m poseidon_caffe.tools.supervise -- "
        "poseidon-caffe train --solver=lenet_solver.prototxt -sync=ps -server_ranks=2 "
        "-output_dir=%s" % (MPIEXEC, out, out, tmp_path, out, out,
                            shlex.quote("/opt/poseidon/venv/bin:" + os.environ["PATH"]), out),
    ]
    assert proc.stdout.splitlines() == expected
    assert sorted(os.listdir(tmp_path)) == ["cluster.json", "cluster.pem"]


def test_dry_run_without_key_user_or_virtualenv_leaves_them_to_ssh(tmp_path, monkeypatch,
                                                                    capsys):
    monkeypatch.delenv(runner.SSH_OVERRIDE_ENV, raising=False)
    config = write_config(tmp_path, worker_nodes=["w1"], server_nodes=[])
    out = str(tmp_path / "logs")
    code, text, _ = main_here(["-c", config, "-o", out, "--dry-run", "python", "train.py",
                               "--lr", "0.1"], tmp_path, monkeypatch, capsys)
    assert code == 0
    ssh = "ssh -o BatchMode=yes -o ConnectTimeout=5 -o StrictHostKeyChecking=accept-new"
    assert text.splitlines() == [
        "# check every node over ssh (one command per node)",
        "%s w1 'cd %s'" % (ssh, tmp_path),
        "# %s/machinefile" % out,
        "w1:1",
        "# %s/remote_shell: mpiexec starts its proxy on each node with" % out,
        "%s -x w1 '\"%s/hydra_pmi_proxy\" <proxy arguments>'" % (ssh, os.path.dirname(MPIEXEC)),
        "# the job",
        "%s -launcher ssh -launcher-exec %s/remote_shell -f %s/machinefile -wdir %s "
        "-outfile-pattern %s/rank%%r.log -errfile-pattern %s/rank%%r.log -n 1 %s -m "
        "poseidon_caffe.tools.supervise -- python train.py --lr 0.1"
        % (MPIEXEC, out, out, tmp_path, out, out, PY)]


def test_remote_shell_adds_key_user_and_virtualenv_around_hydras_proxy(tmp_path):
    """The generated script, called as mpiexec's ssh launcher calls it."""
    pem = key_file(tmp_path)
    config = runner.load_config(write_config(tmp_path, worker_nodes=["n1"], server_nodes=[],
                                              username="ubuntu", pem_file=pem,
                                              virtualenv="/opt/venv"))
    ssh, calls = stand_in_ssh(tmp_path, dead=["n1"])   # record only: the node "fails"
    script = tmp_path / "remote_shell"
    script.write_text(runner.remote_shell_text(config, [ssh]))
    script.chmod(0o700)
    subprocess.run([str(script), "-x", "n1", '"/here/bin/hydra_pmi_proxy"', "--control-port",
                    "10.0.0.9:4000", "--proxy-id", "0"], capture_output=True, timeout=30)
    assert calls.read_text() == (
        "-i %s -l ubuntu -o BatchMode=yes -o ConnectTimeout=5 -o StrictHostKeyChecking=accept-new "
        "-x n1 . /opt/venv/bin/activate && exec hydra_pmi_proxy --control-port 10.0.0.9:4000 "
        "--proxy-id 0\n" % pem)


# -- reachability -----------------------------------------------------------------------------------
def test_an_unreachable_node_is_named_in_one_line(tmp_path, monkeypatch, capsys):
    ssh, calls = stand_in_ssh(tmp_path, dead=["10.0.0.2"])
    config = write_config(tmp_path, username="ubuntu", worker_nodes=["10.0.0.1", "10.0.0.2"],
                          server_nodes=["10.0.0.2"])
    code, _, err = main_here(["-c", config, "poseidon-caffe train -solver=s.prototxt"],
                             tmp_path, monkeypatch, capsys, ssh)
    assert code == 2
    line = ("poseidon-run: node 10.0.0.2 (worker 1, server 0) is unreachable: ssh: connect to "
            "host 10.0.0.2 port 22: Connection timed out")
    assert err.splitlines() == [line]
    assert line[len("poseidon-run: "):] in (tmp_path / "poseidon_run.log").read_text()
    # both nodes were asked, and nothing was launched
    asked = calls.read_text().splitlines()
    assert sorted(re.search(r"accept-new (\S+) ", a).group(1) for a in asked) == \
        ["10.0.0.1", "10.0.0.2"]
    assert not [p for p in os.listdir(tmp_path) if p.startswith("poseidon_log_")]


def test_a_node_without_the_virtualenv_is_named_as_not_ready(tmp_path, monkeypatch, capsys):
    ssh, _ = stand_in_ssh(tmp_path)
    config = write_config(tmp_path, worker_nodes=["n1"], server_nodes=[],
                          virtualenv="/no/such/venv")
    code, _, err = main_here(["-c", config, "poseidon-caffe train -solver=s.prototxt"],
                             tmp_path, monkeypatch, capsys, ssh)
    assert code == 2
    [line] = err.splitlines()
    assert line.startswith("poseidon-run: node n1 (worker 0) is reachable but not ready: ")
    assert "/no/such/venv/bin/activate" in line


def test_a_master_node_that_is_not_this_machine_is_refused(tmp_path, monkeypatch, capsys):
    ssh, calls = stand_in_ssh(tmp_path)
    # 192.0.2.1 is in TEST-NET-1, set aside for documentation: never a local address
    config = write_config(tmp_path, master_node="192.0.2.1", worker_nodes=["n1"],
                          server_nodes=[])
    code, _, err = main_here(["-c", config, "python train.py"], tmp_path, monkeypatch, capsys,
                             ssh)
    assert code == 2
    assert err.splitlines() == [
        "poseidon-run: %s: master_node 192.0.2.1 is not an address of this machine: run "
        "poseidon-run on the master node (or leave master_node out)" % config]
    assert not calls.exists()
    runner.check_master(runner.load_config(write_config(
        tmp_path, master_node="127.0.0.1", worker_nodes=["n1"], server_nodes=[])))


@pytest.mark.skipif(shutil.which("ssh") is None, reason="no ssh client installed")
def test_real_ssh_names_a_node_that_does_not_resolve(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv(runner.SSH_OVERRIDE_ENV, raising=False)
    config = write_config(tmp_path, worker_nodes=["node7.invalid"], server_nodes=[])
    code, _, err = main_here(["-c", config, "poseidon-caffe train -solver=s.prototxt"],
                             tmp_path, monkeypatch, capsys)
    assert code == 2
    [line] = err.splitlines()
    assert line.startswith("poseidon-run: node node7.invalid (worker 0) is unreachable: ssh: ")
    assert "node7.invalid" in line[60:]


# -- a run ----------------------------------------------------------------------------------------
MPI_PROGRAM = ("from mpi4py import MPI; c = MPI.COMM_WORLD; "
               "print('rank %d of %d: sum %d' % (c.rank, c.size, c.allreduce(c.rank + 1)))")


@pytest.mark.mpi
def test_a_run_writes_poseidon_run_log_and_one_log_per_rank(tmp_path):
    ssh, calls = stand_in_ssh(tmp_path)
    keys = dict(worker_nodes=["nodeA", "nodeB"], server_nodes=[])
    if VENV:
        keys["virtualenv"] = VENV
    config = write_config(tmp_path, **keys)
    cmd = "%s -c %s" % (PY, shlex.quote(MPI_PROGRAM))
    proc = poseidon_run(["-c", config, cmd], tmp_path, POSEIDON_RUN_SSH=ssh)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    [folder] = [p for p in os.listdir(tmp_path) if p.startswith("poseidon_log_")]
    assert re.match(r"poseidon_log_\d{8}_\d{6}$", folder)
    logs = tmp_path / folder
    assert (logs / "rank0.log").read_text() == "rank 0 of 2: sum 3\n"
    assert (logs / "rank1.log").read_text() == "rank 1 of 2: sum 3\n"
    assert (logs / "machinefile").read_text() == "nodeA:1\nnodeB:1\n"
    assert os.stat(logs / "remote_shell").st_mode & stat.S_IXUSR
    # rank 0's output reaches the console as well
    assert "rank 0 of 2: sum 3" in proc.stdout and "rank 1 of 2" not in proc.stdout
    run_log = (tmp_path / "poseidon_run.log").read_text()
    assert "started in %s: poseidon-run -c %s" % (tmp_path, config) in run_log
    assert "run: %s -launcher ssh -launcher-exec %s" % (MPIEXEC, logs / "remote_shell") in run_log
    assert re.search(r"job ended with exit status 0 after [\d.]+ s; logs in %s"
                     % re.escape(str(logs)), run_log)
    # each node was checked, then each got its proxy through the remote shell
    proxies = [c for c in calls.read_text().splitlines() if " -x " in c]
    assert sorted(re.search(r" -x (\S+) ", c).group(1) for c in proxies) == ["nodeA", "nodeB"]

    # a second run to the same output folder would overwrite those logs: refused
    proc = poseidon_run(["-c", config, "-o", str(logs), cmd], tmp_path, POSEIDON_RUN_SSH=ssh)
    assert proc.returncode == 2
    assert proc.stderr.splitlines() == [
        "poseidon-run: output folder %s already holds the logs of an earlier job (rank0.log): "
        "give a new folder" % logs]
    assert run_log in (tmp_path / "poseidon_run.log").read_text()   # appended, not replaced


@pytest.mark.mpi
def test_a_failing_rank_fails_the_run(tmp_path):
    ssh, _ = stand_in_ssh(tmp_path)
    config = write_config(tmp_path, worker_nodes=["nodeA", "nodeB"], server_nodes=[])
    program = MPI_PROGRAM + "; import sys; sys.exit(3 if c.rank == 1 else 0)"
    out = tmp_path / "out"
    proc = poseidon_run(["-c", config, "-o", str(out), "%s -c %s" % (PY, shlex.quote(program))],
                        tmp_path, POSEIDON_RUN_SSH=ssh)
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert "job ended with exit status 3" in (tmp_path / "poseidon_run.log").read_text()
    assert (out / "rank1.log").read_text() == "rank 1 of 2: sum 3\n"


# -- a real job over network namespaces -----------------------------------------------------------
def _ip(*args):
    return subprocess.run(["ip"] + list(args), capture_output=True, text=True, timeout=30)


@pytest.fixture
def cluster():
    """A master namespace holding a bridge and two node namespaces wired to it with veth pairs:
    10.213.7.1 (master), 10.213.7.11 and 10.213.7.12 (nodes). Removed afterwards."""
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("network namespaces need root and iproute2's ip")
    tag = uuid.uuid4().hex[:6]
    master, nodes = "psd%sm" % tag, {"10.213.7.11": "psd%sa" % tag, "10.213.7.12": "psd%sb" % tag}
    made = []
    try:
        for ns in [master] + list(nodes.values()):
            result = _ip("netns", "add", ns)
            if result.returncode:
                pytest.skip("ip netns is unavailable here: %s" % result.stderr.strip())
            made.append(ns)
        steps = [("-n", master, "link", "set", "lo", "up"),
                 ("-n", master, "link", "add", "br0", "type", "bridge"),
                 ("-n", master, "addr", "add", "10.213.7.1/24", "dev", "br0"),
                 ("-n", master, "link", "set", "br0", "up")]
        for k, (address, ns) in enumerate(sorted(nodes.items())):
            steps += [("-n", master, "link", "add", "v%d" % k, "type", "veth", "peer", "name",
                       "eth0", "netns", ns),
                      ("-n", master, "link", "set", "v%d" % k, "master", "br0"),
                      ("-n", master, "link", "set", "v%d" % k, "up"),
                      ("-n", ns, "link", "set", "lo", "up"),
                      ("-n", ns, "addr", "add", address + "/24", "dev", "eth0"),
                      ("-n", ns, "link", "set", "eth0", "up")]
        for step in steps:
            result = _ip(*step)
            assert result.returncode == 0, "ip %s: %s" % (" ".join(step), result.stderr)
        yield master, nodes
    finally:
        for ns in made:
            _ip("netns", "del", ns)


@pytest.mark.mpi
def test_two_workers_and_a_server_on_namespaced_nodes_train_as_one_worker(tmp_path, cluster):
    from poseidon_caffe.data.mnist_embedded import ensure_mnist_lmdbs
    from poseidon_caffe.io import read_net_weights
    from jobs import write_lenet_job
    master, nodes = cluster
    train_db, test_db = ensure_mnist_lmdbs(str(tmp_path / "digits"))
    one = write_lenet_job(tmp_path, "one", 16, train_db, test_db, display=1, max_iter=3)
    proc = subprocess.run([PY, "-m", "poseidon_caffe.cli", "train", "-solver=%s" % one],
                          capture_output=True, text=True, timeout=120, env=env())
    assert proc.returncode == 0, proc.stderr[-2000:]

    two = write_lenet_job(tmp_path, "two", 8, train_db, test_db, display=1, max_iter=3)
    ssh, calls = stand_in_ssh(tmp_path, namespaces=nodes)
    keys = dict(username="root", pem_file=key_file(tmp_path), master_node="10.213.7.1",
                worker_nodes=["10.213.7.11", "10.213.7.12"], server_nodes=["10.213.7.12"])
    if VENV:
        keys["virtualenv"] = VENV
    config = write_config(tmp_path, **keys)
    out = tmp_path / "logs"
    cmd = "%s -m poseidon_caffe.cli train -solver=%s -sync=ps" % (PY, two)
    proc = subprocess.run(["ip", "netns", "exec", master, PY, "-m", "poseidon_caffe.tools.poseidon_run",
                           "-c", config, "-o", str(out), cmd], cwd=str(tmp_path),
                          capture_output=True, text=True, timeout=180,
                          env=env(POSEIDON_RUN_SSH=ssh))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]

    # every ssh call carried the key and the user; the proxies ran on the nodes' namespaces
    lines = calls.read_text().splitlines()
    assert all(l.startswith("-i %s -l root -o BatchMode=yes" % keys["pem_file"]) for l in lines)
    proxies = sorted(re.search(r" -x (\S+) ", l).group(1) for l in lines
                     if " -x " in l)
    assert proxies == ["10.213.7.11", "10.213.7.12"]     # worker 1 and the server share a proxy
    assert (out / "machinefile").read_text() == "10.213.7.11:1\n10.213.7.12:2\n"
    rank0 = (out / "rank0.log").read_text()
    assert "Worker rank 0 of 2" in rank0 and "1 dedicated server ranks" in rank0
    assert "Optimization Done." in rank0 and "Optimization Done." in proc.stdout
    logs = "".join(open(os.path.join(d, f), errors="replace").read()
                   for d, _, files in os.walk(out) for f in files if f.endswith(".log"))
    assert "dedicated parameter-server shard 0 of 1 for 2 workers" in logs

    _, single = read_net_weights(str(tmp_path / "one_iter_3.caffemodel"))
    _, joint = read_net_weights(str(tmp_path / "two_iter_3.caffemodel"))
    for layer in ("conv1", "conv2", "ip1", "ip2"):
        for a, b in zip(single[layer], joint[layer]):
            np.testing.assert_allclose(b, a, rtol=1e-4, atol=2e-6, err_msg=layer)


def test_dry_run_of_a_config_whose_key_is_elsewhere_notes_it_and_shows_the_commands(
        tmp_path, monkeypatch, capsys):
    missing = str(tmp_path / "no_such.pem")
    config = write_config(tmp_path, pem_file=missing, worker_nodes=["w1"], server_nodes=[])
    out = str(tmp_path / "logs")
    code, text, err = main_here(["-c", config, "-o", out, "--dry-run", "python t.py"],
                                tmp_path, monkeypatch, capsys)
    assert code == 0
    assert err == ("poseidon-run: note (a real run stops here): %s: pem_file %s does not exist "
                   "(the private key ssh logs in with)\n" % (config, missing))
    assert "ssh -i %s " % missing in text
    # a real run still refuses it, in one line
    code, _, err = main_here(["-c", config, "-o", out, "python t.py"], tmp_path, monkeypatch,
                             capsys)
    assert code == 2 and "pem_file %s does not exist" % missing in err


def _watch_two_ranks(where, lines, order, expected=()):
    """A JobWatch over two ranks' logs in ``where``, each rank's death line written in
    ``order`` (ranks), the watcher reading between the two: (watch, what it said)."""
    import io
    import time
    places = [("10.0.0.1", "worker 0"), ("10.0.0.2", "worker 1")]
    said = []
    watch = runner.JobWatch(str(where), places, io.StringIO(),
                            lambda text, error=False: said.append(text))
    watch.expected.update(expected)
    watch.start()
    for rank in order:
        with open(where / ("rank%d.log" % rank), "a") as f:
            f.write(lines[rank])
        time.sleep(0.3)
    watch.stop()
    return watch, said


@pytest.mark.parametrize("order", ["abort first", "kill first"])
def test_a_survivor_aborted_when_a_rank_answers_the_jobs_signal_is_no_cause(tmp_path, order):
    """A SIGTERM passed on to every rank: rank 0 dies by it, and rank 1's MPI transport,
    reading from the dead rank, aborts (SIGABRT) before its own SIGTERM lands. In either
    order of the two lines, no rank is the job's cause (the job ends with the signal's status)
    and nothing is said of the abort; with no signal sent, rank 0's death is the cause."""
    import signal
    lines = {0: "*** rank 0 on host a (pid 11) was killed by signal 15 (SIGTERM); ending the job\n",
             1: "*** rank 1 on host b (pid 22) was killed by signal 6 (SIGABRT); ending the job\n"}
    ranks = [1, 0] if order == "abort first" else [0, 1]
    (tmp_path / "sent").mkdir()
    watch, said = _watch_two_ranks(tmp_path / "sent", lines, ranks, [signal.SIGTERM])
    assert watch.cause is None and watch.answered == signal.SIGTERM and said == []
    (tmp_path / "not sent").mkdir()
    watch, said = _watch_two_ranks(tmp_path / "not sent", lines, ranks)
    assert watch.cause.rank == 0 and watch.cause.status == 128 + 15 and said


@pytest.mark.parametrize("order", ["abort first", "kill first"])
def test_a_survivor_aborted_by_mpi_is_not_named_as_the_cause(tmp_path, order):
    """When a rank is killed, MPICH can abort a survivor (SIGABRT) whose line reaches the logs
    first: the killed rank is still the job's cause, named first, the survivor after it."""
    lines = {0: "*** rank 0 on host a (pid 11) was killed by signal 6 (SIGABRT); ending the job\n",
             1: "*** rank 1 on host b (pid 22) was killed by signal 9 (SIGKILL); ending the job\n"}
    watch, said = _watch_two_ranks(tmp_path, lines, [0, 1] if order == "abort first" else [1, 0])
    assert watch.cause.rank == 1 and watch.cause.status == 128 + 9
    assert said[0].startswith("rank 1 (worker 1 on node 10.0.0.2): rank 1 on host b")
    if order == "abort first":
        # held back while it could be the answer to another death, then named after it
        assert len(said) == 2 and said[1].startswith("then rank 0") and "SIGABRT" in said[1]
    else:
        assert len(said) == 1          # rank 0's own line is on the console already
