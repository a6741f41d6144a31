"""What the output-side tests share: token ids as the engine's GeneratedElements, an answer cut
by max_tokens after some of its tokens, its calls as streamed and as whole, a tool parser fed piece by
piece, and what a model that writes any token a grammar allows answers."""
import random

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


def run_parser(parser, chunks):
    """(content, calls, streamed parts) of a tool parser fed `chunks` one by one, then finished."""
    content, calls, parts = [], [], []
    for chunk in chunks:
        text, got = parser.feed(chunk)
        content.append(text)
        calls += got
        parts += parser.take_parts()
    text, got = parser.finish()
    return "".join(content) + text, calls + got, parts + parser.take_parts()


def random_answer(tokenizer, grammar, seed):
    """What a model that picks any token the grammar allows writes (llguidance's mask)."""
    import llguidance
    import numpy as np
    from llguidance.numpy import allocate_token_bitmask, fill_next_token_bitmask
    ll = llguidance.LLTokenizer(tokenizer.backend_tokenizer.to_str())
    matcher = llguidance.LLMatcher(ll, llguidance.LLMatcher.grammar_from_lark(grammar), log_level=0)
    assert not matcher.is_error(), matcher.get_error()
    rng, ids, bits = random.Random(seed), [], allocate_token_bitmask(1, ll.vocab_size)
    while not matcher.is_stopped() and not (matcher.is_accepting() and rng.random() < 0.6) and len(ids) < 3000:
        fill_next_token_bitmask(matcher, bits, 0)
        allowed = np.flatnonzero(np.unpackbits(bits[0].view(np.uint8), bitorder="little")[:ll.vocab_size])
        allowed = [int(i) for i in allowed if i != ll.eos_token]
        if not allowed:
            break
        ids.append(rng.choice(allowed))
        assert matcher.consume_token(ids[-1])
    assert matcher.is_accepting()
    return tokenizer.decode(ids)
