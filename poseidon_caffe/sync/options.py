"""What a distributed job is asked to do: the sync flags of ``poseidon-caffe train`` (and of
``attach``'s other callers), read once into one dataclass with the defaults in one place."""
import dataclasses
import typing

from .engine import CHANNELS
from .offload import OFFLOAD_SIZE


@dataclasses.dataclass
class SyncOptions:
    sync: str = "auto"                 # -sync: auto (the planner's choice), ps, sfb, allreduce
    svb: typing.Optional[bool] = None  # -svb: every InnerProduct weight as factors, or none
    staleness: int = 0                 # -staleness: clocks a worker may run ahead (SSP)
    dwbp: bool = True                  # -dwbp: exchanges start as backward makes them ready
    ps_update: str = "server"          # -ps_update: server (one Caffe update) or worker
    fuse_bytes: int = 1 << 16          # blobs smaller than this share one message
    comm_channels: int = CHANNELS      # -comm_channels: exchanges in flight at once
    offload_size: int = OFFLOAD_SIZE   # values from which numeric work goes to a thread
    sync_timeout: typing.Optional[float] = None   # seconds; None: POSEIDON_SYNC_TIMEOUT
    ranks_per_host: int = 0            # consecutive ranks that play one host (0: real hosts)
    server_ranks: int = 0              # -server_ranks: the last N ranks only serve shards
    client_id: int = -1                # -client_id: this host's Poseidon client
    hostfile: str = ""                 # -hostfile: the localserver file naming the clients
    num_clients: int = 0               # -num_clients: the hosts the job must span
    output_dir: str = ""               # rank logs, statistics, .netoutputs
    snapshot: str = ""                 # the solver state being resumed
    timeline: str = ""                 # a Chrome trace of every rank's compute and exchanges
    stats_path: str = ""               # Poseidon's -stats_path: every worker's statistics
    net_outputs: str = ""              # Poseidon's -net_outputs prefix

    @classmethod
    def of(cls, options):
        """The options from a SyncOptions, a namespace of flags (``train``'s), a dict or None;
        a flag left empty or unset takes its default, and other flags are not sync's."""
        if isinstance(options, cls):
            return options
        values = {}
        for field in dataclasses.fields(cls):
            if isinstance(options, dict):
                value = options.get(field.name)
            else:
                value = getattr(options, field.name, None)
            if value is None or value == "":
                continue
            kind = type(field.default) if field.default is not None else float
            if field.name == "svb" or kind is bool:
                # a flag's bool, or its text
                values[field.name] = (value if isinstance(value, bool)
                                      else str(value).lower() in ("1", "true", "yes"))
                continue
            values[field.name] = kind(value)
        return cls(**values)
