"""Bounded resources of the gRPC service: how many sessions and open streams it serves, and the
worker threads they take (docs/security.md).

A call that can last (a Session, a request streamed on its own call, a sync) holds one worker
thread of the sync gRPC server. StreamLimits caps them per session and in all, so the threads
never run out: the short calls and the health probes always find one. WorkerPool is the server's
executor: its threads are created when calls need them and exit after a while idle, so a crowd
of clients that has left gives its threads back.
"""
import collections
import threading
from concurrent import futures

import grpc

DEFAULT_MAX_SESSIONS = 128
DEFAULT_MAX_STREAMS = 256  # every session's together
DEFAULT_MAX_STREAMS_PER_SESSION = 64
RESERVED_THREADS = 32  # beyond the limits above: short calls and health probes
WORKER_IDLE_S = 5.0
DEFAULT_FINISHED_REQUEST_TTL = 600.0


class LimitReached(Exception):
    """Over a limit: the message says which (the call answers RESOURCE_EXHAUSTED with it)."""


class StreamLimits:
    """Counts sessions and long calls; a call over a limit raises LimitReached."""

    def __init__(self, max_sessions=DEFAULT_MAX_SESSIONS, max_streams=DEFAULT_MAX_STREAMS,
                 max_streams_per_session=DEFAULT_MAX_STREAMS_PER_SESSION):
        for name, value in (("max_sessions", max_sessions), ("max_streams", max_streams),
                            ("max_streams_per_session", max_streams_per_session)):
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")
        self.max_sessions, self.max_streams = max_sessions, max_streams
        self.max_streams_per_session = max_streams_per_session
        self._lock = threading.Lock()
        self.sessions = 0
        self.streams = collections.Counter()  # owner (session id, or a peer without one) -> open streams

    @property
    def threads_needed(self) -> int:
        """Worker threads that serve every allowed session and stream with some to spare."""
        return self.max_sessions + self.max_streams + RESERVED_THREADS

    def open_session(self) -> None:
        with self._lock:
            if self.sessions >= self.max_sessions:
                raise LimitReached(f"the server has {self.sessions} sessions open, its limit "
                                   f"(--max-sessions {self.max_sessions}); try again when a client has left")
            self.sessions += 1

    def close_session(self) -> None:
        with self._lock:
            self.sessions -= 1

    def open_stream(self, owner: str) -> None:
        """One more long call of `owner` (a session id, or the peer address of a client without one)."""
        with self._lock:
            if self.streams[owner] >= self.max_streams_per_session:
                raise LimitReached(f"this client has {self.streams[owner]} streams open, the limit per "
                                   f"session (--max-streams-per-session {self.max_streams_per_session})")
            total = sum(self.streams.values())
            if total >= self.max_streams:
                raise LimitReached(f"the server has {total} streams open, its limit (--max-streams "
                                   f"{self.max_streams}); try again when some have ended")
            self.streams[owner] += 1

    def close_stream(self, owner: str) -> None:
        with self._lock:
            self.streams[owner] -= 1
            if self.streams[owner] <= 0:
                del self.streams[owner]


def open_or_abort(context, take, what) -> None:
    """take() a place under a limit, or end the call RESOURCE_EXHAUSTED with the reason."""
    try:
        take()
    except LimitReached as e:
        context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, f"{what}: {e}")


def wait_while_called(context, queues) -> bool:
    """Wait until every queue's request has ended -> True, or until the caller has gone (a
    deadline, a cancel, a lost connection) -> False: a sync must not hold its thread and its
    stream's place for a caller that gave up."""
    for queue in queues:
        while not queue.wait_finished(0.2):
            if not context.is_active():
                return False
    return context.is_active()


class WorkerPool(futures.Executor):
    """A thread pool whose threads exit after idle_s seconds without work (the standard one keeps
    every thread it ever made). At most max_workers threads; work beyond them waits its turn."""

    def __init__(self, max_workers: int, idle_s: float = WORKER_IDLE_S, name: str = "dashinfer-grpc"):
        self.max_workers, self.idle_s, self.name = max_workers, idle_s, name
        self._cond = threading.Condition()
        self._work = collections.deque()
        self._threads = set()
        self._idle = 0
        self._shutdown = False
        self._made = 0

    def submit(self, fn, /, *args, **kwargs):
        future = futures.Future()
        with self._cond:
            if self._shutdown:
                raise RuntimeError("cannot schedule new work after shutdown")
            self._work.append((future, fn, args, kwargs))
            if len(self._work) > self._idle and len(self._threads) < self.max_workers:
                self._made += 1
                thread = threading.Thread(target=self._run, name=f"{self.name}_{self._made}", daemon=True)
                self._threads.add(thread)
                thread.start()
            self._cond.notify()
        return future

    def _run(self) -> None:
        me = threading.current_thread()
        while True:
            with self._cond:
                self._idle += 1
                if not self._work and not self._shutdown:
                    self._cond.wait(self.idle_s)
                self._idle -= 1
                if not self._work:  # idle too long, or shut down
                    self._threads.discard(me)
                    return
                future, fn, args, kwargs = self._work.popleft()
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(fn(*args, **kwargs))
            except BaseException as e:  # the future carries it to whoever waits
                future.set_exception(e)
            del future, fn, args, kwargs  # not held while idle

    @property
    def threads(self) -> int:
        with self._cond:
            return len(self._threads)

    def shutdown(self, wait=True, *, cancel_futures=False) -> None:
        with self._cond:
            self._shutdown = True
            if cancel_futures:
                while self._work:
                    self._work.popleft()[0].cancel()
            threads = list(self._threads)
            self._cond.notify_all()
        if wait:
            for t in threads:
                t.join()


def add_arguments(p) -> None:
    """The flags of `python -m dashinfer_server` that bound what clients may hold."""
    g = p.add_argument_group("limits (docs/security.md)")
    g.add_argument("--max-sessions", type=int, default=DEFAULT_MAX_SESSIONS,
                   help=f"clients connected at once (ClientEngine sessions; default {DEFAULT_MAX_SESSIONS})")
    g.add_argument("--max-streams", type=int, default=DEFAULT_MAX_STREAMS,
                   help="long calls open at once, every client's together: requests streamed on their "
                        f"own call, syncs (default {DEFAULT_MAX_STREAMS})")
    g.add_argument("--max-streams-per-session", type=int, default=DEFAULT_MAX_STREAMS_PER_SESSION,
                   help=f"long calls open at once per client (default {DEFAULT_MAX_STREAMS_PER_SESSION})")
    g.add_argument("--finished-request-ttl", type=float, default=DEFAULT_FINISHED_REQUEST_TTL,
                   help="seconds a request that finished on its own stream, without a session, stays "
                        f"unreleased before the server releases it (default {DEFAULT_FINISHED_REQUEST_TTL:g})")


def from_arguments(args) -> StreamLimits:
    """The limits of the parsed flags; ValueError when one is not >= 1."""
    if not args.finished_request_ttl > 0:
        raise ValueError(f"--finished-request-ttl must be > 0, got {args.finished_request_ttl}")
    return StreamLimits(args.max_sessions, args.max_streams, args.max_streams_per_session)
