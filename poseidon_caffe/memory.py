"""How much memory this machine can give a net, and byte counts as people read them.

The figure is ``POSEIDON_MEMORY_LIMIT`` when set (bytes, or a number with a K, M, G or T
suffix in powers of 1024: ``512M``, ``1.5G``), a limit for this process; else the smaller of
the kernel's MemAvailable estimate from /proc/meminfo (memory that can be used without
swapping, page cache included) and what the process's memory cgroup (v1 or v2, and each of its
ancestors) has left: its limit less its usage, the inactive file cache not counted since the
kernel takes that back before it kills. A container's limit is not in MemAvailable, which
speaks for the whole host. The figure is divided among the ranks of a distributed job that
share the host. Where nothing is known the net is not checked.
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


def available_memory(environ=os.environ, root="/"):
    """(bytes this process may use, how to say so in an error) or (None, None) when unknown.
    The ranks of a distributed job that share a host share its memory. ``root`` is where
    /proc and the cgroup file systems are found (tests give a folder of fake ones)."""
    text = environ.get(LIMIT_VARIABLE, "")
    if text.strip():
        limit = parse_bytes(text)
        return limit, "the limit %s is %s" % (LIMIT_VARIABLE, format_bytes(limit))
    total = _mem_available(root)
    has = None if total is None else "this machine has %s" % format_bytes(total)
    group = cgroup_room(root)
    if group is not None and (total is None or group[0] < total):
        total, limit, path = group
        has = "the memory cgroup %s has %s left of its %s limit" % (
            path, format_bytes(total), format_bytes(limit))
    if total is None:
        return None, None
    ranks = local_rank_count(environ)
    if ranks == 1:
        return total, has
    return total // ranks, "%s, %s for each of its %d ranks" % (
        has, format_bytes(total // ranks), ranks)


def _mem_available(root="/"):
    try:
        with open(os.path.join(root, "proc/meminfo")) as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


# per cgroup version: (limit file, usage file, the memory.stat line of reclaimable file cache)
_CGROUP_FILES = {1: ("memory.limit_in_bytes", "memory.usage_in_bytes", "total_inactive_file"),
                 2: ("memory.max", "memory.current", "inactive_file")}
_NO_LIMIT = 1 << 62          # v1 writes "no limit" as the largest page-aligned 63-bit number


def cgroup_room(root="/"):
    """(bytes left, limit, cgroup path) of the tightest memory cgroup this process is under,
    or None where no memory cgroup sets a limit."""
    tightest = None
    for version, folder, mount_point, path in _memory_cgroups(root):
        limit_file, usage_file, cache_line = _CGROUP_FILES[version]
        while True:
            limit = _read_number(os.path.join(folder, limit_file))
            usage = _read_number(os.path.join(folder, usage_file))
            if limit is not None and limit < _NO_LIMIT and usage is not None:
                usage -= min(usage, _stat_value(os.path.join(folder, "memory.stat"), cache_line))
                room = max(limit - usage, 0)
                if tightest is None or room < tightest[0]:
                    tightest = (room, limit, path or "/")
            parent = os.path.dirname(os.path.normpath(folder))
            if os.path.normpath(folder) == os.path.normpath(mount_point) or parent == folder:
                break
            folder, path = parent, os.path.dirname(path)
    return tightest


def _memory_cgroups(root):
    """(version, folder, its mount point, cgroup path) of each memory cgroup of this process:
    /proc/self/cgroup names the groups, /proc/self/mountinfo where their hierarchies are."""
    try:
        with open(os.path.join(root, "proc/self/cgroup")) as f:
            groups = [line.rstrip("\n").split(":", 2) for line in f]
        with open(os.path.join(root, "proc/self/mountinfo")) as f:
            mounts = [line.split() for line in f]
    except OSError:
        return []
    found = []
    for fields in mounts:
        if "-" not in fields:
            continue
        rest = fields[fields.index("-") + 1:]
        if len(rest) < 3 or len(fields) < 5:
            continue
        fstype, options = rest[0], rest[2].split(",")
        if fstype == "cgroup2":
            version = 2
            paths = [g[2] for g in groups if len(g) == 3 and g[0] == "0" and g[1] == ""]
        elif fstype == "cgroup" and "memory" in options:
            version = 1
            paths = [g[2] for g in groups if len(g) == 3 and "memory" in g[1].split(",")]
        else:
            continue
        mount_root, mount_point = fields[3], fields[4]
        for path in paths:
            # inside a container the mount's root is the container's own group
            inside = path
            if mount_root != "/" and (path + "/").startswith(mount_root.rstrip("/") + "/"):
                inside = path[len(mount_root.rstrip("/")):]
            where = os.path.join(root, mount_point.lstrip("/"))
            found.append((version, os.path.join(where, inside.lstrip("/")), where, path))
    return found


def _read_number(path):
    try:
        with open(path) as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):       # "max" (v2's no limit) reads as None
        return None


def _stat_value(path, name):
    try:
        with open(path) as f:
            for line in f:
                key, _, value = line.partition(" ")
                if key == name:
                    return int(value)
    except (OSError, ValueError):
        pass
    return 0


def format_bytes(count):
    """1.5 GiB, 12.0 MiB, 3.0 KiB, 17 B."""
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if count >= size:
            return "%.1f %s" % (count / size, unit)
    return "%d B" % count
