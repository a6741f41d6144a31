"""One rank of an mpiexec'd tensor-parallel group (MPIGroup): rank 0's messages to the others
(commands, step plans) and the collectives of a forward (allreduce, vocabulary gather).

Joining a group is group.py's (init_group); what slice of the model each rank owns, shard.py's.
"""
import atexit
import json
import logging
import os
import secrets
import sys
import threading
import time

import numpy as np

from dashinfer_client import settings

from . import kernels as K
from .plan import StepPlan
from .shard import split_range

log = logging.getLogger("dashinfer_server")


# ---- the multi-rank group --------------------------------------------------------------------
#
# Rank 0 drives; the others (worker.run_worker) mirror each of its calls. Every message starts
# with one broadcast of a fixed int32 header that carries the payload too when it fits (a decode
# step of a few dozen sequences does), so most steps cost one collective before the forward.
#
# Threads: on rank 0, Engine.command runs on a user / gRPC thread while step and the forward's
# collectives run on the scheduler thread. MPI runs at THREAD_SERIALIZED and one lock makes the
# calls of the two threads alternate; a step holds the lock from step() to the end of
# gather_vocab() so a command cannot slip between the collectives of a forward.

HEAD = 1024                      # int32 words of the header broadcast
FIELDS = 8                       # header words before the inline payload
STEP, COMMAND, SHUTDOWN = 1, 2, 3
REPLY = 1024                     # int32 words of a worker's reply to a command
SHM_CAPACITY = 1 << 18           # floats per shared-memory slot (1 MiB): longer vectors go in chunks
SHM_SPLIT = 1 << 16              # floats from which the shm allreduce reduce-scatters + allgathers
ABORT_GRACE = 0.3                # s for mpiexec to forward the last output before an abort


def _wait(request, spin_s: float = 0.02) -> None:
    """Complete a nonblocking MPI request without burning a core while the group is idle:
    spin for spin_s (steps follow each other faster than that), then poll with short sleeps."""
    deadline = time.perf_counter() + spin_s
    while not request.Test():
        if time.perf_counter() > deadline:
            break
    nap = 1e-4
    while not request.Test():
        time.sleep(nap)
        nap = min(nap * 2, 5e-3)


def _encode(text: str) -> np.ndarray:
    raw = text.encode()
    return np.frombuffer(raw + b"\0" * (-len(raw) % 4), np.int32)


def _decode(words: np.ndarray, nbytes: int) -> str:
    return words.tobytes()[:nbytes].decode(errors="replace")


class MPIGroup:
    """One rank of a tensor-parallel group of MPI processes (COMM_WORLD)."""

    def __init__(self, comm):
        from mpi4py import MPI
        self._MPI = MPI
        self.comm = comm
        self.rank, self.world = comm.Get_rank(), comm.Get_size()
        self._lock = threading.Lock()
        self._step_open = False
        self._closed = False
        self._head = np.zeros(HEAD, np.int32)
        self._payload = np.zeros(HEAD, np.int32)
        self._reply = np.zeros(REPLY, np.int32)
        self._stage = np.zeros(0, np.float32)  # rank 0: logits shards of several rows
        self._starts = None                     # int32 [world+1]: vocabulary shard borders
        self._replies = np.zeros((self.world, REPLY), np.int32) if self.rank == 0 else None
        self.timeout = settings.get("DASHINFER_ALLREDUCE_TIMEOUT")
        self._shm = None
        self.allreduce_kind = self._setup_allreduce(settings.get("DASHINFER_ALLREDUCE"))
        if self.rank == 0:
            atexit.register(self.close)

    @classmethod
    def init(cls) -> "MPIGroup":
        """Initialize MPI (THREAD_SERIALIZED) and wrap COMM_WORLD."""
        import mpi4py
        mpi4py.rc.thread_level = "serialized"
        from mpi4py import MPI
        if MPI.Query_thread() < MPI.THREAD_SERIALIZED:
            raise RuntimeError("the MPI library does not provide MPI_THREAD_SERIALIZED")
        group = cls(MPI.COMM_WORLD)
        sys.excepthook = group._abort_on_uncaught
        return group

    def _abort_on_uncaught(self, kind, error, tb) -> None:
        """A rank that dies of an exception must take the job down at once: exiting normally
        would enter MPI_Finalize while its peers wait for it in a collective."""
        log.critical("rank %d: uncaught %s: aborting the group", self.rank, kind.__name__,
                     exc_info=(kind, error, tb))
        self.abort(1)

    # ---- allreduce ----------------------------------------------------------------------

    def _setup_allreduce(self, kind: str) -> str:
        """'shm' when every rank is on this host (unless DASHINFER_ALLREDUCE=mpi), else 'mpi'."""
        if kind == "mpi":
            return "mpi"
        local = self.comm.Split_type(self._MPI.COMM_TYPE_SHARED)
        one_host = local.Get_size() == self.world
        local.Free()
        if not one_host:
            if kind == "shm":
                raise RuntimeError("DASHINFER_ALLREDUCE=shm needs every rank on one host")
            return "mpi"
        self._open_shm()
        return "shm"

    def _open_shm(self) -> None:
        """Rank 0 creates a segment named for this group, the others map it, and rank 0 removes
        the name once all have (or have failed): nothing stays in /dev/shm however ranks die."""
        name, error = None, None
        if self.rank == 0:
            _sweep_stale_segments()
            name = f"/dashinfer-{os.getpid()}-{secrets.token_hex(4)}"
            try:
                self._shm = K.comm_open(name, 0, self.world, SHM_CAPACITY)
            except OSError as e:
                name, error = None, str(e)
        name = self.comm.bcast(name, root=0)
        if name and self.rank:
            try:
                self._shm = K.comm_open(name, self.rank, self.world, SHM_CAPACITY)
            except OSError as e:
                error = str(e)
        errors = self.comm.allgather(error)
        if self.rank == 0 and name:
            K.comm_unlink(name)
        if any(errors):
            raise RuntimeError("shared-memory allreduce: " + "; ".join(
                f"rank {r}: {e}" for r, e in enumerate(errors) if e))
        K.comm_set_split_threshold(self._shm, SHM_SPLIT)
        self._comm_allreduce, self._comm_gather = K.comm_allreduce, K.comm_gather_columns

    def native_allreduce(self):
        return (self._shm, self.timeout) if self._shm is not None else None

    def allreduce_(self, x) -> None:
        """Sum float32 x over the ranks, in place (inside a step: the lock is held)."""
        if self._shm is not None:
            self._comm_allreduce(self._shm, x, self.timeout)
        else:
            self.comm.Allreduce(self._MPI.IN_PLACE, x, op=self._MPI.SUM)

    def gather_vocab(self, local, out, last=True) -> None:
        """Rank 0 receives every rank's logits shard local [S, V_r] into out [S, V]'s columns;
        the others send theirs (their out gives V, and is not written). Shared memory when the
        group has it, else MPI Gatherv. The step's last gather (the sampled rows', after any
        scored prompt rows') ends the step on rank 0 (a failure leaves it open: step_failed aborts)."""
        MPI = self._MPI
        if self._shm is not None:
            starts = self._column_starts(out.shape[1])
            if int(np.diff(starts).max()) <= SHM_CAPACITY:
                self._comm_gather(self._shm, local, out if self.rank == 0 else None, starts, self.timeout)
                if self.rank == 0 and last:
                    self._end_step()
                return
        if self.rank:
            self.comm.Gatherv(local, None, root=0)
            return
        s, vocab = out.shape
        bounds = [split_range(vocab, r, self.world) for r in range(self.world)]
        if s == 1:  # one row: every shard is a contiguous piece of out
            out[:, :bounds[0][1]] = local
            counts = [0] + [b - a for a, b in bounds[1:]]
            displs = [a for a, _ in bounds]
            self.comm.Gatherv(MPI.IN_PLACE, [out, counts, displs, MPI.FLOAT], root=0)
        else:  # several rows: shards arrive one after another, then go to out's columns
            counts = [0] + [s * (b - a) for a, b in bounds[1:]]
            displs = np.concatenate([[0], np.cumsum(counts)[:-1]]).tolist()
            staging = self._staging(sum(counts))
            self.comm.Gatherv(MPI.IN_PLACE, [staging, counts, displs, MPI.FLOAT], root=0)
            out[:, :bounds[0][1]] = local
            for r in range(1, self.world):
                a, b = bounds[r]
                out[:, a:b] = staging[displs[r]:displs[r] + counts[r]].reshape(s, b - a)
        if last:
            self._end_step()

    def _column_starts(self, vocab: int) -> np.ndarray:
        """int32 [world+1]: where each rank's vocabulary shard starts (split_range's cut)."""
        if self._starts is None or self._starts[-1] != vocab:
            self._starts = np.array([split_range(vocab, r, self.world)[0] for r in range(self.world)]
                                    + [vocab], np.int32)
        return self._starts

    def _staging(self, n: int) -> np.ndarray:
        if self._stage.size < n:
            self._stage = np.empty(n, np.float32)
        return self._stage[:n]

    # ---- rank 0 ---------------------------------------------------------------------------

    def command(self, name: str, payload: dict) -> None:
        """Run an engine command on every worker; RuntimeError naming each rank that failed."""
        with self._lock:
            self._check_open()
            self._send(COMMAND, [len(name.encode())], [_encode(name), _encode(json.dumps(payload))])
            self._reply[:] = 0
            request = self.comm.Igather(self._reply, self._replies, root=0)
            _wait(request)
        failed = []
        for r in range(1, self.world):
            ok, nbytes = self._replies[r, :2]
            if not ok:
                failed.append(f"rank {r}: {_decode(self._replies[r, 2:], int(nbytes))}")
        if failed:
            raise RuntimeError(f"{name} failed on " + "; ".join(failed))

    def step(self, model_name: str, plan) -> None:
        """Broadcast the step's plan; the lock stays held until gather_vocab ends the step."""
        self._lock.acquire()
        try:
            self._check_open()
            bt = plan.block_tables
            self._send(STEP, [len(model_name.encode()), plan.num_tokens, bt.shape[0], bt.shape[1],
                              len(plan.sample_rows), len(plan.score_rows)],
                       [_encode(model_name), *(a.reshape(-1) for a in plan.arrays())])
        except BaseException:
            self._lock.release()
            raise
        self._step_open = True

    def _end_step(self) -> None:
        if self._step_open:
            self._step_open = False
            self._lock.release()

    def step_failed(self, error: BaseException) -> None:
        """Rank 0's forward raised mid-step: the workers wait in a collective that will never
        come, and nothing can resynchronize them, so the whole MPI job ends (the supervisor
        restarts it)."""
        if self._step_open:
            log.critical("rank 0 failed in the middle of a step (%s: %s): aborting the group",
                         type(error).__name__, error)
            self.abort(1)

    def close(self) -> None:
        """Tell the workers to exit and unmap the segment (rank 0; idempotent)."""
        if self._closed or self.rank:
            return
        if not self._lock.acquire(timeout=10):
            log.critical("a step never ended: aborting the group instead of shutting it down")
            self.abort(1)
        try:
            self._send(SHUTDOWN, [], [])
            self._closed = True
            if self._shm is not None:
                K.comm_close(self._shm)
        finally:
            self._lock.release()

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("the group has been shut down")

    def _send(self, kind: int, fields: list, parts: list) -> None:
        """Broadcast a header (kind, payload size, fields) and the payload (int32 parts)."""
        n = sum(p.size for p in parts)
        head = self._head
        head[0], head[1] = kind, n
        head[2:2 + len(fields)] = fields
        inline = n <= HEAD - FIELDS
        if inline and n:
            np.concatenate(parts, out=head[FIELDS:FIELDS + n])
        self.comm.Ibcast(head, root=0).Wait()
        if not inline:
            payload = self._payload_buffer(n)
            np.concatenate(parts, out=payload)
            self.comm.Bcast(payload, root=0)

    def _payload_buffer(self, n: int) -> np.ndarray:
        if self._payload.size < n:
            self._payload = np.zeros(max(n, 2 * self._payload.size), np.int32)
        return self._payload[:n]

    # ---- workers --------------------------------------------------------------------------

    def receive(self):
        """Wait for rank 0's next message: ("step", model_name, StepPlan), ("command", name,
        payload) or ("shutdown",). A step's arrays are views valid until the next receive."""
        head = self._head
        _wait(self.comm.Ibcast(head, root=0))
        kind, n = int(head[0]), int(head[1])
        if kind == SHUTDOWN:
            return ("shutdown",)
        if n <= HEAD - FIELDS:
            words = head[FIELDS:FIELDS + n]
        else:
            words = self._payload_buffer(n)
            self.comm.Bcast(words, root=0)
        name_len = int(head[2])
        name_words = -(-name_len // 4)
        name = _decode(words[:name_words], name_len)
        rest = words[name_words:]
        if kind == COMMAND:
            return ("command", name, json.loads(rest.tobytes().rstrip(b"\0").decode()))
        if kind != STEP:
            raise RuntimeError(f"unknown message kind {kind} from rank 0")
        t, b, mb, s, r = (int(v) for v in head[3:8])
        sizes = [t, t, t, b + 1, b, b * mb, s, r]
        cuts = np.cumsum(sizes)[:-1]
        token_ids, positions, slots, q_offsets, context_lens, tables, sample_rows, score_rows = np.split(rest, cuts)
        return ("step", name, StepPlan(token_ids, positions, slots, q_offsets, context_lens,
                                       tables.reshape(b, mb), sample_rows, score_rows))

    def reply(self, error: str | None = None) -> None:
        """Answer a command: success, or the error (truncated to fit the reply)."""
        self._reply[:] = 0
        if error is None:
            self._reply[0] = 1
        else:
            raw = error.encode()[: (REPLY - 2) * 4]
            words = np.frombuffer(raw + b"\0" * (-len(raw) % 4), np.int32)
            self._reply[1] = len(raw)
            self._reply[2:2 + words.size] = words
        self.comm.Igather(self._reply, None, root=0).Wait()

    def abort(self, code: int = 1) -> None:
        """End every rank of the job now (a rank failed where its peers cannot go on)."""
        logging.shutdown()
        sys.stderr.flush()
        # mpiexec forwards our output and handles the abort on different sockets: without a
        # moment for it to read the pipes, the one message saying why the job died can be lost.
        time.sleep(ABORT_GRACE)
        self.comm.Abort(code)


def _sweep_stale_segments(shm_dir: str = "/dev/shm") -> None:
    """Remove segments of this runtime whose creator is gone (a rank 0 killed in the instant
    between creating a segment and removing its name)."""
    try:
        names = [n for n in os.listdir(shm_dir) if n.startswith("dashinfer-")]
    except OSError:
        return
    for n in names:
        try:
            pid = int(n.split("-")[1])
            if os.stat(os.path.join(shm_dir, n)).st_uid != os.getuid():
                continue
            os.kill(pid, 0)
        except ProcessLookupError:
            try:
                os.unlink(os.path.join(shm_dir, n))
            except OSError:
                pass
        except (ValueError, IndexError, OSError):
            continue
