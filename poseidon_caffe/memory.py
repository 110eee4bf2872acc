"""How much memory this machine can give a net, and byte counts as people read them.

The figure is ``POSEIDON_MEMORY_LIMIT`` when set (bytes, or a number with a K, M, G or T
suffix in powers of 1024: ``512M``, ``1.5G``), a limit for this process; else the kernel's
MemAvailable estimate from /proc/meminfo (memory that can be used without swapping, page
cache included), divided among the ranks of a distributed job that share the host. Where
neither is known the net is not checked.
"""
import os
import re

from .thread_budget import local_rank_count

LIMIT_VARIABLE = "POSEIDON_MEMORY_LIMIT"
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


class MemoryLimitError(ValueError):
    """POSEIDON_MEMORY_LIMIT holds something that is not an amount of memory."""


def parse_bytes(text):
    match = re.fullmatch(r"\s*(\d+(?:\.\d*)?)\s*([KMGT]?)(?:i?B)?\s*", text, re.IGNORECASE)
    if not match:
        raise MemoryLimitError("%s=%r is not an amount of memory (expected bytes, or a number "
                               "with K, M, G or T: 512M, 1.5G)" % (LIMIT_VARIABLE, text))
    return int(float(match.group(1)) * _UNITS[match.group(2).upper()])


def available_memory(environ=os.environ):
    """(bytes this process may use, how to say so in an error) or (None, None) when unknown.
    The ranks of a distributed job that share a host share its MemAvailable."""
    text = environ.get(LIMIT_VARIABLE, "")
    if text.strip():
        limit = parse_bytes(text)
        return limit, "the limit %s is %s" % (LIMIT_VARIABLE, format_bytes(limit))
    total = _mem_available()
    if total is None:
        return None, None
    ranks = local_rank_count(environ)
    if ranks == 1:
        return total, "this machine has %s" % format_bytes(total)
    return total // ranks, ("this machine has %s, %s for each of its %d ranks"
                            % (format_bytes(total), format_bytes(total // ranks), ranks))


def _mem_available():
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def format_bytes(count):
    """1.5 GiB, 12.0 MiB, 3.0 KiB, 17 B."""
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if count >= size:
            return "%.1f %s" % (count / size, unit)
    return "%d B" % count
