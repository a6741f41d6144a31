"""The HTTP server's admission gate: how many requests it holds at once, and how long each may take.

Every generating request passes through `Admission.admit` before it reaches the engine (and,
when the server is full, is refused by `refuse_early` before the framework parses it). The
server holds at most max_batch + max_waiting requests (those the engine runs and those queued for
a place in its batch); one more is refused at once with 429 and `Retry-After`, in OpenAI's error
shape, instead of waiting minutes behind the others. A request also gets a deadline, `timeout` in
its body (seconds) or the server's default: when it passes, the request is stopped, its engine
request released, and its answer ends with finish_reason "timeout" (what it generated so far is
kept). Any front door (chat, completions, the Messages API) wraps its output the same way.
"""
import asyncio
import json
import math

from dashinfer_client import settings
from dashinfer_client.frontend import Delta

from .errors import ApiError, bad_request

MAX_WAITING = settings.REGISTRY["DASHINFER_MAX_WAITING"].default  # requests queued beyond the batch before new ones get 429
RETRY_AFTER_S = 1     # what a refused client is told to wait
TIMEOUT_REASON = "timeout"


class Admission:
    def __init__(self, max_batch: int, max_waiting: int = MAX_WAITING, default_timeout: float = 0.0):
        """max_batch: the engine's batch; max_waiting: requests held beyond it; default_timeout:
        seconds a request may take when its body names none (0: no deadline)."""
        if max_waiting < 0 or default_timeout < 0:
            raise ValueError("max_waiting and the default timeout must be >= 0")
        self.limit = max_batch + max_waiting
        self.max_batch = max_batch
        self.default_timeout = default_timeout
        self.held = 0          # requests admitted and not yet ended
        self.refused = 0       # requests answered 429 so far
        self.timed_out = 0     # requests ended by their deadline so far

    @property
    def waiting(self) -> int:
        """Held requests beyond the engine's batch: the queue in front of it."""
        return max(0, self.held - self.max_batch)

    def admit(self, body: dict, pieces):
        """pieces (a request's output, an async iterator of Delta) counted among the held requests
        and cut at the request's deadline; ApiError 429 when the server holds all it may, 400 when
        `timeout` is not a positive number. Its place is held until the output ends or is closed."""
        timeout = self._timeout(body)
        self.check()
        self.held += 1
        return _Held(self, pieces, asyncio.get_running_loop().time() + timeout if timeout else None)

    def check(self) -> None:
        """ApiError 429 (with Retry-After) when the server holds all the requests it may."""
        if self.held >= self.limit:
            self.refused += 1
            raise ApiError(429, f"the server is at capacity: {self.held} requests running or queued "
                           f"(--max-waiting {self.limit - self.max_batch}); retry after {RETRY_AFTER_S} s",
                           "rate_limit_error", code="rate_limit_exceeded",
                           headers={"Retry-After": str(RETRY_AFTER_S)})

    def refuse_early(self, app, paths, error_body=lambda path, e: e.body(), authorized=lambda headers: True):
        """ASGI middleware over `app`: a POST to one of `paths` that finds the server full is answered
        429 before the framework parses anything of it, so a burst of refusals costs the event loop
        (which also answers /health) as little as it can. error_body(path, ApiError): the route's
        API's shape of the error; authorized(headers {lowercase name: value}): whether the request
        passes the API key check, which comes first (a wrong key gets 401 from the route, full or not)."""
        async def gate(scope, receive, send):
            if scope["type"] == "http" and scope["method"] == "POST" and scope["path"] in paths and \
                    authorized({k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}):
                try:
                    self.check()
                except ApiError as e:
                    body = json.dumps(error_body(scope["path"], e)).encode()
                    await send({"type": "http.response.start", "status": e.http_status, "headers": [
                        (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                        *((k.lower().encode(), v.encode()) for k, v in e.headers.items())]})
                    await send({"type": "http.response.body", "body": body})
                    return
            await app(scope, receive, send)
        return gate

    def _timeout(self, body: dict) -> float:
        value = body.get("timeout")
        if value is None:
            return self.default_timeout
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not (value > 0 and math.isfinite(value)):
            raise bad_request("'timeout' must be a positive number of seconds", "timeout")
        return float(value)

    def release(self) -> None:
        self.held -= 1


class _Held:
    """An admitted request's output: its pieces until its deadline. Its place is given back when it
    ends, when it is closed, or when it is dropped unstarted (a client gone before it began)."""

    def __init__(self, gate, pieces, deadline):
        self.gate, self.pieces, self.deadline, self.ended = gate, pieces, deadline, False

    def __aiter__(self):
        return self

    async def __anext__(self):
        if self.ended:
            raise StopAsyncIteration
        try:
            if self.deadline is None:
                return await anext(self.pieces)
            # on expiry the wait is cancelled, which closes `pieces`: the request is stopped and released
            wait = max(0.0, self.deadline - asyncio.get_running_loop().time())
            return await asyncio.wait_for(anext(self.pieces), wait)
        except asyncio.TimeoutError:
            self.gate.timed_out += 1
            await self.aclose()
            return Delta(finish_reason=TIMEOUT_REASON)
        except BaseException:  # the end, an error, or a cancelled consumer
            await self.aclose()
            raise

    async def aclose(self) -> None:
        if not self.ended:
            self.ended = True
            self.gate.release()
            await self.pieces.aclose()

    def __del__(self):
        if not self.ended:  # never started nor closed: nothing of it reached the engine
            self.ended = True
            self.gate.release()
