"""One request's output as the engine produces it, for an async handler: text pieces that never
split a character and never show a stop string, the logprobs of their tokens, the finish reason.

The engine's ResultQueue wakes the event loop through its listener (no thread per request); the
request is stopped and released whenever the consumer goes away (a client that disconnects).
"""
import asyncio
import time
from dataclasses import dataclass, field

from dashinfer_client.types import GenerateRequestStatus

from .errors import unavailable

# The engine's reasons (RequestStatInfo "finish_reason") -> OpenAI's.
_FINISH = {"eos": "stop", "stop_words": "stop", "length": "length", "stopped": "stop"}


@dataclass
class Piece:
    text: str
    tokens: list = field(default_factory=list)  # (id, logprob, [(id, logprob), ...]) when asked
    finish_reason: str = None


@dataclass
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0

    def to_dict(self) -> dict:
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
                "total_tokens": self.prompt_tokens + self.completion_tokens}


class StopText:
    """Cuts the text at the first stop string; holds back an ending that may begin one."""

    def __init__(self, stops):
        self.stops, self.held, self.hit = stops, "", False

    def push(self, piece: str) -> str:
        text = self.held + piece
        cut = min((i for i in (text.find(s) for s in self.stops) if i >= 0), default=-1)
        if cut >= 0:
            self.held, self.hit = "", True
            return text[:cut]
        keep = max((n for s in self.stops for n in range(1, len(s)) if text.endswith(s[:n])), default=0)
        self.held = text[len(text) - keep:] if keep else ""
        return text[:len(text) - keep]

    def flush(self) -> str:
        held, self.held = self.held, ""
        return held


async def generate(served, job, metrics, usage: Usage, decoder, request_id=""):
    """Async iterator of Piece; the last one carries the finish reason. Raises ApiError when the
    engine refuses the request or the rank group is lost under it."""
    loop = asyncio.get_running_loop()
    started = time.monotonic()
    handle, queue = await asyncio.to_thread(served.start, job)
    wake = asyncio.Event()

    def listener():  # called by the producer thread with the queue's lock held: only wake the loop
        try:
            loop.call_soon_threadsafe(wake.set)
        except RuntimeError:  # the loop has closed
            pass
    queue.listen(listener)
    stop = StopText(job.stop)
    usage.prompt_tokens = len(job.prompt_ids)
    last = None
    try:
        while not stop.hit:
            await wake.wait()
            wake.clear()
            ended = queue.finished  # read before taking, so nothing pushed after it is missed
            elements = queue.GetNoWait()
            if elements is not None and elements.ids_from_generate:
                ids = elements.ids_from_generate
                now = time.monotonic()
                metrics.tokens(len(ids), now - (last or started), first=last is None)
                last = now
                usage.completion_tokens += len(ids)
                text = stop.push(decoder.push(ids))
                tokens = _with_logprobs(elements) if job.logprobs is not None else []
                if text or tokens:
                    yield Piece(text, tokens)
            if ended:  # a final queue takes no more pushes: everything was in that GetNoWait
                break
        if not stop.hit and queue.GenerateStatus() != GenerateRequestStatus.GenerateFinished:
            raise unavailable(f"the request was interrupted: {queue.error or 'the engine stopped it'}")
        reason = "stop" if stop.hit else _FINISH[queue.RequestStatInfo()["finish_reason"]]
        yield Piece("" if stop.hit else stop.push(decoder.finish()) + stop.flush(), finish_reason=reason)
        metrics.finished(usage, time.monotonic() - started, reason)
    finally:
        # Not awaited: the consumer may be a cancelled task (the client went away).
        loop.run_in_executor(None, served.finish, handle, queue, request_id)


def _with_logprobs(elements) -> list:
    return [(i, lp, top) for i, lp, top in zip(elements.ids_from_generate, elements.token_logprobs_list,
                                                elements.log_probs_list)]
