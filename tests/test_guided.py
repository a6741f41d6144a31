"""Guided decoding (response_format): the output parses as JSON and follows the schema, on the
in-process Engine and on ClientEngine over gRPC (2 tensor-parallel ranks for the default model);
a bad schema is refused with ALLSPARK_PARAM_ERROR by both; an unguided request batched with a
guided one generates what it generates alone; the mask is llguidance's own."""
import json

import jsonschema
import llguidance
import numpy as np
import pytest

import dashinfer_client as allspark
from dashinfer_client import AsStatus, default_model
from dashinfer_client.generation_config import response_format_schema
from dashinfer_server.guided import Grammars
from tests.api_helpers import OK, alone, engine_error, prompt_of, run
from tests.engine_helpers import collect, greedy
from tests.helpers import chat_prompt_ids

# Bounded everywhere, so that even a random tiny model completes it within its max_length.
TINY_SCHEMA = {"type": "object",
               "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 99},
                              "ok": {"type": "boolean"},
                              "tag": {"type": "string", "enum": ["a", "b"]},
                              "s": {"type": "string", "maxLength": 3}},
               "required": ["n", "ok", "tag", "s"], "additionalProperties": False}
PERSON = {"type": "object",
          "properties": {"name": {"type": "string", "maxLength": 40},
                         "age": {"type": "integer", "minimum": 0, "maximum": 150},
                         "city": {"type": "string", "maxLength": 40}},
          "required": ["name", "age", "city"]}
QUESTION = "Give the name, age and city of a fictional person as JSON."


def nested_schema(depth: int) -> dict:
    """An object `depth` levels of `properties` deep: from 200, past llguidance's parser's recursion limit."""
    schema = {"type": "string"}
    for _ in range(depth):
        schema = {"type": "object", "properties": {"a": schema}}
    return schema

# Each form of response_format, and the schema it constrains to.
FORMS = [({"type": "json_object"}, {"type": "object"}),
         ({"type": "json_object", "json_schema": json.dumps(PERSON)}, PERSON),  # DashInfer's
         ({"type": "json_object", "json_schema": PERSON}, PERSON),
         ({"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}}, PERSON),  # OpenAI's
         ({"type": "text"}, None)]


@pytest.mark.parametrize("response_format,schema", FORMS)
def test_forms(response_format, schema):
    assert response_format_schema(response_format) == schema
    built = allspark.ASGenerationConfigBuilder().response_format(response_format).build()
    assert built["response_format"] == response_format


@pytest.mark.parametrize("bad", [{"type": "xml"}, {"json_schema": PERSON}, "json",
                                 {"type": "json_object", "json_schema": "{not json"},
                                 {"type": "json_object", "json_schema": [1]},
                                 {"type": "json_schema"}, {"type": "text", "json_schema": PERSON},
                                 {"type": "json_object", "schema": PERSON},
                                 {"type": "text", "reasoning_end": "</think>"},
                                 {"type": "json_object", "reasoning_end": ""},
                                 {"type": "json_object", "reasoning_start": "<think>"},
                                 {"type": "json_object", "answer_start": "<|channel|>final<|message|>"},
                                 {"type": "text", "answer_start": "x"}])
def test_malformed_refused_by_the_builder(bad):
    with pytest.raises(ValueError, match="response_format"):
        allspark.ASGenerationConfigBuilder().response_format(bad)


def test_mask_is_llguidances(serialized_tiny):
    """Guide.apply leaves exactly the tokens llguidance allows (its own byte-per-token mask),
    with the request's eos in place of the tokenizer's where the grammar may end."""
    loader = serialized_tiny("llama")
    tok = loader.get_tokenizer()
    vocab = loader.config.vocab_size
    grammars = Grammars(lambda: tok, vocab)
    request_eos = 5
    guide = grammars.guide({"type": "json_object", "json_schema": TINY_SCHEMA}, [request_eos])
    reference = llguidance.LLMatcher(llguidance.LLTokenizer(tok.backend_tokenizer.to_str(), n_vocab=vocab,
                                                            eos_token=tok.eos_token_id),
                                     llguidance.LLMatcher.grammar_from_json_schema(json.dumps(TINY_SCHEMA)))
    rng = np.random.default_rng(0)
    for token in tok.encode('{"n": 7, "ok": true, "tag": "b", "s": "xy"}', add_special_tokens=False):
        row = rng.standard_normal(vocab).astype(np.float32)
        before = row.copy()
        guide.apply(row)
        allowed = np.frombuffer(reference.compute_logit_bias(), np.uint8)[:vocab] > 0
        assert np.array_equal(row[allowed], before[allowed]) and np.all(row[~allowed] == -np.inf)
        guide.advance(token)
        assert reference.consume_token(token)
    assert guide.ended and reference.is_stopped()


def test_eos_where_the_grammar_may_end_and_the_grammar_wins_over_bans(serialized_tiny):
    """A top-level integer may end after any digit: there the request's eos (not the tokenizer's)
    is allowed, and taking it ends the request. If the penalties banned every allowed token, the
    allowed ones come back, equally likely."""
    loader = serialized_tiny("llama")
    tok, vocab = loader.get_tokenizer(), loader.config.vocab_size
    guide = Grammars(lambda: tok, vocab).guide({"type": "json_object", "json_schema": {"type": "integer"}}, [5])
    digits = [tok.convert_tokens_to_ids(d) for d in "0123456789"]
    row = np.full(vocab, -np.inf, np.float32)  # every token banned, as penalties could
    guide.apply(row)
    allowed = set(np.flatnonzero(row == 0))
    assert set(digits) <= allowed and tok.convert_tokens_to_ids("a") not in allowed
    assert np.all(row[row != 0] == -np.inf)
    guide.advance(digits[4])
    row = np.zeros(vocab, np.float32)
    guide.apply(row)
    assert row[5] == 0 and row[tok.eos_token_id] == -np.inf and not guide.ended
    guide.advance(5)
    assert guide.ended and guide.error is None


def _tiny_request(api, rf, **options):
    engine, name, loader = api
    prompt = prompt_of(9, 5)
    ids, _, queue, handle = run(api, prompt, greedy(len(prompt) + 400, response_format=rf, **options))
    engine.release_request(name, handle)
    return ids, queue.RequestStatInfo()["finish_reason"], loader.get_tokenizer()


@pytest.mark.parametrize("form", ["dashinfer", "openai"])
def test_tiny_model_follows_the_schema(api_engine, form):
    rf = ({"type": "json_object", "json_schema": json.dumps(TINY_SCHEMA)} if form == "dashinfer" else
          {"type": "json_schema", "json_schema": {"name": "t", "schema": TINY_SCHEMA}})
    ids, reason, tok = _tiny_request(api_engine, rf)
    jsonschema.validate(json.loads(tok.decode(ids)), TINY_SCHEMA)
    assert reason == "eos"  # ended by the grammar, early_stopping off notwithstanding


def test_sampling_and_min_length_still_parse(api_engine):
    """Sampling (upstream's test samples: temperature 0.7, top_k 20, top_p 0.9), and a min_length
    past the grammar's end: the grammar wins over the eos ban."""
    rf = {"type": "json_object", "json_schema": TINY_SCHEMA}
    for options in (dict(do_sample=True, temperature=0.7, top_k=20, top_p=0.9, seed=1234),
                    dict(min_length=9 + 390)):
        ids, reason, tok = _tiny_request(api_engine, rf, **options)
        jsonschema.validate(json.loads(tok.decode(ids)), TINY_SCHEMA)


def test_reasoning_end_masks_nothing_before_it(serialized_tiny):
    """Before the end text every token llguidance's free text takes stays allowed; after it only
    the schema's; a whole object after it ends the request."""
    loader = serialized_tiny("llama")
    tok, vocab = loader.get_tokenizer(), loader.config.vocab_size
    rf = {"type": "json_object", "json_schema": TINY_SCHEMA, "reasoning_end": "</think>"}
    guide = Grammars(lambda: tok, vocab).guide(rf, [5])
    letter, brace = tok.convert_tokens_to_ids("x"), tok.convert_tokens_to_ids("{")

    def allowed():
        row = np.zeros(vocab, np.float32)
        guide.apply(row)
        return row == 0
    for token in tok.encode("Calls for {x}: </thin>k", add_special_tokens=False):
        assert allowed()[[letter, brace]].all()
        guide.advance(token)
    for token in tok.encode("</think>\n\n", add_special_tokens=False):
        guide.advance(token)
    mask = allowed()
    assert mask[brace] and not mask[letter]
    for token in tok.encode('{"n": 7, "ok": true, "tag": "b", "s": "xy"}', add_special_tokens=False):
        guide.advance(token)
    assert guide.ended and guide.error is None


def test_reasoning_start_makes_the_reasoning_optional(serialized_tiny):
    """With reasoning_start too, the answer either opens the reasoning with it (then free up to
    reasoning_end, constrained after) or is constrained from its first token."""
    loader = serialized_tiny("llama")
    tok, vocab = loader.get_tokenizer(), loader.config.vocab_size
    rf = {"type": "json_object", "json_schema": TINY_SCHEMA, "reasoning_start": "<think>", "reasoning_end": "</think>"}
    obj = '{"n": 7, "ok": true, "tag": "b", "s": "xy"}'
    def ids(text):
        return tok.encode(text, add_special_tokens=False)
    letter, brace, angle = (tok.convert_tokens_to_ids(c) for c in "x{<")
    for answer, free_at in ((obj, None), ("<think>\nx{ </thin </think>\n\n" + obj, len(ids("<think>")))):
        guide = Grammars(lambda: tok, vocab).guide(rf, [5])
        for i, token in enumerate(ids(answer)):
            row = np.zeros(vocab, np.float32)
            guide.apply(row)
            if i == 0:
                assert row[brace] == 0 and row[angle] == 0 and row[letter] == -np.inf
            if i == free_at:
                assert row[letter] == 0
            guide.advance(token)
        assert guide.ended and guide.error is None, answer


def test_reasoning_end_that_is_an_added_token_is_that_token(tmp_path):
    """QwQ's and DeepSeek-R1's </think> is an added token of their tokenizers (not special), which
    the model writes to end its reasoning: it stays allowed while the model reasons (a regular
    expression ending in its text masked it out, so the reasoning could not end) and the schema
    holds from it on."""
    from dashinfer_client.tokenizer import Tokenizer
    from tests.helpers import build_tiny_tokenizer
    tok = Tokenizer(build_tiny_tokenizer(str(tmp_path), extra_added=("<think>", "</think>")))
    rf = {"type": "json_object", "json_schema": TINY_SCHEMA, "reasoning_end": "</think>"}
    guide = Grammars(lambda: tok, 272).guide(rf, [tok.eos_token_id])
    end, letter, brace = (tok.convert_tokens_to_ids(t) for t in ("</think>", "x", "{"))

    def allowed():
        row = np.zeros(272, np.float32)
        guide.apply(row)
        return row == 0
    for token in tok.encode("Calls for {x}: </thin>k", add_special_tokens=False):
        assert allowed()[[letter, brace, end]].all()
        guide.advance(token)
    [token] = tok.encode("</think>", add_special_tokens=False)  # the tokenizer writes the text as the token
    guide.advance(token)
    assert guide.error is None and not guide.ended
    mask = allowed()
    assert mask[brace] and not mask[letter] and not mask[end]
    for token in tok.encode('\n\n{"n": 7, "ok": true, "tag": "b", "s": "xy"}', add_special_tokens=False):
        assert allowed()[token]
        guide.advance(token)
    assert guide.ended and guide.error is None
    # <think> an added token too, the reasoning optional (Qwen3's): it opens with that token, or not at all
    guide = Grammars(lambda: tok, 272).guide(dict(rf, reasoning_start="<think>"), [tok.eos_token_id])
    opening = tok.convert_tokens_to_ids("<think>")
    mask = allowed()
    assert mask[opening] and mask[brace] and not mask[letter] and not mask[tok.convert_tokens_to_ids("<")]
    guide.advance(opening)
    assert allowed()[[letter, brace, end]].all()


def test_harmony_answer_bounds_are_the_markers(tmp_path):
    """gpt-oss's JSON answer (the bounds the HTTP server sets for harmony): an optional analysis
    message, free text ended by <|end|>, then the final channel's header, then the schema; each
    marker is its special token, which the model writes (spelled out as text, it was masked out)."""
    from dashinfer_client.frontend import Prompts
    from dashinfer_client.tokenizer import Tokenizer
    from tests.chat_templates import HARMONY, HARMONY_TOKENS
    from tests.helpers import build_tiny_tokenizer
    tok = Tokenizer(build_tiny_tokenizer(str(tmp_path), HARMONY, extra_special=HARMONY_TOKENS))
    prompt = tok.apply_chat_template([{"role": "user", "content": "Hi"}], tokenize=False, add_generation_prompt=True)
    rf = dict({"type": "json_object", "json_schema": TINY_SCHEMA}, **Prompts(tok).reasoning_bounds(prompt))
    channel, message, end, start, ret = (tok.convert_tokens_to_ids(t) for t in
                                         ("<|channel|>", "<|message|>", "<|end|>", "<|start|>", "<|return|>"))
    letter, brace = tok.convert_tokens_to_ids("x"), tok.convert_tokens_to_ids("{")
    obj = '{"n": 7, "ok": true, "tag": "b", "s": "xy"}'
    final = "<|channel|>final<|message|>" + obj
    for answer in (final, "<|channel|>analysis<|message|>Paris? {x}: <|end|><|start|>assistant" + final):
        guide = Grammars(lambda: tok, 272).guide(rf, [tok.eos_token_id])
        ids = tok.encode(answer, add_special_tokens=False)
        masks = []
        for token in ids:
            row = np.zeros(272, np.float32)
            guide.apply(row)
            masks.append(row == 0)
            assert masks[-1][token], (answer, token)
            guide.advance(token)
        assert guide.ended and guide.error is None, answer
        assert masks[0][channel] and masks[0].sum() == 1  # a header first, reasoning or not
        body = ids.index(message) + 1  # the first message's body
        if "analysis" in answer:  # free text and <|end|>, no other marker
            assert masks[body][[letter, brace, end]].all() and not masks[body][[channel, start, ret]].any()
        else:  # the JSON
            assert masks[body][brace] and not masks[body][[letter, end, channel]].any()


@pytest.mark.parametrize("schema", ['{"type": "objectx"}',
                                    {"type": "object", "properties": {"a": {"type": "string", "pattern": "[("}}},
                                    nested_schema(200)], ids=["unknown-type", "bad-pattern", "nested-200"])
def test_bad_schema_refused(api_engine, schema):
    engine, name, loader = api_engine
    gen = greedy(40, response_format={"type": "json_object", "json_schema": schema})
    status, handle, queue = engine.start_request_ids(name, loader, prompt_of(9, 5), gen)
    assert status == AsStatus.ALLSPARK_PARAM_ERROR and handle is None
    assert "response_format" in engine_error(engine)
    ids, _, _ = _tiny_request(api_engine, {"type": "json_object", "json_schema": TINY_SCHEMA})  # still serving
    assert ids


def test_unguided_neighbour_unchanged(api_engine):
    """A guided and an unguided request in one continuous batch: the unguided one generates
    what it generates alone, the guided one still follows its schema."""
    engine, name, loader = api_engine
    plain = prompt_of(13, 8)
    expected = alone(api_engine, plain, 60)
    rf = {"type": "json_object", "json_schema": TINY_SCHEMA}
    guided_prompt = prompt_of(9, 5)
    s1, h1, q1 = engine.start_request_ids(name, loader, guided_prompt,
                                          greedy(len(guided_prompt) + 400, response_format=rf))
    s2, h2, q2 = engine.start_request_ids(name, loader, plain, greedy(len(plain) + 60))
    assert s1 == s2 == OK
    guided_ids, _ = collect(q1)
    assert collect(q2)[0] == expected
    jsonschema.validate(json.loads(loader.get_tokenizer().decode(guided_ids)), TINY_SCHEMA)
    engine.release_request(name, h1)
    engine.release_request(name, h2)


# ---- the default model: real JSON, on Engine and on ClientEngine over 2 ranks -------------------

@pytest.fixture(scope="module", params=["engine", "client-tp2"])
def smollm2(request):
    model = allspark.DashInferModel(*default_model.ensure_default_model("bfloat16", progress=False))
    engine = (allspark.Engine() if request.param == "engine" else
              allspark.ClientEngine(nodes=2, env={"DASHINFER_NUMA_NODES": "0:0;1:1"}, startup_timeout=180))
    cfg = model.create_reference_runtime_config_builder("smol", max_batch=4).max_length(1024).build()
    assert engine.install_model(cfg) == OK and engine.start_model("smol") == OK
    yield engine, model
    engine.release_model("smol")
    if request.param != "engine":
        engine.close()


def test_default_model_answers_valid_json(smollm2):
    """Every form at once, in one continuous batch: each answer parses and follows its schema."""
    engine, model = smollm2
    tok = model.get_tokenizer()
    prompt = chat_prompt_ids(tok, QUESTION)
    started = []
    for response_format, schema in FORMS[:4]:
        gen = model.create_reference_generation_config_builder().update(
            {"do_sample": False, "max_length": len(prompt) + 200, "response_format": response_format})
        status, handle, queue = engine.start_request_ids("smol", None, prompt, gen)
        assert status == OK, engine_error(engine)
        started.append((handle, queue, schema))
    for handle, queue, schema in started:
        ids, _ = collect(queue)
        jsonschema.validate(json.loads(tok.decode(ids, skip_special_tokens=True)), schema)
        assert queue.RequestStatInfo()["finish_reason"] == "eos"
        engine.release_request("smol", handle)


def test_reasoning_end_frees_the_answer_up_to_it(smollm2):
    """With reasoning_end the model writes what it writes unguided up to that text's first
    occurrence (here a word of its own answer), then follows the schema after it."""
    engine, model = smollm2
    tok = model.get_tokenizer()
    prompt = chat_prompt_ids(tok, QUESTION)

    def answer(**options):
        gen = model.create_reference_generation_config_builder().update(
            {"do_sample": False, "max_length": len(prompt) + 200, **options})
        status, handle, queue = engine.start_request_ids("smol", None, prompt, gen)
        assert status == OK, engine_error(engine)
        ids, _ = collect(queue)
        engine.release_request("smol", handle)
        return tok.decode(ids, skip_special_tokens=True), queue.RequestStatInfo()["finish_reason"]
    free, _ = answer(max_length=len(prompt) + 24)
    end = free.split()[5]  # a word some tokens in
    text, reason = answer(response_format={"type": "json_object", "json_schema": PERSON, "reasoning_end": end})
    cut = free.index(end) + len(end)
    assert text[:cut] == free[:cut] and reason == "eos"
    jsonschema.validate(json.loads(text[cut:]), PERSON)
