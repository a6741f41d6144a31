"""OpenAI's response bodies: whole answers, stream chunks and their logprobs, for chat
(chat.completion) and text (text_completion) requests, with one choice or several (n, a batch of
prompts), each under its index."""
import codecs
import json
import time
import uuid

from dashinfer_client.frontend import Delta
from dashinfer_client.token_bytes import token_name

# a token the grammar or a ban forbids has logprob -inf, which JSON cannot hold: vLLM's floor
LOGPROB_FLOOR = -9999.0


class Answer:
    """The bodies of one request's answer, sharing its id and creation time (job: any of its
    choices' Jobs, which agree on all it reads)."""

    def __init__(self, job, served):
        self.job = job
        self.token_bytes = served.token_bytes
        chat = job.kind == "chat"
        self.id = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        self.created = int(time.time())
        self.object = "chat.completion" if chat else "text_completion"
        self.offsets = {}  # choice index -> its _TextOffsets (text completions' text_offset)

    def _head(self, obj) -> dict:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.job.model}

    def whole(self, answers, usage) -> dict:
        """answers: (Job, its Deltas) of each choice, in index order (Choices.whole)."""
        body = dict(self._head(self.object), choices=[self._choice(job, deltas) for job, deltas in answers],
                    usage=usage.to_dict())
        if self.job.kind == "chat" and self.job.prompt_logprobs is not None:  # vLLM's: once, for the prompt
            body["prompt_logprobs"] = self.prompt_logprobs(*answers[0])
        return body

    def _choice(self, job, deltas) -> dict:
        text = job.echo + "".join(d.text for d in deltas)
        tokens = self.echo_tokens(job, deltas) + [t for d in deltas for t in d.logprobs]
        choice = {"index": job.index, "logprobs": self.logprobs(tokens, job.index),
                  "finish_reason": deltas[-1].finish_reason}
        if self.job.kind == "text" and job.prompt_logprobs is not None:  # vLLM's: each choice's
            choice["prompt_logprobs"] = self.prompt_logprobs(job, deltas)
        if self.job.kind == "chat":
            calls = [c for d in deltas for c in d.tool_calls]
            reasoning = "".join(d.reasoning for d in deltas)
            message = {"role": "assistant", "content": text if text or not calls else None}
            if reasoning:  # vLLM's name since 0.11 (OpenAI's guidance for gpt-oss) and its earlier one
                message["reasoning"] = message["reasoning_content"] = reasoning
            if calls:
                message["tool_calls"] = [c.openai() for c in calls]
            choice["message"] = message
        else:
            choice["text"] = text
        return choice

    def chunk(self, delta=None, first=False, usage=None, index=0) -> str:
        """One SSE event: a Delta of choice `index` (the first announces the role), or the usage."""
        body = self._head(self.object + ".chunk" if self.job.kind == "chat" else self.object)
        if usage is not None:
            body.update(choices=[], usage=usage.to_dict())
            return sse(body)
        delta = delta or Delta()
        choice = {"index": index, "logprobs": self.logprobs(delta.logprobs, index) if delta.logprobs else None,
                  "finish_reason": delta.finish_reason}
        if self.job.kind == "chat":
            choice["delta"] = {"role": "assistant", "content": ""} if first else self._chat_delta(delta, index)
        else:
            choice["text"] = delta.text
        body["choices"] = [choice]
        if self.job.include_usage:
            body["usage"] = None
        return sse(body)

    def events(self, choices, firsts):
        """The SSE stream of the choices (Choices.events: their deltas as they come, by index)."""
        return choices.events(self, firsts)

    def _chat_delta(self, delta, index) -> dict:
        out = {}
        if delta.text or not (delta.finish_reason or delta.reasoning or delta.tool_calls or delta.tool_call_parts):
            out["content"] = delta.text
        if delta.reasoning:
            out["reasoning"] = out["reasoning_content"] = delta.reasoning
        if delta.tool_call_parts:  # a call's id and name first, then pieces of its arguments
            out["tool_calls"] = [_call_chunk(p) for p in delta.tool_call_parts]
        return out

    def logprobs(self, tokens, index=0):
        """tokens: (id, logprob, top pairs) each; a text completion's echoed first token has None
        for both (it has no context), as OpenAI answers."""
        if self.job.logprobs is None:
            return None
        if self.job.kind == "chat":
            return {"content": [dict(self._entry(i, lp), top_logprobs=[self._entry(j, q) for j, q in top])
                                for i, lp, top in tokens]}
        offsets = self.offsets.setdefault(index, _TextOffsets(self.token_bytes))
        return {"tokens": [self._name(i) for i, _, _ in tokens],
                "token_logprobs": [None if lp is None else _floored(lp) for _, lp, _ in tokens],
                "top_logprobs": [None if top is None else {self._name(j): _floored(q) for j, q in top}
                                 for _, _, top in tokens],
                "text_offset": offsets.starts([i for i, _, _ in tokens])}

    @staticmethod
    def echo_tokens(job, deltas) -> list:
        """The echoed prompt's tokens as logprobs() takes them (echo with logprobs), else none."""
        if not job.echo_logprobs:
            return []
        scored = [e for d in deltas for e in d.prompt_logprobs]
        return [(job.prompt_ids[0], None, None)] + [(i, lp, top[:job.logprobs])
                                                   for i, (lp, top, _) in zip(job.prompt_ids[1:], scored)]

    def prompt_logprobs(self, job, deltas) -> list:
        """vLLM's prompt_logprobs: None for the first prompt token, then per token {id: {logprob,
        rank, decoded_token}}: the token's own, then the job.prompt_logprobs most likely."""
        out = [None]
        for token, (lp, top, rank) in zip(job.prompt_ids[1:], (e for d in deltas for e in d.prompt_logprobs)):
            entry = {str(token): self._ranked(token, lp, rank)}
            for j, (i, q) in enumerate(top[:job.prompt_logprobs]):
                entry.setdefault(str(i), self._ranked(i, q, j + 1))
            out.append(entry)
        return out

    def _ranked(self, token_id, logprob, rank) -> dict:
        return {"logprob": _floored(logprob), "rank": rank, "decoded_token": self._name(token_id)}

    def _name(self, token_id) -> str:
        return token_name(self.token_bytes(token_id))

    def _entry(self, token_id, logprob) -> dict:
        data = self.token_bytes(token_id)  # the token's own bytes: those of a partial character join up
        return {"token": token_name(data), "logprob": _floored(logprob), "bytes": list(data)}


def _floored(logprob) -> float:
    return max(logprob, LOGPROB_FLOOR)


class _TextOffsets:
    """Where each token of one choice's text starts in it, in characters (OpenAI's text_offset),
    counted from the tokens' own bytes: a token that continues a character starts where that
    character does. Special tokens, which the text leaves out, take no room."""

    def __init__(self, token_bytes):
        self.token_bytes = token_bytes
        self.utf8 = codecs.getincrementaldecoder("utf-8")("replace")  # holds a character's first bytes
        self.chars = 0

    def starts(self, ids) -> list:
        out = []
        for i in ids:
            out.append(self.chars)
            if i not in self.token_bytes.special:
                self.chars += len(self.utf8.decode(self.token_bytes(i)))
        return out


def _call_chunk(part) -> dict:
    """A ToolCallPart as an entry of a chunk's delta.tool_calls."""
    if part.name is None:
        return {"index": part.index, "function": {"arguments": part.arguments}}
    return {"index": part.index, "id": part.id, "type": "function",
            "function": {"name": part.name, "arguments": part.arguments}}


def sse(body) -> str:
    return f"data: {json.dumps(body, ensure_ascii=False)}\n\n"


DONE = "data: [DONE]\n\n"
