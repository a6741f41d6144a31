"""Every model family through the front doors a user meets: `dashinfer convert` then `pipeline()`,
`serialize_model_from_torch` by the family's class name, and `dashinfer serve --tp 2` with the
openai client. Each answer is transformers' greedy answer to the
same chat prompt (tests/test_families.py checks the logits themselves)."""
import os

import pytest

import dashinfer_client as allspark
from dashinfer_client import GenerationConfig, TurbomindEngineConfig, pipeline
from dashinfer_server import cli
from tests.engine_helpers import collect, greedy, hf_greedy
from tests.helpers import FAMILY_CONFIGS, load_hf_model
from tests.http_server import MAX_MODEL_LEN, serving
from tests.test_families import FAMILIES

QUESTION = "Which family are you from?"
NEW_TOKENS = 8
# mixtures of experts through the same doors (tests/test_moe.py checks their logits); transformers 5
# hands Qwen3-MoE's experts to serialize_model_from_torch as 3-D parameters, which it refuses
# (test_moe.py), gpt-oss's family splits its own
MOE = ["qwen3_moe", "gpt_oss", "glm4_moe", "ernie4_5_moe", "dots1", "granitemoe", "minimax_m2", "hunyuan_moe"]


def chat_ids(hf_dir):
    """The prompt ids of one user turn under the checkpoint's own chat template (transformers)."""
    from transformers import AutoTokenizer
    tokenizer = AutoTokenizer.from_pretrained(hf_dir)
    text = tokenizer.apply_chat_template([{"role": "user", "content": QUESTION}], tokenize=False,
                                         add_generation_prompt=True)
    return tokenizer.encode(text, add_special_tokens=False)


def expected_answer(hf_dir):
    return hf_greedy(load_hf_model(hf_dir), chat_ids(hf_dir), NEW_TOKENS)


def converted(hf_dir, out_dir, name):
    """`dashinfer convert` (the command's own entry point, in this process) to float32."""
    assert cli.main(["convert", hf_dir, out_dir, "--dtype", "float32", "--name", name]) == 0
    return os.path.join(out_dir, name)


@pytest.mark.parametrize("family", FAMILIES + MOE)
def test_convert_then_pipeline_answer_as_transformers(family, tiny_checkpoint, tmp_path):
    hf_dir = tiny_checkpoint(family)
    model = converted(hf_dir, str(tmp_path), family)
    greedy = GenerationConfig(max_new_tokens=NEW_TOKENS, top_k=1, ignore_eos=True)
    with pipeline(model, backend_config=TurbomindEngineConfig(session_len=256)) as pipe:
        answer = pipe([{"role": "user", "content": QUESTION}], gen_config=greedy)
    assert answer.token_ids == expected_answer(hf_dir), family


@pytest.mark.parametrize("family", FAMILIES + ["gpt_oss"])
def test_serialize_from_torch_by_class_name_answers_as_transformers(family, tiny_checkpoint, tmp_path):
    """DashInfer 1.3's conversion call, given the family's HF class name, an in-memory model and
    its config dict; then served through the DashInfer loader and Engine."""
    from dashinfer_server.engine import Engine
    hf_dir = tiny_checkpoint(family)
    hf = load_hf_model(hf_dir)
    engine = Engine()
    engine.serialize_model_from_torch("m", hf.config.architectures[0], hf.state_dict(), hf.config.to_dict(),
                                      str(tmp_path))
    loader = allspark.DashInferModel(str(tmp_path), "m")
    runtime = (loader.create_reference_runtime_config_builder("m", allspark.TargetDevice.CPU, [0], max_batch=1)
               .max_length(256).build())
    assert engine.install_model(runtime) == allspark.AsStatus.ALLSPARK_SUCCESS
    assert engine.start_model("m") == allspark.AsStatus.ALLSPARK_SUCCESS
    try:
        ids = chat_ids(hf_dir)
        status, handle, queue = engine.start_request_ids("m", loader, ids, greedy(len(ids) + NEW_TOKENS))
        assert status == allspark.AsStatus.ALLSPARK_SUCCESS
        got, _ = collect(queue)
        engine.release_request("m", handle)
    finally:
        engine.release_model("m")
    assert got == expected_answer(hf_dir), family


@pytest.mark.parametrize("family", ["gemma3", "gpt_oss"])
def test_serve_on_two_ranks_answers_as_transformers(family, tiny_checkpoint, tmp_path):
    """Gemma 3 (local and global layers, two RoPE bases, q/k norms, four norms, GeGLU) and gpt-oss
    (sinks, biases, its experts split over the ranks) through the converted model served;
    tests/test_families.py and test_moe.py run every family on 2 ranks."""
    from openai import OpenAI
    # 9 query / 3 KV heads over 2 ranks: a GQA group straddles them
    head_dim = {} if "head_dim" in FAMILY_CONFIGS[family][1] else {"head_dim": 16}  # the cache's smallest
    hf_dir = tiny_checkpoint(family, uneven=True, hidden_size=144, max_position_embeddings=MAX_MODEL_LEN, **head_dim)
    model_dir = os.path.dirname(converted(hf_dir, str(tmp_path / "out"), "tiny"))
    with serving(model_dir, str(tmp_path / "serve.log"), tp=2) as server:
        client = OpenAI(base_url=server.url + "/v1", api_key="none")
        reply = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": QUESTION}],
                                               max_tokens=NEW_TOKENS, temperature=0, logprobs=True)
    choice = reply.choices[0]
    assert choice.finish_reason == "length" and len(choice.logprobs.content) == NEW_TOKENS
    from transformers import AutoTokenizer
    expected = AutoTokenizer.from_pretrained(hf_dir).decode(expected_answer(hf_dir))
    assert choice.message.content == expected, family
