"""``poseidon-caffe train -hostfile F -client_id K`` outside mpiexec, as Poseidon's scripts run
caffe_main on every host: this process is client K of the job the host file describes, and
joins it (``sync/join.py``).
"""
import os
import shutil
import sys

from ..sync import join
from ..sync.launcher import read_localserver


def train_client(values, argv):
    """``poseidon-caffe train -hostfile F -client_id K ...`` outside mpiexec: this process is
    client K. One rank per host (per device of -gpu), each running this command with its
    host's -client_id."""
    hosts = read_localserver(values["hostfile"])
    client_id = values["client_id"] if values["client_id"] >= 0 else 0
    if values["num_clients"] and values["num_clients"] != len(hosts):
        raise join.JoinError("-num_clients=%d, but %s lists %d clients"
                             % (values["num_clients"], values["hostfile"], len(hosts)))
    devices = [int(d) for d in values["gpu"].split(",") if d != ""] if values["gpu"] else []
    threads = values.get("num_app_threads", 0)
    if devices and threads and threads != len(devices):
        raise join.JoinError("-num_app_threads=%d, but -gpu=%s names %d devices"
                             % (threads, values["gpu"], len(devices)))
    # Poseidon's -num_app_threads: that many CPU worker ranks per host when no -gpu is given
    devices = devices or [None] * max(threads, 1)
    python = sys.executable
    mpiexec = shutil.which("mpiexec") or os.path.join(os.path.dirname(python), "mpiexec")
    args = [mpiexec, "-hosts", ",".join("%s:%d" % (ip, len(devices)) for _, ip, _ in hosts)]
    base = [python, "-m", "poseidon_caffe.tools.supervise", "--", python, "-m",
            "poseidon_caffe.cli", "train"] + list(argv)
    first = True
    for cid, _, _ in hosts:
        for device in devices:
            if not first:
                args.append(":")
            first = False
            args += ["-n", "1"] + base + ["-client_id=%d" % cid,
                                          "-ranks_per_host=%d" % len(devices)]
            if device is not None:
                args.append("-gpu=%d" % device)
    return join.run_client(client_id, hosts, args)
