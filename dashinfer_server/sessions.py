"""What the gRPC service keeps per request it started and per client session (service.py)."""
import threading

from dashinfer_client import settings
from dashinfer_client.proto import wire
from dashinfer_client.types import FINAL_STATUSES


# A session's stream sends at most one event per this many seconds (DASHINFER_STREAM_INTERVAL_MS),
# first tokens and ends at once: each event costs rank 0 a few thread wake-ups and the GIL, on the
# cores its kernels run on, and with several ranks every rank waits while rank 0 is held. With 0 the
# writer already sends every token ready when it wakes (about one event a step); fewer events means
# holding tokens back. 20 ms against 0 on 2 ranks x 1 core: serve32 +3.5%, decode1 +4.5% tok/s.
DEFAULT_STREAM_INTERVAL_MS = settings.REGISTRY["DASHINFER_STREAM_INTERVAL_MS"].default


def stream_interval_s() -> float:
    return settings.get("DASHINFER_STREAM_INTERVAL_MS") / 1000.0


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
    __slots__ = ("wake", "hurry", "left", "requests", "routed", "dirty", "fresh", "lock")

    def __init__(self):
        self.wake = threading.Event()
        self.hurry = threading.Event()  # cuts the pace's wait short: urgent news, or the stream ends
        self.left = False
        self.requests = set()  # (model_name, handle)
        self.routed = {}  # key -> (queue, stats sent): requests whose events go on this stream
        self.dirty = {}  # keys of routed requests with news, in order (a dict as ordered set)
        self.fresh = set()  # routed requests whose first token has not gone out yet
        self.lock = threading.Lock()

    def route(self, key, queue, sent) -> None:
        """Carry the events of request `key` from now on; `sent`: the statistics already sent."""
        with self.lock:
            self.routed[key] = (queue, sent)
            self.fresh.add(key)
        queue.listen(lambda: self.mark(key, queue))

    def mark(self, key, queue) -> None:
        """A routed queue changed (called under that queue's lock: only sets and wakes)."""
        with self.lock:
            self.dirty[key] = None
            urgent = key in self.fresh
        if urgent or queue.ended_in_listener():
            self.hurry.set()
        self.wake.set()

    def interrupt(self) -> None:
        """Wake the stream's writer now, wherever it waits (the service drains or closes, or the
        client left)."""
        self.hurry.set()
        self.wake.set()

    def urgent(self) -> bool:
        """News that must not wait for the stream's pace: a first token, or a request's end."""
        with self.lock:
            if not self.fresh.isdisjoint(self.dirty):
                return True
            queues = [self.routed[k][0] for k in self.dirty if k in self.routed]
        return any(q.finished for q in queues)  # the queues' locks outside ours: mark takes them in that order

    def delivered(self, key) -> None:
        """An event with request `key`'s first token (or its end) went out."""
        with self.lock:
            self.fresh.discard(key)

    def take_dirty(self) -> list:
        """[(key, queue, sent)] of the routed requests with news since the last call."""
        with self.lock:
            keys, self.dirty = list(self.dirty), {}
            return [(k, *self.routed[k]) for k in keys if k in self.routed]

    def events(self) -> tuple:
        """(one RequestEvent per routed request with news, the keys of those whose last event this
        is: they leave the routing; their handles stay held until released)."""
        events, ended = [], []
        for key, queue, sent in self.take_dirty():
            status = queue.GenerateStatus()  # before taking: every token pushed before a final one
            event = wire.encode_event(queue, status, queue.GetNoWait(), sent)
            event.handle = key[1]
            events.append(event)
            final = status in FINAL_STATUSES
            if event.ids or final:
                self.delivered(key)
            if final:
                with self.lock:
                    self.routed.pop(key, None)
                ended.append(key)
        return events, ended
