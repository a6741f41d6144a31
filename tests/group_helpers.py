"""Looking at a spawned server group from outside, through /proc: its processes, its ranks, and
the files in /tmp and /dev/shm they hold."""
import glob
import os

from dashinfer_client.proto.wire import private_socket_dir

SHARED_DIRS = ("/tmp", "/dev/shm")


def _parents() -> dict:
    parents = {}
    for stat in glob.glob("/proc/[0-9]*/stat"):
        try:
            with open(stat) as f:
                parents[int(stat.split("/")[2])] = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
    return parents


def process_tree(pid) -> set:
    """`pid` and its descendants (mpiexec, its proxy and the ranks)."""
    parents = _parents()
    tree = {pid} if pid in parents else set()
    while True:
        more = {child for child, parent in parents.items() if parent in tree} - tree
        if not more:
            return tree
        tree |= more


def rank_pids(leader) -> dict:
    """{rank: pid} of the ranks under the group leader `leader` (by their MPI environment)."""
    ranks = {}
    for pid in process_tree(leader):
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = f.read().split(b"\0")
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmdline = f.read()
        except OSError:
            continue
        rank = [e for e in env if e.startswith(b"PMI_RANK=")]
        if rank and b"dashinfer_server\0" in cmdline:
            ranks[int(rank[0].split(b"=")[1])] = pid
    return ranks


def held_files(pids) -> set:
    """Paths under /tmp or /dev/shm that the processes map or hold open (deleted ones left out)."""
    held = set()
    for pid in pids:
        paths = []
        try:
            with open(f"/proc/{pid}/maps") as f:
                paths += [fields[5].strip() for fields in (line.split(None, 5) for line in f) if len(fields) == 6]
            for fd in os.listdir(f"/proc/{pid}/fd"):
                try:
                    paths.append(os.readlink(f"/proc/{pid}/fd/{fd}"))
                except OSError:
                    continue
        except OSError:
            continue
        held.update(p for p in paths if p.startswith(tuple(d + "/" for d in SHARED_DIRS))
                    and not p.endswith("(deleted)"))
    return held


def our_files() -> set:
    """The sockets of the servers this process spawned, and the shared memory named after us."""
    return set(glob.glob(f"{private_socket_dir()}/dashinfer-{os.getuid()}-{os.getpid()}-*")
               + glob.glob("/dev/shm/*dashinfer*"))
