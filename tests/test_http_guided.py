"""response_format through `dashinfer serve --tp 2` and the official openai client: chat and text
completions answer JSON that follows the schema, equal to the in-process Engine's guided answer;
a schema the grammar compiler refuses is a 400 with the reason."""
import json

import httpx
import jsonschema
import openai
import pytest

from tests.http_server import API_KEY
from tests.test_guided import TINY_SCHEMA, nested_schema
from tests.test_http import client, server  # noqa: F401 (tiny_model served with an API key, and its openai client)

QUESTION = [{"role": "user", "content": "Answer in JSON."}]
OPENAI_FORM = {"type": "json_schema", "json_schema": {"name": "tiny", "schema": TINY_SCHEMA, "strict": True}}


def test_chat_answers_json_that_follows_the_schema(client, tiny_reference):
    answer = client.chat.completions.create(model="tiny", messages=QUESTION, max_tokens=400, temperature=0,
                                            response_format=OPENAI_FORM)
    text = answer.choices[0].message.content
    jsonschema.validate(json.loads(text), TINY_SCHEMA)
    assert answer.choices[0].finish_reason == "stop"
    ids, _, _, reason = tiny_reference.generate(tiny_reference.chat_ids(QUESTION), 400, response_format=OPENAI_FORM)
    assert text == tiny_reference.text(ids) and reason == "eos"


def test_streamed_chat_is_the_same_json(client):
    whole = client.chat.completions.create(model="tiny", messages=QUESTION, max_tokens=400, temperature=0,
                                           response_format=OPENAI_FORM)
    chunks = client.chat.completions.create(model="tiny", messages=QUESTION, max_tokens=400, temperature=0,
                                            response_format=OPENAI_FORM, stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == whole.choices[0].message.content


def test_text_completion_with_dashinfer_form(client, tiny_reference):
    """/v1/completions takes response_format too (outside OpenAI's SDK signature: extra_body),
    here in DashInfer's form, the schema as JSON text."""
    form = {"type": "json_object", "json_schema": json.dumps(TINY_SCHEMA)}
    prompt = [5, 17, 101, 33, 7]
    answer = client.completions.create(model="tiny", prompt=prompt, max_tokens=400, temperature=0,
                                       extra_body={"response_format": form})
    jsonschema.validate(json.loads(answer.choices[0].text), TINY_SCHEMA)
    ids, _, _, _ = tiny_reference.generate(prompt, 400, response_format=form)
    assert answer.choices[0].text == tiny_reference.text(ids)


@pytest.mark.parametrize("response_format", [
    {"type": "json_schema", "json_schema": {"name": "bad", "schema": {"type": "objectx"}}},
    {"type": "json_schema", "json_schema": {"name": "bad", "schema": {"type": "string", "pattern": "[("}}},
    {"type": "json_schema", "json_schema": {"name": "deep", "schema": nested_schema(200)}},
    {"type": "xml"}], ids=["unknown-type", "bad-pattern", "nested-200", "xml"])
def test_bad_schema_is_a_400(server, client, response_format):
    """The client's mistake: a 400 logged as a WARNING, never a server ERROR with a traceback."""
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="tiny", messages=QUESTION, max_tokens=8, response_format=response_format)
    assert "response_format" in str(e.value) and e.value.code == "ALLSPARK_PARAM_ERROR"
    assert " ERROR " not in server.output() and "Traceback" not in server.output()
    answer = client.chat.completions.create(model="tiny", messages=QUESTION, max_tokens=8, temperature=0)
    assert answer.choices[0].finish_reason in ("stop", "length")  # the server still serves


def test_a_body_nested_past_the_json_parser_is_a_400(server, client):
    """A schema nested deeper than Python's json parser goes (its RecursionError): the client's body, a 400."""
    deep = '{"type": "object", "properties": {"a": ' * 3000 + '{"type": "string"}' + "}}" * 3000
    body = ('{"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "response_format": '
            '{"type": "json_schema", "json_schema": {"name": "deep", "schema": ' + deep + "}}}")
    r = httpx.post(server.url + "/v1/chat/completions", content=body, timeout=120,
                   headers={"Authorization": f"Bearer {API_KEY}", "Content-Type": "application/json"})
    assert r.status_code == 400 and "nested too deeply" in r.json()["error"]["message"], r.text
    assert client.chat.completions.create(model="tiny", messages=QUESTION, max_tokens=8).choices


def test_logprobs_of_tokens_the_grammar_forbids_are_vllms_floor(client):
    """The grammar sets a forbidden token's logit to -inf, which JSON cannot hold: a top_logprobs
    alternative the grammar forbids is -9999.0, as vLLM's OpenAI server writes it, in whole answers,
    streams and text completions alike."""
    request = dict(model="tiny", messages=QUESTION, max_tokens=40, temperature=0, response_format=OPENAI_FORM,
                   logprobs=True, top_logprobs=5)
    whole = client.chat.completions.create(**request).choices[0].logprobs.content
    tops = [t.logprob for entry in whole for t in entry.top_logprobs]
    assert -9999.0 in tops and min(tops) == -9999.0 and all(entry.logprob > -9999.0 for entry in whole)
    streamed = [e for c in client.chat.completions.create(**request, stream=True) if c.choices and c.choices[0].logprobs
                for e in c.choices[0].logprobs.content]
    assert [e.model_dump() for e in streamed] == [e.model_dump() for e in whole]
    text = client.completions.create(model="tiny", prompt=[5, 17, 101, 33, 7], max_tokens=40, temperature=0, logprobs=5,
                                     extra_body={"response_format": OPENAI_FORM}).choices[0].logprobs
    assert min(v for top in text.top_logprobs for v in top.values()) == -9999.0
