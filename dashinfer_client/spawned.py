"""A local server a ClientEngine spawned: the launcher's process (mpiexec and its ranks under it,
or the one rank), its output and its socket. The process runs in its own session, so stopping it
reaches every rank; it shuts itself down when the stdin we hold closes (this process died)."""
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections import deque

from . import settings
from .proto.wire import REQUEST_LOGGER, parse_log_line, unix_socket_path

log = logging.getLogger("dashinfer_client")
server_log = logging.getLogger("dashinfer_client.server")
server_request_log = server_log.getChild("requests")  # the ranks' REQUEST_LOGGER lines


def launch_command(address, nodes=None, threads_per_rank=None, env=None) -> list:
    """The command that starts a local server serving on `address`: the launcher, one rank per NUMA
    node (nodes: how many; default AS_NUMA_NUM, else every node), threads_per_rank OpenMP threads
    each (default: the cores of its node). env: the server's environment, where DashInfer's
    ClientEngine variables are read (upstream_settings). Rank 0 shuts the ranks down when our end of
    its stdin closes."""
    upstream = upstream_settings(os.environ if env is None else env)
    nodes = nodes or upstream.get("nodes")
    cmd = [sys.executable, "-m", "dashinfer_server.launch", "--address", address]
    if nodes:
        cmd += ["--nodes", str(int(nodes))]
    if upstream.get("first_node"):
        cmd += ["--first-node", str(upstream["first_node"])]
    if upstream.get("mpiexec"):
        cmd += ["--mpiexec", upstream["mpiexec"]]
    if threads_per_rank:
        cmd += ["--threads-per-rank", str(int(threads_per_rank))]
    return cmd + ["--exit-on-stdin-eof"]


def upstream_settings(env) -> dict:
    """DashInfer's ClientEngine variables, as launch settings: AS_NUMA_NUM (ranks, one per NUMA
    node) -> "nodes", AS_NUMA_OFFSET (the first node they take) -> "first_node", AS_DAEMON_PATH
    (the directory of DashInfer's mpirun) -> "mpiexec", its mpiexec or mpirun when it has one (a
    DashInfer install's directory has neither here: the default mpiexec is kept, with a warning).
    DASHINFER_NUMA_NODES, the node simulation, wins over AS_NUMA_NUM and AS_NUMA_OFFSET."""
    chosen = {}
    numa = {name: settings.get(key, env) for key, name in (("AS_NUMA_NUM", "nodes"), ("AS_NUMA_OFFSET", "first_node"))
            if settings.get(key, env) is not None}
    if numa and settings.get("DASHINFER_NUMA_NODES", env):
        log.info("DASHINFER_NUMA_NODES is set: it places the ranks, AS_NUMA_NUM / AS_NUMA_OFFSET ignored")
    else:
        chosen.update(numa)
    folder = settings.get("AS_DAEMON_PATH", env)
    if folder:
        found = [p for p in (os.path.join(folder, n) for n in ("mpiexec", "mpirun")) if os.access(p, os.X_OK)]
        if found:
            chosen["mpiexec"] = found[0]
        else:
            log.warning("AS_DAEMON_PATH=%s has no mpiexec or mpirun: the group starts with the mpiexec "
                        "beside %s", folder, sys.executable)
    return chosen


class SpawnedServer:
    """The launcher's process, the tail of its output, its socket file."""

    def __init__(self, command, address, env):
        self.address = address
        self.socket = unix_socket_path(address)
        self.tail = deque(maxlen=40)
        self.proc = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, env=env, start_new_session=True)
        self._reader = threading.Thread(target=self._drain, args=(self.proc.stdout,), daemon=True,
                                        name="dashinfer-server-output")
        self._reader.start()

    def _drain(self, pipe) -> None:
        """Keep the output's tail, and pass its log records on to this process's logging at their
        level (logger dashinfer_client.server), as if the server ran in-process."""
        level, logger = logging.INFO, server_log
        for raw in iter(pipe.readline, b""):
            line = raw.decode(errors="replace").rstrip()
            self.tail.append(line)
            record = parse_log_line(line)
            if record:  # else a continuation (traceback) or foreign output: the previous level
                level, line = logging.getLevelName(record[0]), record[1]
                logger = server_request_log if line.startswith(REQUEST_LOGGER + "[") else server_log
            logger.log(level, "%s", line)
        pipe.close()

    @staticmethod
    def _sweep() -> None:
        """Ranks that died leave MPICH's shared-memory segments in /dev/shm: remove those no
        process maps any more (the launcher's sweep, run as a process of the server package)."""
        code = ("from dashinfer_server.launch import sweep_stale_mpich_segments as sweep; "
                "sweep(min_age_s=0)")
        subprocess.run([sys.executable, "-c", code], stdin=subprocess.DEVNULL, capture_output=True,
                       timeout=60, check=False)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def describe_exit(self, wait=0.0) -> str:
        """Why the server is gone: its exit code and last output lines ("" while it runs)."""
        try:
            code = self.proc.wait(wait) if wait else self.proc.poll()
        except subprocess.TimeoutExpired:
            code = None
        if code is None:
            return ""
        self._reader.join(1.0)  # its last lines
        lines = "\n    ".join(list(self.tail)[-15:]) or "(no output)"
        return f"the server process exited with code {code}; its last output:\n    {lines}"

    def stop(self, timeout=15.0) -> None:
        """SIGTERM to the leader (rank 0 or its launcher drains and stops the others), SIGKILL to
        the whole process group after `timeout` s; reap; remove the socket file."""
        proc = self.proc
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                log.warning("the server did not stop within %.0f s; killing it", timeout)
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # whatever of its processes is left (its own session)
        except (ProcessLookupError, PermissionError):
            pass
        if proc.wait() != 0:
            _wait_process_group_gone(proc.pid)  # its ranks unmap their segments only as they exit
            self._sweep()
        if proc.stdin:
            try:
                proc.stdin.close()
            except OSError:
                pass
        if self.socket:
            try:
                os.unlink(self.socket)
            except FileNotFoundError:
                pass


def _wait_process_group_gone(pgid, timeout=5.0) -> None:
    """Wait until no process of process group `pgid` is left (or `timeout` s)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except (ProcessLookupError, PermissionError):
            return
        time.sleep(0.02)
