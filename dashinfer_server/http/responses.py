"""OpenAI's response bodies: whole answers, stream chunks and their logprobs, for chat
(chat.completion) and text (text_completion) requests, with one choice or several (n, a batch of
prompts), each under its index."""
import json
import time
import uuid


class Answer:
    """The bodies of one request's answer, sharing its id and creation time (job: any of its
    choices' Jobs, which agree on all it reads)."""

    def __init__(self, job, token_text):
        self.job, self.token_text = job, token_text
        chat = job.kind == "chat"
        self.id = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        self.created = int(time.time())
        self.object = "chat.completion" if chat else "text_completion"
        self.offsets = {}  # choice index -> characters of text so far (text completions' text_offset)

    def _head(self, obj) -> dict:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.job.model}

    def whole(self, answers, usage) -> dict:
        """answers: (Job, its pieces) of each choice, in index order."""
        return dict(self._head(self.object), choices=[self._choice(job, pieces) for job, pieces in answers],
                    usage=usage.to_dict())

    def _choice(self, job, pieces) -> dict:
        text = job.echo + "".join(p.text for p in pieces)
        tokens = [t for p in pieces for t in p.tokens]
        choice = {"index": job.index, "logprobs": self.logprobs(tokens, job.index),
                  "finish_reason": pieces[-1].finish_reason}
        if self.job.kind == "chat":
            choice["message"] = {"role": "assistant", "content": text}
        else:
            choice["text"] = text
        return choice

    def chunk(self, piece=None, first=False, usage=None, index=0) -> str:
        """One SSE event: a piece of the answer (the first announces the role), or the usage."""
        body = self._head(self.object + ".chunk" if self.job.kind == "chat" else self.object)
        if usage is not None:
            body.update(choices=[], usage=usage.to_dict())
            return sse(body)
        choice = {"index": index, "logprobs": self.logprobs(piece.tokens, index) if piece.tokens else None,
                  "finish_reason": piece.finish_reason}
        if self.job.kind == "chat":
            choice["delta"] = {"role": "assistant", "content": piece.text} if first else \
                ({"content": piece.text} if piece.text or not piece.finish_reason else {})
        else:
            choice["text"] = piece.text
        body["choices"] = [choice]
        if self.job.include_usage:
            body["usage"] = None
        return sse(body)

    def logprobs(self, tokens, index=0):
        if self.job.logprobs is None:
            return None
        if self.job.kind == "chat":
            return {"content": [dict(self._entry(i, lp), top_logprobs=[self._entry(j, q) for j, q in top])
                                for i, lp, top in tokens]}
        texts = [self.token_text(i) for i, _, _ in tokens]
        offsets = []
        for t in texts:
            offsets.append(self.offsets.get(index, 0))
            self.offsets[index] = offsets[-1] + len(t)
        return {"tokens": texts, "token_logprobs": [lp for _, lp, _ in tokens],
                "top_logprobs": [{self.token_text(j): q for j, q in top} for _, _, top in tokens],
                "text_offset": offsets}

    def _entry(self, token_id, logprob) -> dict:
        text = self.token_text(token_id)
        return {"token": text, "logprob": logprob, "bytes": list(text.encode())}


def sse(body) -> str:
    return f"data: {json.dumps(body, ensure_ascii=False)}\n\n"


DONE = "data: [DONE]\n\n"
