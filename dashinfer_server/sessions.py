"""What the gRPC service keeps per request it started and per client session (service.py)."""
import threading


class HeldRequest:
    """A request the service started: the Engine's handle, its queue, the session owning it (None:
    the holder of its handle), whether it streams, when its own stream ended (no session)."""
    __slots__ = ("engine_handle", "queue", "session", "streaming", "ended_at")

    def __init__(self, engine_handle, queue, session):
        self.engine_handle, self.queue, self.session, self.streaming = engine_handle, queue, session, True
        self.ended_at = None


class ClientSession:
    """A client's Session stream: the requests it owns, and the events of those routed to it
    (their queues mark it dirty and wake it; the stream sends what changed)."""
    __slots__ = ("wake", "left", "requests", "routed", "dirty", "lock")

    def __init__(self):
        self.wake = threading.Event()
        self.left = False
        self.requests = set()  # (model_name, handle)
        self.routed = {}  # key -> (queue, stats sent): requests whose events go on this stream
        self.dirty = {}  # keys of routed requests with news, in order (a dict as ordered set)
        self.lock = threading.Lock()

    def route(self, key, queue, sent) -> None:
        """Carry the events of request `key` from now on; `sent`: the statistics already sent."""
        with self.lock:
            self.routed[key] = (queue, sent)
        queue.listen(lambda: self.mark(key))

    def mark(self, key) -> None:
        """A routed queue changed (called under that queue's lock: only sets and wakes)."""
        with self.lock:
            self.dirty[key] = None
        self.wake.set()

    def take_dirty(self) -> list:
        """[(key, queue, sent)] of the routed requests with news since the last call."""
        with self.lock:
            keys, self.dirty = list(self.dirty), {}
            return [(k, *self.routed[k]) for k in keys if k in self.routed]
