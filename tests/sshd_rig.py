"""A cluster with real logins for poseidon-run's tests: a netlab lab whose every host runs its
own OpenSSH server (its own host key, one authorised client key, no passwords) under a host
name of its own, and the client side (the key, a known_hosts file, an ssh config) in a folder.
Everything is made in ``folder`` and taken down by ``close``: the servers, every process left
in the lab, the lab's namespaces and MPICH's shared-memory files of the job.

    with SshdCluster(tmp_path, hosts=3) as rig:
        rig.ssh_command()        # what POSEIDON_RUN_SSH is set to: real ssh, this rig's files
        rig.run_on(0, argv)      # argv inside host 0's namespace
"""
import glob
import os
import shutil
import subprocess
import time

from poseidon_caffe import netlab

SSHD = shutil.which("sshd") or shutil.which("sshd", path="/usr/sbin:/sbin")


def missing_reason():
    """Why the rig cannot stand here, or None."""
    if os.geteuid() != 0:
        return "real sshd hosts need root (network namespaces, sshd)"
    if SSHD is None or shutil.which("ssh") is None or shutil.which("ssh-keygen") is None:
        return "OpenSSH's sshd, ssh and ssh-keygen are needed (apt-get install openssh-server)"
    try:
        netlab.require_root_and_tools()
    except netlab.LabError as exc:
        return str(exc)
    return None


def shm_files():
    """MPICH's shared-memory segments present now."""
    return set(glob.glob("/dev/shm/mpich_shm_*"))


def _keygen(path, comment):
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", path],
                   check=True, capture_output=True, timeout=30)


class SshdCluster:
    def __init__(self, folder, hosts=3, bandwidth="1gbit"):
        self.folder = str(folder)
        self.sshd = []
        self.lab = netlab.Lab.create(hosts, bandwidth)
        try:
            self._make_keys()
            for host in range(hosts):
                self.start_sshd(host)
            self.wait_listening()
        except BaseException:
            self.close()
            raise

    addresses = property(lambda self: self.lab.addresses)

    def path(self, name):
        return os.path.join(self.folder, name)

    def host_name(self, host):
        return "lab-h%d" % host

    def _make_keys(self):
        _keygen(self.path("client_key"), "poseidon-run test client")
        shutil.copy(self.path("client_key.pub"), self.path("authorized_keys"))
        _keygen(self.path("other_key"), "a key no host knows")
        for host in range(len(self.addresses)):
            _keygen(self.path("host_key_%d" % host), self.host_name(host))
        with open(self.path("ssh_config"), "w") as f:
            f.write("UserKnownHostsFile %s\nGlobalKnownHostsFile /dev/null\n"
                    "LogLevel ERROR\n" % self.path("known_hosts"))

    def start_sshd(self, host):
        """sshd on host ``host``'s address, in a UTS namespace of its own named lab-h<host>."""
        config = self.path("sshd_config_%d" % host)
        with open(config, "w") as f:
            f.write("ListenAddress %s\nPort 22\nHostKey %s\nPidFile none\n"
                    "AuthorizedKeysFile %s\nPubkeyAuthentication yes\n"
                    "PasswordAuthentication no\nKbdInteractiveAuthentication no\n"
                    "PermitRootLogin prohibit-password\nStrictModes no\nUsePAM no\n"
                    "LogLevel ERROR\n"
                    % (self.addresses[host], self.path("host_key_%d" % host),
                       self.path("authorized_keys")))
        os.makedirs("/run/sshd", mode=0o755, exist_ok=True)   # sshd's privilege separation
        argv = ["unshare", "--uts", "sh", "-c", 'hostname "$0" && exec "$1" -D -e -f "$2"',
                self.host_name(host), SSHD, config]
        log = open(self.path("sshd_%d.log" % host), "ab")
        proc = subprocess.Popen(self.lab.command(argv, host), stdin=subprocess.DEVNULL,
                                stdout=log, stderr=log, start_new_session=True)
        log.close()
        while len(self.sshd) <= host:
            self.sshd.append(None)
        self.sshd[host] = proc
        return proc

    def stop_sshd(self, host):
        proc = self.sshd[host]
        if proc is not None and proc.poll() is None:
            proc.terminate()
            proc.wait(10)

    def wait_listening(self, timeout=15):
        deadline = time.monotonic() + timeout
        for host, proc in enumerate(self.sshd):
            while True:
                out = subprocess.run(self.lab.command(["ss", "-ltnH", "sport", "= :22"], host),
                                     capture_output=True, text=True, timeout=10).stdout
                if self.addresses[host] in out:
                    break
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("sshd on host %d did not start: %s" % (
                        host, open(self.path("sshd_%d.log" % host)).read()[-500:]))
                time.sleep(0.1)

    def ssh_command(self):
        """Real ssh reading this rig's config (known_hosts here, not in ~/.ssh)."""
        return "ssh -F %s" % self.path("ssh_config")

    def run_on(self, host, argv, **popen):
        return subprocess.Popen(self.lab.command(argv, host), **popen)

    def pids(self, host):
        out = subprocess.run(["ip", "netns", "pids", self.lab.host_namespaces[host]],
                             capture_output=True, text=True, timeout=10).stdout
        return [int(p) for p in out.split()]

    def processes(self, host, word):
        """Pids in host ``host`` whose command line holds ``word``."""
        found = []
        for pid in self.pids(host):
            try:
                with open("/proc/%d/cmdline" % pid, "rb") as f:
                    argv = f.read().split(b"\0")
            except OSError:
                continue
            if word.encode() in b" ".join(argv):
                found.append(pid)
        return found

    def job_processes(self):
        """{host: [pid]} of the job's proxies and ranks still alive anywhere in the lab."""
        left = {}
        for host in range(len(self.addresses)):
            pids = [p for w in ("hydra_pmi_proxy", "poseidon_caffe", "mpiexec")
                    for p in self.processes(host, w)]
            if pids:
                left[host] = sorted(set(pids))
        return left

    def close(self):
        for host in range(len(self.sshd)):
            try:
                self.stop_sshd(host)
            except Exception:
                pass
        self.lab.destroy(quiet=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
