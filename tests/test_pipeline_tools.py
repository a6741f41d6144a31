"""The pipeline takes tools and reasoning options where LMDeploy's does: keyword arguments of
pipe() / infer() / stream_infer() (tools, chat_template_kwargs, enable_thinking, reasoning_effort)
that go to the model's chat template. Its Response keeps LMDeploy's text (what the model wrote) and
adds the front end's parse: tool_calls and reasoning_content.

LMDeploy's pipeline has no tool_choice, so a tiny model whose template speaks the <tool_call> format
is made to write a call by LMDeploy's own GenerationConfig.response_format (a regex_schema); the
references: the prompt as transformers' tokenizer renders it with the tools, and the call read back
out of the answer's text with the json module."""
import json
import os
import re

import pytest

from dashinfer_client import GenerationConfig, TurbomindEngineConfig, pipeline
from tests.chat_templates import HERMES_CHATML, HERMES_ROUND_TRIP, QWEN3, THINK_CHATML
from tests.helpers import tiny_with_template

NOTE = {"type": "function", "function": {"name": "write_note", "description": "Write a note down",
                                         "parameters": {"type": "object", "properties": {"title": {"type": "string"}}}}}
ASK = [{"role": "user", "content": "Note that the meeting moved to Friday."}]
CALL = r'<tool_call>\n\{"name": "write_note", "arguments": \{"title": "[a-z]{4,16}"\}\}\n</tool_call>'


def _model(tmp_path_factory, name, template):
    hf_dir, out = tiny_with_template(tmp_path_factory, name, template, max_position_embeddings=1024)
    return hf_dir, os.path.join(out, "tiny")


@pytest.fixture(scope="module")
def hermes(tmp_path_factory):
    hf_dir, model = _model(tmp_path_factory, "hermes", HERMES_CHATML)
    with pipeline(model, backend_config=TurbomindEngineConfig(session_len=1024, max_batch_size=4)) as pipe:
        yield hf_dir, pipe


def _hf_prompt_len(hf_dir, **kwargs):
    from transformers import AutoTokenizer
    tokenizer = AutoTokenizer.from_pretrained(hf_dir)
    text = tokenizer.apply_chat_template(ASK, tokenize=False, add_generation_prompt=True, **kwargs)
    return len(tokenizer(text, add_special_tokens=False)["input_ids"])


def test_tools_reach_the_template_and_calls_come_back_parsed(hermes):
    hf_dir, pipe = hermes
    gen = GenerationConfig(max_new_tokens=96, response_format={"type": "regex_schema", "regex_schema": CALL})
    r = pipe(ASK, gen_config=gen, tools=[NOTE])
    assert r.input_token_len == _hf_prompt_len(hf_dir, tools=[NOTE])  # the template rendered the tools
    assert re.fullmatch(CALL, r.text)  # LMDeploy's text: what the model wrote
    written = json.loads(r.text[len("<tool_call>\n"):-len("\n</tool_call>")])
    [call] = r.tool_calls
    assert call["type"] == "function" and call["id"].startswith("call_")
    assert call["function"]["name"] == written["name"]
    assert json.loads(call["function"]["arguments"]) == written["arguments"]
    assert r.finish_reason == "stop"

    pieces = list(pipe.stream_infer(ASK, gen_config=gen, tools=[NOTE]))
    assert "".join(p.text for p in pieces) == r.text
    assert [c["function"] for p in pieces for c in p.tool_calls or ()] == [call["function"]]

    plain = pipe(ASK, gen_config=gen)  # without tools: no parse, and the template renders none
    assert plain.tool_calls is None and plain.input_token_len == _hf_prompt_len(hf_dir)


def test_bad_tools_and_options_are_refused_before_anything_runs(hermes):
    _, pipe = hermes
    for kwargs, words in [(dict(tools=[{"type": "function"}]), "tools[0]"),
                          (dict(tools=[NOTE, NOTE]), "unique"),
                          (dict(chat_template_kwargs="yes"), "chat_template_kwargs"),
                          (dict(enable_thinking="yes"), "enable_thinking"),
                          (dict(reasoning_effort="extreme"), "reasoning_effort")]:
        with pytest.raises(ValueError, match=re.escape(words)):
            pipe(ASK, **kwargs)
    with pytest.raises(ValueError, match="do_preprocess"):
        pipe("hi", do_preprocess=False, tools=[NOTE])
    assert pipe("hi", gen_config=GenerationConfig(max_new_tokens=2)).generate_token_len == 2  # still serving


def test_reasoning_comes_back_apart_and_enable_thinking_reaches_the_template(tmp_path_factory):
    hf_dir, model = _model(tmp_path_factory, "think", THINK_CHATML)
    with pipeline(model, backend_config=TurbomindEngineConfig(session_len=1024, max_batch_size=4)) as pipe:
        gen = GenerationConfig(max_new_tokens=12)
        thinking = pipe(ASK, gen_config=gen)
        # the template opened <think>; a random model never closes it: all it wrote is reasoning
        assert thinking.reasoning_content == thinking.text and thinking.text
        assert thinking.input_token_len == _hf_prompt_len(hf_dir)
        for kwargs in (dict(enable_thinking=False), dict(chat_template_kwargs={"enable_thinking": False})):
            direct = pipe(ASK, gen_config=gen, **kwargs)
            assert direct.input_token_len == _hf_prompt_len(hf_dir, enable_thinking=False)
            assert direct.reasoning_content == ""  # the template closed the reasoning: the text is the answer


def test_a_tool_round_trip_renders_as_transformers_renders_it(tmp_path_factory):
    """A call the model made, then its result, in the conversation as LMDeploy takes it (OpenAI's
    message dicts: the call's arguments as JSON text, a tool message naming the call's id): the prompt
    is what transformers' apply_chat_template makes of the same messages, and the model answers on."""
    from transformers import AutoTokenizer

    from dashinfer_client.frontend.messages import chat_messages, tool_functions
    hf_dir, model = _model(tmp_path_factory, "round-trip", HERMES_ROUND_TRIP)
    reference = AutoTokenizer.from_pretrained(hf_dir)
    with pipeline(model, backend_config=TurbomindEngineConfig(session_len=1024, max_batch_size=4)) as pipe:
        gen = GenerationConfig(max_new_tokens=96, response_format={"type": "regex_schema", "regex_schema": CALL})
        [call] = pipe(ASK, gen_config=gen, tools=[NOTE]).tool_calls
        history = ASK + [{"role": "assistant", "content": None, "tool_calls": [call]},
                         {"role": "tool", "tool_call_id": call["id"], "content": "Saved as note 7."}]
        expected = reference.apply_chat_template(history, tools=[NOTE], tokenize=False, add_generation_prompt=True)
        assert '"arguments": ' + call["function"]["arguments"] in expected  # the call, as the model wrote it
        assert "<tool_response>\nSaved as note 7.\n</tool_response>" in expected
        assert pipe.prompts.chat_text(chat_messages(history), tool_functions([NOTE])) == expected
        answer = pipe(history, gen_config=GenerationConfig(max_new_tokens=4, ignore_eos=True), tools=[NOTE])
        assert answer.input_token_len == len(reference(expected, add_special_tokens=False)["input_ids"])
        assert answer.generate_token_len == 4 and answer.finish_reason == "length"
        with pytest.raises(ValueError, match=r"prompts\[0\]\[1\]: a tool message needs its 'tool_call_id'"):
            pipe(ASK + [{"role": "tool", "content": "18"}], tools=[NOTE])
        with pytest.raises(ValueError, match=r"prompts\[0\]\[1\]\.tool_calls\[0\]: arguments are not valid JSON"):
            pipe(ASK + [{"role": "assistant", "tool_calls": [{"id": "c", "type": "function", "function": {
                "name": "write_note", "arguments": "{oops"}}]}], tools=[NOTE])


def test_the_reasoning_of_a_call_reaches_the_template(tmp_path_factory):
    """LMDeploy hands its messages to transformers' template as they are, so an assistant turn's
    reasoning (Response.reasoning_content; `thinking`, as gpt-oss's template names it, or vLLM's
    `reasoning`) reaches a template that writes it back: Qwen3's, in a tool-call loop."""
    from transformers import AutoTokenizer
    hf_dir, model = _model(tmp_path_factory, "qwen3", QWEN3)
    reference = AutoTokenizer.from_pretrained(hf_dir)
    call = {"id": "call_1", "type": "function", "function": {"name": "write_note", "arguments": '{"title": "friday"}'}}
    result = {"role": "tool", "tool_call_id": "call_1", "content": "Saved as note 7."}
    reasoning = "A note titled friday says it."
    turn = {"role": "assistant", "content": "", "reasoning_content": reasoning, "tool_calls": [call]}
    expected = reference.apply_chat_template(ASK + [turn, result], tools=[NOTE], tokenize=False,
                                             add_generation_prompt=True)
    assert reasoning in expected
    with pipeline(model, backend_config=TurbomindEngineConfig(session_len=1024, max_batch_size=4)) as pipe:
        for key in ("reasoning_content", "thinking", "reasoning"):
            sent = {"role": "assistant", "content": "", key: reasoning, "tool_calls": [call]}
            answer = pipe(ASK + [sent, result], gen_config=GenerationConfig(max_new_tokens=1), tools=[NOTE])
            assert answer.input_token_len == len(reference(expected, add_special_tokens=False)["input_ids"]), key
