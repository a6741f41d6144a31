"""How much memory this machine (or one of its NUMA nodes) can still give, so that work which
would not fit (a conversion, a model's weights + KV cache + workspaces) is refused with both
figures before it starts, rather than killed halfway by the OOM killer.

What can be given: DASHINFER_MEMORY_LIMIT_MB when set (a rank's budget, whatever the machine has);
else MemAvailable (/proc/meminfo), lowered to what this process's cgroup still allows
(its limit - its usage + the page cache it can drop; v2 or v1); of a real NUMA node, its MemFree + FilePages (the node's
free memory and the page cache it can drop), within the same cgroup room.
"""
import os

from . import settings

GIB = 2**30
_CGROUP = "/sys/fs/cgroup"


def _meminfo(path, prefix=""):
    """{key: bytes} of a meminfo file (lines "key: N kB", after `prefix` on a node's)."""
    out = {}
    with open(path) as f:
        for line in f:
            key, _, rest = line[len(prefix):].partition(":")
            fields = rest.split()
            if fields and fields[0].isdigit():
                out[key.strip()] = int(fields[0]) * (1024 if fields[1:] == ["kB"] else 1)
    return out


# (controller line of /proc/self/cgroup, its mount, limit file, usage file, memory.stat's key of
# the page cache it can drop): cgroup v2, then v1
_CGROUPS = (("0::", "/sys/fs/cgroup", "memory.max", "memory.current", "inactive_file"),
            (":memory:", "/sys/fs/cgroup/memory", "memory.limit_in_bytes", "memory.usage_in_bytes",
             "total_inactive_file"))
_NO_LIMIT = 1 << 62  # v1 writes "no limit" as a number near 2^63


def _cgroup_room(proc="/proc/self/cgroup", cgroups=_CGROUPS):
    """Bytes this process's cgroup still allows (its limit - its usage + the page cache it can drop),
    or None when it sets no limit. A container sees its own cgroup at the mount's root."""
    try:
        with open(proc) as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    for marker, mount, limit_file, usage_file, cache_key in cgroups:
        path = next((line.split(":", 2)[2] for line in lines if marker in line and
                     (marker != "0::" or line.startswith(marker))), None)
        for folder in dict.fromkeys((os.path.join(mount, path.lstrip("/")), mount)) if path is not None else ():
            try:
                with open(os.path.join(folder, limit_file)) as f:
                    limit = f.read().strip()
                if limit == "max" or int(limit) >= _NO_LIMIT:
                    continue
                with open(os.path.join(folder, usage_file)) as f:
                    usage = int(f.read().strip())
            except (OSError, ValueError):
                continue
            return max(0, int(limit) - usage + _stat(os.path.join(folder, "memory.stat")).get(cache_key, 0))
    return None


def _stat(path):
    """{key: value} of a cgroup's memory.stat (lines "key value"); {} when unreadable."""
    out = {}
    try:
        with open(path) as f:
            for line in f:
                fields = line.split()
                if len(fields) == 2 and fields[1].isdigit():
                    out[fields[0]] = int(fields[1])
    except OSError:
        pass
    return out


LIMIT_SETTING = "DASHINFER_MEMORY_LIMIT_MB"  # a rank's budget, whatever the machine has


def available(node=None):
    """(bytes, where the figure comes from): what the machine, or NUMA node `node` (a real one),
    can give now."""
    limit = settings.get(LIMIT_SETTING)
    if limit:
        return limit * 2**20, LIMIT_SETTING
    if node is None:
        have, where = _meminfo("/proc/meminfo").get("MemAvailable"), "MemAvailable"
    else:
        info = _meminfo(f"/sys/devices/system/node/node{node}/meminfo", f"Node {node} ")
        have, where = info["MemFree"] + info.get("FilePages", 0), f"node {node}'s free memory and page cache"
    room = _cgroup_room()
    if room is not None and room < have:
        return room, "the cgroup's memory limit"
    return have, where


def gib(n):
    return f"{n / GIB:.3g} GiB"
