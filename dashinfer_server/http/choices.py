"""The choices of one OpenAI request (n > 1, a batch of prompts, or just one): each runs as its
own engine request, started together (the engine's prefix cache lets the choices of one prompt
share its KV blocks), and their pieces are gathered into one answer: whole, or one SSE stream
whose chunks carry each choice's index as its Deltas come. The Messages API (anthropic.py) runs
its one choice through here too, so that every generating request passes the admission gate."""
import asyncio
import json

from dashinfer_client.frontend import Delta

from .errors import ApiError
from .generate import Usage, generate
from .responses import DONE


class Choices:
    """jobs: the Jobs of protocol.*_choices (or anthropic.parse_messages), in index order; answer_id
    names them in the log; admit wraps each choice's output (the admission gate: its place among the held requests, its deadline)."""

    def __init__(self, served, jobs, metrics, answer_id, admit=lambda pieces: pieces):
        self.jobs = jobs
        # the prompt counts from the start: a deadline may cut a choice before its generator runs at all
        self.usages = [Usage(len(job.prompt_ids)) for job in jobs]
        self.streams = [admit(generate(served, job, metrics, usage,
                                       answer_id if len(jobs) == 1 else f"{answer_id}/{job.index}"))
                        for job, usage in zip(jobs, self.usages)]

    def usage(self) -> Usage:
        """OpenAI's: each prompt counted once, however many choices it had; every choice's completion."""
        prompts = {job.prompt_index: u for job, u in zip(self.jobs, self.usages)}
        return Usage(sum(u.prompt_tokens for u in prompts.values()), sum(u.completion_tokens for u in self.usages),
                     sum(u.cached_tokens for u in prompts.values()), sum(u.reasoning_tokens for u in self.usages))

    async def whole(self) -> list:
        """(Job, its Deltas) of every choice; ApiError when the engine refuses one or one is
        interrupted (the others are stopped and released)."""
        firsts = await self.first_pieces()
        rests = await _all(_collect(s) for s in self.streams)
        return [(job, ([first] if first is not None else []) + rest)
                for job, first, rest in zip(self.jobs, firsts, rests)]

    async def first_pieces(self) -> list:
        """The first Delta of every choice (None: an empty answer), so that a refusal is still an
        HTTP error rather than a stream. Each start runs to its end (a start cancelled in its
        thread would leave a request nobody releases); then, if one was refused, all are closed."""
        firsts = await asyncio.gather(*(_first(s) for s in self.streams), return_exceptions=True)
        errors = [e for e in firsts if isinstance(e, BaseException)]
        if errors:
            await self.close()
            raise errors[0]
        return firsts

    async def events(self, answer, firsts):
        """OpenAI's SSE stream: each choice's role (chat) or echo (text), then the pieces of all choices
        as they come, the usage if asked, [DONE]."""
        queue = asyncio.Queue()
        pumps = []
        try:
            for job, first in zip(self.jobs, firsts):
                if answer.job.kind == "chat":
                    yield answer.chunk(first=True, index=job.index)
                if job.echo:  # with logprobs, the echoed prompt's (from the first piece)
                    scored = answer.echo_tokens(job, [first] if first is not None else [])
                    yield answer.chunk(Delta(text=job.echo, logprobs=scored), index=job.index)
                if first:  # not a scored prompt's piece alone (max_tokens 0)
                    yield answer.chunk(first, index=job.index)
            pumps = [asyncio.ensure_future(_pump(s, job.index, queue)) for job, s in zip(self.jobs, self.streams)]
            running = len(pumps)
            while running:
                index, item = await queue.get()
                if item is None:
                    running -= 1
                elif isinstance(item, ApiError):
                    raise item
                else:
                    yield answer.chunk(item, index=index)
            if answer.job.include_usage:
                yield answer.chunk(usage=self.usage())
        except ApiError as e:  # a request was interrupted mid-stream (a rank failed)
            yield f"data: {json.dumps(e.body())}\n\n"
        finally:
            for pump in pumps:
                pump.cancel()
            await asyncio.gather(*pumps, return_exceptions=True)
            await self.close()
        yield DONE

    async def close(self) -> None:
        """Stop and release every choice's request still running."""
        for stream in self.streams:
            await stream.aclose()


async def _all(coroutines) -> list:
    """Their results, run together; when one raises, the others are cancelled (past their start,
    that stops and releases their requests) before the error goes on."""
    tasks = [asyncio.ensure_future(c) for c in coroutines]
    try:
        return await asyncio.gather(*tasks)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def _pump(stream, index, queue) -> None:
    """The rest of one choice's pieces into the shared queue as (index, piece), an ApiError if it
    was interrupted, then (index, None)."""
    try:
        async for piece in stream:
            queue.put_nowait((index, piece))
    except ApiError as e:
        queue.put_nowait((index, e))
    finally:
        queue.put_nowait((index, None))


async def _collect(pieces) -> list:
    return [p async for p in pieces]


async def _first(pieces):
    """The first piece, or None when the answer is empty; ApiError when the engine refused."""
    try:
        return await pieces.__anext__()
    except StopAsyncIteration:
        return None
