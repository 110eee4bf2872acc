"""netlab: hosts on a real, shaped network on one machine, for running and measuring jobs
exactly as across machines (network namespaces joined by veth links through a bridge, ``tc``
shaping each link). Root and iproute2 are needed.

    from poseidon_caffe import netlab
    result = netlab.run_across(2, "1gbit", ["python", "examples/mnist/run_local.py",
                                            "{hostfile}"], latency="1ms")
    result.returncode, [h.tx_bytes + h.rx_bytes for h in result.wire]

    with netlab.Lab.create(2, "100mbit") as lab:      # a lab to use step by step
        subprocess.run(lab.command(argv), env=lab.env())
        lab.wire_bytes()

Its command is ``python scripts/netlab.py run|up|down|exec|list`` (``tools/netlab.py``).
"""
from .lab import (DEFAULT_PORT, HOSTFILE_ENV, INTERFACE, STATE_ENV, HostBytes, Lab,
                  difference, labs, namespaces, remove_namespaces, stale_labs,
                  stray_namespaces)
from .run import RunResult, run_across
from .system import LabError, require_root_and_tools
from .units import UnitError, parse_delay, parse_rate, rate_text

__all__ = ["DEFAULT_PORT", "HOSTFILE_ENV", "INTERFACE", "STATE_ENV", "HostBytes", "Lab",
           "LabError", "RunResult", "UnitError", "difference", "labs", "namespaces",
           "parse_delay", "parse_rate", "rate_text", "remove_namespaces",
           "require_root_and_tools", "run_across", "stale_labs", "stray_namespaces"]
