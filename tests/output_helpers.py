"""What the output-side tests share: token ids as the engine's GeneratedElements, and an answer cut
by max_tokens after some of its tokens, its calls as streamed and as whole."""
from dashinfer_client.frontend import OutputProcessor
from dashinfer_client.types import GeneratedElements


def elements(ids):
    """ids as one GeneratedElements of the engine (no logprobs asked)."""
    return GeneratedElements(ids_from_generate=ids, token_logprobs_list=[0.0] * len(ids),
                             log_probs_list=[[]] * len(ids))


def cut_answer(tokenizer, tool_parser, ids, cut):
    """(deltas, calls as their streamed pieces join them, calls whole) of the answer `ids` cut after
    `cut` tokens; each call as [id, name, arguments]."""
    out = OutputProcessor(tokenizer, tools=tool_parser)
    deltas = [out.push(elements([i])) for i in ids[:cut]] + [out.finish("length")]
    streamed = {}
    for part in (p for d in deltas for p in d.tool_call_parts):
        call = streamed.setdefault(part.index, [part.id, part.name, ""])
        call[2] += part.arguments
    whole = [[c.id, c.name, c.arguments] for d in deltas for c in d.tool_calls]
    return deltas, [streamed[i] for i in sorted(streamed)], whole
