"""What the output-side tests share: token ids as the engine's GeneratedElements, an answer cut
by max_tokens after some of its tokens, its calls as streamed and as whole, a tool parser fed piece by
piece (and split everywhere), what a model that writes any token a grammar allows answers, and
whether a grammar accepts a text."""
import json
import random

from dashinfer_client.frontend import OutputProcessor
from dashinfer_client.types import GeneratedElements

# The functions the XML-style formats' tests offer (qwen3_coder, glm45, minimax_m2): a value of every JSON type
WRITE = {"name": "write_file", "description": "Write a file", "parameters": {
    "type": "object", "properties": {"path": {"type": "string", "maxLength": 12},
                                     "content": {"type": "string", "maxLength": 40},
                                     "mode": {"type": "integer", "minimum": 0, "maximum": 999},
                                     "force": {"type": "boolean"},
                                     "tags": {"type": "array", "items": {"type": "string", "maxLength": 4},
                                              "maxItems": 2},
                                     "meta": {"type": "object", "properties": {"n": {"type": "integer"}},
                                              "required": ["n"], "additionalProperties": False},
                                     "level": {"enum": ["low", "high"]},
                                     "ratio": {"type": ["number", "null"], "minimum": 0, "maximum": 1}},
    "required": ["path", "content"], "additionalProperties": False}}
# ratio is bounded: a forced number without bounds may be one past float's range (413e6705...), which
# no JSON reader holds and typed_values keeps as text, out of the schema (qwen3_coder's grammar too)
RUN = {"name": "run", "parameters": {"type": "object", "properties": {"cmd": {"type": "string", "minLength": 1,
                                                                              "maxLength": 8}},
                                     "required": ["cmd"], "additionalProperties": False}}
FUNCTIONS = [WRITE, RUN]


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


def assert_read_split_everywhere(parser_class, functions, answer, content, calls):
    """The answer fed whole, a character at a time and cut in two anywhere gives the same content and
    calls [(name, arguments)] (each value as the schema reads it, spaced as json.dumps spaces it), and
    each call's streamed pieces join into its arguments."""
    for chunks in [[answer], list(answer)] + [[answer[:k], answer[k:]] for k in range(1, len(answer))]:
        got_content, got_calls, parts = run_parser(parser_class.for_functions(functions), chunks)
        assert got_content == content, chunks
        assert [(c.name, c.arguments) for c in got_calls] == [(n, json.dumps(a, ensure_ascii=False)) for n, a in calls]
        for call in got_calls:
            mine = [p for p in parts if p.id == call.id]
            assert mine[0].name == call.name and all(p.name is None for p in mine[1:])
            assert "".join(p.arguments for p in mine) == call.arguments


def assert_cut_anywhere_streams_its_calls(tokenizer, tool_parser, answer):
    """The answer cut after any of its tokens: the calls streamed are the calls whole, ended by length."""
    ids = tokenizer(answer, add_special_tokens=False)["input_ids"]
    for cut in range(len(ids) + 1):
        deltas, streamed, whole = cut_answer(tokenizer, tool_parser(), ids, cut)
        assert streamed == whole, cut
        assert deltas[-1].finish_reason == "length"


def assert_forced_answers_meet_the_schema(tokenizer, parser_class, functions, named, parallel):
    """Random answers the forced-call grammar allows (tool_choice required, then the function `named`
    alone) are calls of the offered functions whose arguments meet their schemas."""
    import jsonschema

    from dashinfer_client.tokenizer import added_tokens
    schemas, added = {f["name"]: f["parameters"] for f in functions}, added_tokens(tokenizer)
    for offered in (functions, [named]):
        for seed in range(6):
            answer = random_answer(tokenizer, parser_class.grammar(offered, parallel, added), seed)
            content, calls, _ = run_parser(parser_class.for_functions(offered), [answer])
            assert content.strip() == "" and calls and (parallel or len(calls) == 1), answer
            for call in calls:
                assert call.name in {f["name"] for f in offered}
                jsonschema.validate(json.loads(call.arguments), schemas[call.name])


def grammar_accepts(tokenizer, grammar, text):
    """Whether llguidance's matcher of the lark grammar takes text's tokens and ends accepting."""
    import llguidance
    ll = llguidance.LLTokenizer(tokenizer.backend_tokenizer.to_str())
    matcher = llguidance.LLMatcher(ll, llguidance.LLMatcher.grammar_from_lark(grammar), log_level=0)
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    return all(matcher.consume_token(i) for i in ids) and matcher.is_accepting()


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
