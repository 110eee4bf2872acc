"""What ``tc`` puts on one end of a host's link: an HTB class holding the rate and, when the
lab has a latency, a netem queue under it holding the delay.

Every host link is shaped at both ends (the host's ``eth0`` for what it sends, the bridge port
for what it receives), so a byte from host a to host b passes two shaped queues: each adds half
the lab's one-way latency and both run at the lab's rate.
"""
from .units import delay_text, rate_text

# HTB warns about quanta outside this range; one class only, so the quantum is not a share
_QUANTUM_MIN, _QUANTUM_MAX = 1514, 200000


def link_commands(namespace, device, rate_bits, one_way_delay):
    """The tc argument lists shaping ``device`` in ``namespace`` (egress)."""
    rate = rate_text(rate_bits)
    quantum = min(max(rate_bits // 80, _QUANTUM_MIN), _QUANTUM_MAX)
    # a millisecond of the rate (two frames at least): timers of a millisecond then keep up
    burst = max(rate_bits // 8000, 2 * _QUANTUM_MIN)
    where = ("tc", "-n", namespace)
    commands = [where + ("qdisc", "replace", "dev", device, "root", "handle", "1:", "htb",
                         "default", "1"),
                where + ("class", "add", "dev", device, "parent", "1:", "classid", "1:1", "htb",
                         "rate", rate, "ceil", rate, "burst", str(burst), "cburst", str(burst),
                         "quantum", str(quantum))]
    half = one_way_delay / 2
    if half > 0:
        # room for every packet the delay holds at this rate, counted as small packets
        limit = 1000 + int(rate_bits / 8 * half / 64)
        commands.append(where + ("qdisc", "add", "dev", device, "parent", "1:1", "handle", "10:",
                                 "netem", "delay", delay_text(half), "limit", str(limit)))
    return commands
