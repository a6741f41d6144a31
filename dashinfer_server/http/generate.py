"""One request's output as the engine produces it, for an async handler: the front end's Deltas
(dashinfer_client/frontend/outputs.py: text on whole characters, stop strings cut, reasoning and
tool calls told apart), the logprobs of their tokens, the finish reason.

The engine's ResultQueue wakes the event loop through its listener (no thread per request); the
request is stopped and released whenever the consumer goes away (a client that disconnects).
"""
import asyncio
import time
from dataclasses import dataclass

from dashinfer_client.frontend import Delta, OutputProcessor
from dashinfer_client.types import GenerateRequestStatus

from .errors import unavailable

# The front end's finish reasons OpenAI has no word for: a request stopped under a client that
# went away answers nobody.
_OPENAI_FINISH = {"abort": "stop"}


@dataclass
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0  # of the prompt, taken from the prefix cache
    reasoning_tokens: int = 0  # of the completion, its reasoning (OutputProcessor.reasoning_tokens)

    def to_dict(self) -> dict:
        """OpenAI's usage, with its details as OpenAI always writes them."""
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
                "total_tokens": self.prompt_tokens + self.completion_tokens,
                "prompt_tokens_details": {"cached_tokens": self.cached_tokens},
                "completion_tokens_details": {"reasoning_tokens": self.reasoning_tokens}}


def output_processor(served, job) -> OutputProcessor:
    """The output side of `job` on `served`'s model: its stop strings, logprobs and parsers."""
    chat = job.kind == "chat"
    return OutputProcessor(served.tokenizer, stop=job.stop, logprobs=job.logprobs is not None,
                           reasoning=served.prompts.reasoning_parser(job.prompt_text) if chat else None,
                           tools=served.prompts.tool_parser(job.tools.functions) if chat else None)


async def generate(served, job, metrics, usage: Usage, request_id=""):
    """Async iterator of Delta; the last one carries the finish reason. Raises ApiError when the
    engine refuses the request or the rank group is lost under it."""
    loop = asyncio.get_running_loop()
    started = time.monotonic()
    output = output_processor(served, job)
    handle, queue = await _started(loop, served, job, request_id)
    wake = asyncio.Event()

    def listener():  # called by the producer thread with the queue's lock held: only wake the loop
        try:
            loop.call_soon_threadsafe(wake.set)
        except RuntimeError:  # the loop has closed
            pass
    queue.listen(listener)
    last = None
    scored = False  # max_tokens 0: the prompt's logprobs came
    try:
        while not output.stopped:
            await wake.wait()
            wake.clear()
            ended = queue.finished  # read before taking, so nothing pushed after it is missed
            elements = queue.GetNoWait()
            if elements is not None and elements.ids_from_generate and last is None:
                # what the prefix cache gave is known from the first tokens on (Anthropic's message_start)
                usage.cached_tokens = queue.RequestStatInfo()["context_cached_length"]
            if elements is not None and elements.ids_from_generate and job.max_tokens == 0:
                # an echoed prompt scored alone: its logprobs, not the one token the engine generated
                yield Delta(prompt_logprobs=output.push(elements).prompt_logprobs)
                scored = True
                break
            if elements is not None and elements.ids_from_generate:
                ids = elements.ids_from_generate
                now = time.monotonic()
                metrics.tokens(len(ids), now - (last or started), first=last is None)
                last = now
                usage.completion_tokens += len(ids)
                delta = output.push(elements)
                usage.reasoning_tokens = output.reasoning_tokens
                if (delta.text or delta.reasoning or delta.tool_calls or delta.tool_call_parts or delta.logprobs
                        or delta.prompt_logprobs):
                    yield delta
            if ended:  # a final queue takes no more pushes: everything was in that GetNoWait
                break
        if scored:
            delta = Delta(finish_reason="length")
        else:
            if not output.stopped and queue.GenerateStatus() != GenerateRequestStatus.GenerateFinished:
                raise unavailable(f"the request was interrupted: {queue.error or 'the engine stopped it'}")
            delta = output.finish(queue.RequestStatInfo()["finish_reason"])
            usage.reasoning_tokens = output.reasoning_tokens
            delta.finish_reason = _OPENAI_FINISH.get(delta.finish_reason, delta.finish_reason)
        yield delta
        metrics.finished(usage, time.monotonic() - started, delta.finish_reason)
    finally:
        # Not awaited: the consumer may be a cancelled task (the client went away).
        loop.run_in_executor(None, served.finish, handle, queue, request_id)


async def _started(loop, served, job, request_id):
    """served.start(job) in a thread. When the waiting task is cancelled (the client left, the
    deadline passed), the start still completes in its thread: what it started is then finished
    (stopped and released) as soon as it is there, never left running unowned."""
    start = loop.run_in_executor(None, served.start, job)
    try:
        return await asyncio.shield(start)
    except asyncio.CancelledError:
        def finish(f):
            if not f.cancelled() and f.exception() is None:
                loop.run_in_executor(None, served.finish, *f.result(), request_id)
        start.add_done_callback(finish)
        raise
