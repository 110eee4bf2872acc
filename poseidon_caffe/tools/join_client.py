"""``poseidon-caffe train -hostfile F -client_id K`` outside mpiexec, as Poseidon's scripts run
caffe_main on every host: this process is client K of the job the host file describes, and
joins it (``launch/join.py``).
"""
from ..launch import join
from ..launch.command import job_command
from ..launch.hosts import read_localserver


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
    # after the user's flags, so that each rank's own -client_id and -gpu are the ones it reads
    args = job_command(hosts, devices, list(argv) + ["-ranks_per_host=%d" % len(devices)],
                       use_gpu=True, client_ids=True)
    return join.run_client(client_id, hosts, args)
