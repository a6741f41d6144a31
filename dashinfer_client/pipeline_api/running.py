"""RunningRequests: a pipeline's engine and the requests running on it, so that close() may come
from any thread at any time: every request is stopped and released exactly once, by the call that
started it or by close(), and nothing reaches the engine once close() has released it.

A request that close() stops ends as any stopped request does (finish_reason 'abort'); its call
returns or its stream goes on to that end; a call made after close() raises RuntimeError.
"""
import threading

CLOSED = "this pipeline is closed"


class RunningRequests:
    def __init__(self, engine, model_name):
        self._engine = engine
        self._model_name = model_name
        self._changed = threading.Condition()
        self._running = set()  # handles started and not yet ended by their call or by close()
        self._ending = 0  # calls of end() still talking to the engine: close() waits for them

    @property
    def engine(self):
        return self._engine

    @property
    def closed(self) -> bool:
        return self._engine is None

    def submit(self, ids, builder):
        """engine.submit -> (handle, queue); RuntimeError once closed, Refused as the engine's."""
        with self._changed:
            if self._engine is None:
                raise RuntimeError(CLOSED)
            handle, queue = self._engine.submit(self._model_name, ids, builder)
            self._running.add(handle)
        return handle, queue

    def wait(self, handle) -> None:
        """Until the request has ended (at once when close() took it: close() stops it)."""
        with self._changed:
            engine = self._engine if handle in self._running else None
            if engine is not None:
                self._ending += 1
        if engine is not None:
            try:
                engine.sync_request(self._model_name, handle)
            finally:
                self._done_with_engine()

    def end(self, handles) -> None:
        """Stop and release the requests of `handles` that close() has not taken."""
        with self._changed:
            engine = self._engine
            mine = [h for h in handles if h in self._running]
            self._running.difference_update(mine)
            if engine is None or not mine:
                return
            self._ending += 1
        try:
            for handle in mine:
                engine.stop_request(self._model_name, handle)
                engine.release_request(self._model_name, handle)
        finally:
            self._done_with_engine()

    def close(self):
        """Stop every running request -> the engine, for the caller to release once no call uses
        it any more (None when already closed)."""
        with self._changed:
            engine, self._engine = self._engine, None
            handles, self._running = self._running, set()
        if engine is None:
            return None
        for handle in handles:  # their calls read them to the end; release_model drops them
            engine.stop_request(self._model_name, handle)
        with self._changed:
            self._changed.wait_for(lambda: self._ending == 0)
        return engine

    def _done_with_engine(self):
        with self._changed:
            self._ending -= 1
            self._changed.notify_all()
