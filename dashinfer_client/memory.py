"""How much memory this machine (or one of its NUMA nodes) can still give, so that work which
would not fit (a conversion, a model's weights + KV cache + workspaces) is refused with both
figures before it starts, rather than killed halfway by the OOM killer.

What can be given: DASHINFER_MEMORY_LIMIT_MB when set (a rank's budget, whatever the machine has);
else MemAvailable (/proc/meminfo), lowered to what this process's cgroup still allows
(memory.max - memory.current, cgroup v2); of a real NUMA node, its MemFree + FilePages (the node's
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


def _cgroup_room():
    """Bytes this process's cgroup (v2) still allows, or None when it sets no limit."""
    try:
        with open("/proc/self/cgroup") as f:
            path = next((line.strip().split(":", 2)[2] for line in f if line.startswith("0::")), None)
        if path is None:
            return None
        folder = os.path.join(_CGROUP, path.lstrip("/"))
        with open(os.path.join(folder, "memory.max")) as f:
            limit = f.read().strip()
        if limit == "max":
            return None
        with open(os.path.join(folder, "memory.current")) as f:
            return max(0, int(limit) - int(f.read().strip()))
    except (OSError, ValueError, IndexError):
        return None


def available(node=None):
    """(bytes, where the figure comes from): what the machine, or NUMA node `node` (a real one),
    can give now."""
    limit = settings.get("DASHINFER_MEMORY_LIMIT_MB")
    if limit:
        return limit * 2**20, "DASHINFER_MEMORY_LIMIT_MB"
    if node is None:
        have, where = _meminfo("/proc/meminfo").get("MemAvailable"), "MemAvailable"
    else:
        info = _meminfo(f"/sys/devices/system/node/node{node}/meminfo", f"Node {node} ")
        have, where = info["MemFree"] + info.get("FilePages", 0), f"node {node}'s free memory and page cache"
    room = _cgroup_room()
    if room is not None and room < have:
        return room, "the cgroup's memory.max"
    return have, where


def gib(n):
    return f"{n / GIB:.3g} GiB"
