"""Start a server group: one `python -m dashinfer_server` rank per NUMA node under mpiexec.

    python -m dashinfer_server.launch [--nodes N] [--threads-per-rank T] [--address ADDR]
        [--model-dir DIR --model-prefix P --model-name NAME] [other flags for the ranks...]

Every flag has an environment default (DASHINFER_NODES, DASHINFER_THREADS_PER_RANK,
DASHINFER_ADDRESS, DASHINFER_MODEL_DIR, DASHINFER_MODEL_PREFIX, DASHINFER_MODEL_NAME,
DASHINFER_LOG_LEVEL, DASHINFER_LOG_FORMAT); flags it does not know go to every rank unchanged (among
them --token-file, --admin-token-file, --tls-cert/--tls-key and the limits of docs/security.md; the
environment, DASHINFER_TOKEN... included, reaches every rank too). The node count
defaults to the NUMA nodes of dashinfer_server.topology (DASHINFER_NUMA_NODES simulates nodes).
It runs the mpiexec installed beside this Python (the mpich wheel's), never another one on PATH,
and replaces itself with it, so a supervisor's SIGTERM reaches mpiexec, which forwards it to the
ranks: rank 0 drains and shuts the workers down, and the group exits 0. Each rank gets its node
in DASHINFER_NODE and its OpenMP placement in its environment (and runs under numactl when that
is installed); the rank binds itself again at start (topology.place_rank).
"""
import glob
import logging
import os
import select
import shutil
import sys
import time

from dashinfer_client import settings
from dashinfer_client.proto.wire import default_address

from . import logs, topology
from .arguments import UsageParser, at_least, grpc_address
from .systemd import EX_CONFIG


def mpiexec_path() -> str:
    path = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    if not os.access(path, os.X_OK):
        raise SystemExit(f"dashinfer-launch: no mpiexec beside {sys.executable} "
                         f"(install the mpich wheel into this environment: pip install mpich)")
    return path


def parse_args(argv, env):
    p = UsageParser(prog="dashinfer-launch", description=__doc__.split("\n\n")[0])
    p.add_argument("--nodes", type=at_least(0), default=settings.get("DASHINFER_NODES", env),
                   help="ranks, one per NUMA node (default: every node)")
    p.add_argument("--first-node", type=at_least(0), default=0,
                   help="the ranks take the nodes from this node id on (DashInfer's AS_NUMA_OFFSET)")
    p.add_argument("--mpiexec", default=None,
                   help="the mpiexec that starts the ranks (default: the one beside this Python); it must "
                        "be of the MPI mpi4py was built with")
    p.add_argument("--threads-per-rank", type=at_least(0), default=settings.get("DASHINFER_THREADS_PER_RANK", env),
                   help="OpenMP threads per rank (default: the cores of its node)")
    p.add_argument("--address", type=grpc_address, default=settings.get("DASHINFER_ADDRESS", env),
                   help="gRPC address of rank 0: unix:///path.sock or 127.0.0.1:PORT "
                        "(default: a unix socket under $XDG_RUNTIME_DIR or /tmp)")
    p.add_argument("--model-dir", default=settings.get("DASHINFER_MODEL_DIR", env))
    p.add_argument("--model-prefix", default=settings.get("DASHINFER_MODEL_PREFIX", env))
    p.add_argument("--model-name", default=settings.get("DASHINFER_MODEL_NAME", env))
    p.add_argument("--log-level", type=str.upper, choices=logs.LEVELS, default=settings.get("DASHINFER_LOG_LEVEL", env))
    p.add_argument("--log-format", choices=logs.FORMATS, default=settings.get("DASHINFER_LOG_FORMAT", env),
                   help="text or json")
    p.add_argument("--dry-run", action="store_true", help="print the command instead of running it")
    return p.parse_known_args(argv)


def build_command(args, rest, env=None, sysfs: str = topology.SYSFS, numactl=None):
    """-> (argv, extra environment): the mpiexec command line that gives each rank its own
    environment, or for a single rank the python command line and its environment. Placement
    errors raise topology.PlacementError here, before anything starts."""
    env = os.environ if env is None else env
    nodes = topology.numa_nodes(env, sysfs)
    if args.first_node:
        nodes = [n for n in nodes if n.id >= args.first_node]
    count = args.nodes or len(nodes)
    if count > len(nodes) or not nodes:
        from_node = f" from node {args.first_node} on" if args.first_node else ""
        raise topology.PlacementError(f"--nodes {count}: this machine has {len(nodes)} NUMA node(s){from_node} "
                                      f"(DASHINFER_NUMA_NODES simulates more)")
    rank_args = ["-m", "dashinfer_server", "--address", args.address or default_address()]
    for flag, value in (("--threads", args.threads_per_rank), ("--model-dir", args.model_dir),
                        ("--model-prefix", args.model_prefix), ("--model-name", args.model_name),
                        ("--log-level", args.log_level), ("--log-format", args.log_format)):
        if value:
            rank_args += [flag, str(value)]
    rank_args += rest
    blocks = []
    for rank in range(count):
        place = topology.plan_placement(rank, count, args.threads_per_rank or None,
                                        dict(env, DASHINFER_NODE=str(nodes[rank].id)), sysfs)
        rank_env = {"DASHINFER_NODE": str(place.node.id), "OMP_NUM_THREADS": str(place.threads)}
        blocks.append((rank_env, _numactl(place, numactl) + [sys.executable] + rank_args))
    if count == 1:
        return blocks[0][1], blocks[0][0]
    cmd = [args.mpiexec or mpiexec_path()]
    for i, (rank_env, argv) in enumerate(blocks):
        if i:
            cmd.append(":")
        cmd += ["-n", "1"]
        for k, v in rank_env.items():
            cmd += ["-env", k, v]
        cmd += argv
    return cmd, mpiexec_env(env)


def mpiexec_env(env) -> dict:
    """What mpiexec's environment needs beyond the caller's. Without HWLOC_XMLFILE, MPICH's mpiexec
    writes the machine's topology to /tmp/hydra_hwloc_xmlfile_* for its ranks and removes it when
    it exits: a SIGKILLed or OOM-killed group leaves the file behind. Set (empty: hwloc reads the
    machine itself, as it did to write the file), nothing is written."""
    return {} if "HWLOC_XMLFILE" in env else {"HWLOC_XMLFILE": ""}


def _numactl(place, numactl) -> list:
    """numactl binding of a rank when numactl is installed (memory only to real nodes)."""
    numactl = shutil.which("numactl") if numactl is None else numactl
    if not numactl:
        return []
    cmd = [numactl, "--physcpubind=" + ",".join(map(str, place.node.cpus))]
    if place.node.real and place.membind == "bind":
        cmd.append(f"--membind={place.node.id}")
    elif place.node.real and place.membind == "preferred":
        cmd.append(f"--preferred={place.node.id}")
    return cmd


def mapped_mpich_segments(maps_glob: str = "/proc/[0-9]*/maps") -> set:
    """The MPICH segments the processes of `maps_glob` map (default: every process we can read)."""
    mapped = set()
    for maps in glob.glob(maps_glob):
        try:
            with open(maps) as f:
                mapped.update(line.split(None, 5)[5].strip() for line in f if "mpich_sh" in line)
        except (OSError, IndexError):
            continue  # gone, or not ours to read
    return mapped


def sweep_when_unmapped(paths, timeout_s: float = 120.0) -> None:
    """Remove the files `paths` of a group on its way out (MPICH segments, a socket) as soon as no
    process maps them (its ranks have exited, however they ended); give up after timeout_s."""
    paths = set(paths)
    deadline = time.monotonic() + timeout_s
    while paths and time.monotonic() < deadline:
        for path in paths - mapped_mpich_segments():
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
            paths.discard(path)
        time.sleep(0.2)


def sweep_after_exit(pid: int, paths) -> None:
    """Wait, without polling, until process `pid` (a group's rank 0) and every process that maps
    one of `paths` now have exited; then remove `paths` (the group's unix socket, its MPICH
    segments) once nothing maps them (sweep_when_unmapped)."""
    holders = {pid} | {int(maps.split("/")[2]) for maps in glob.glob("/proc/[0-9]*/maps")
                       if mapped_mpich_segments(maps) & set(paths)}
    for holder in holders:
        try:
            fd = os.pidfd_open(holder)
        except OSError:  # gone already
            continue
        try:
            select.select([fd], [], [])  # readable when the process exits
        finally:
            os.close(fd)
    sweep_when_unmapped(paths)


def sweep_stale_mpich_segments(shm_dir: str = "/dev/shm", min_age_s: float = 1) -> list:
    """Remove this user's MPICH segments (mpich_shm_*, mpich_shar_tmp*) that no process maps any
    more. MPICH removes them when the job ends normally but leaves them when a rank is killed; a
    restarted group (systemd Restart=) cleans up after the one that died. Segments younger than
    min_age_s are left alone: a job starting this instant may not have mapped its own yet
    (MPICH maps it right after creating it)."""
    stale = []
    for path in glob.glob(os.path.join(shm_dir, "mpich_sh*")):
        try:
            st = os.stat(path)
        except OSError:
            continue
        if st.st_uid == os.getuid() and time.time() - st.st_mtime > min_age_s:
            stale.append(path)
    if not stale:
        return []
    mapped = mapped_mpich_segments()
    removed = []
    for path in stale:
        if path not in mapped:
            try:
                os.unlink(path)
                removed.append(path)
            except OSError:
                pass
    return removed


def main(argv=None) -> int:
    try:
        settings.check_environment()
    except settings.SettingError as e:
        print(f"dashinfer-launch: {e}", file=sys.stderr)
        return EX_CONFIG
    args, rest = parse_args(sys.argv[1:] if argv is None else argv, os.environ)
    # the launcher's own lines in the ranks' format: a collector reading JSON gets only JSON
    logs.configure((args.log_level or "INFO").upper(), args.log_format or "text")
    log = logging.getLogger("dashinfer_server.launch")
    try:
        cmd, extra_env = build_command(args, rest)
    except topology.PlacementError as e:
        log.error("%s", e)
        return EX_CONFIG
    if args.dry_run:
        print(" ".join(f"{k}={v}" for k, v in extra_env.items()), " ".join(cmd))
        return 0
    for path in sweep_stale_mpich_segments():
        log.warning("removed %s, left by a group that died", path)
    sys.stdout.flush()
    os.execve(cmd[0], cmd, {**os.environ, **extra_env})


if __name__ == "__main__":
    sys.exit(main())
