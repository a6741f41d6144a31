"""bench/llama_cpp.py's pieces that need no llama.cpp build: the model directory its converter
reads (config with architectures, linked weights, a tokenizer transformers loads and that encodes as
transformers' own GGUF tokenizer does), the bytes a token reads in a GGUF (against the gguf
package's writer and Q4_0's 18 bytes per 32 weights), llama-bench's JSON read back."""
import json
import os

import numpy as np
import pytest

from bench import llama_cpp
from dashinfer_client import default_model

TEXTS = ["What is the capital of France?", "  tabs\tand\nnew lines, 123456 and 3.14", "é, 日本語, emoji 🙂"]


@pytest.fixture
def moe_dir(tmp_path):
    """A config.json as bench/make_model.py writes it (model_type, no architectures) and two shards."""
    from transformers import AutoConfig
    out = tmp_path / "model"
    AutoConfig.for_model("qwen3_moe", hidden_size=64, num_hidden_layers=2, num_experts=4, vocab_size=49152,
                         num_attention_heads=2, num_key_value_heads=1, head_dim=32).save_pretrained(out)
    for name in ("model-00001.safetensors", "model-00002.safetensors", "model.safetensors.index.json"):
        (out / name).write_bytes(b"weights of " + name.encode())
    return out


def test_staged_model_is_what_the_converter_reads(moe_dir, tmp_path):
    from transformers import AutoTokenizer
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
    gguf_path = default_model.default_model_path(progress=False)  # a real byte-level BPE tokenizer
    staged = llama_cpp.stage_model(str(moe_dir), gguf_path, str(tmp_path / "hf"))

    with open(os.path.join(staged, "config.json")) as f:
        config = json.load(f)
    with open(moe_dir / "config.json") as f:
        original = json.load(f)
    assert "architectures" not in original
    assert config.pop("architectures") == [MODEL_FOR_CAUSAL_LM_MAPPING_NAMES["qwen3_moe"]]
    assert config == original
    for name in ("model-00001.safetensors", "model-00002.safetensors", "model.safetensors.index.json"):
        assert os.path.realpath(os.path.join(staged, name)) == str(moe_dir / name)
    assert (moe_dir / "config.json").read_text().count("architectures") == 0  # the model's own dir untouched

    ours = AutoTokenizer.from_pretrained(staged)  # as the converter loads it
    reference = AutoTokenizer.from_pretrained(os.path.dirname(gguf_path), gguf_file=os.path.basename(gguf_path))
    assert max(ours.vocab.values()) < config["vocab_size"]  # the converter's own check
    for text in TEXTS:
        assert ours.encode(text) == reference.encode(text), text


def test_vocab_of_an_unknown_family_is_refused_by_name(tmp_path):
    from transformers import AutoConfig
    AutoConfig.for_model("gemma3_text").save_pretrained(tmp_path)
    with pytest.raises(SystemExit, match="gemma3_text"):
        llama_cpp.vocab_gguf("/nonexistent", str(tmp_path))
    with open(tmp_path / "config.json", "w") as f:
        json.dump({"model_type": "qwen3_moe"}, f)
    assert llama_cpp.vocab_gguf("/src", str(tmp_path)) == "/src/models/ggml-vocab-qwen2.gguf"


def write_gguf(path, tensors, quantized, experts=None):
    """A GGUF written by the gguf package: float `tensors`, Q4_0 `quantized` ({name: fp32 array})."""
    import gguf
    writer = gguf.GGUFWriter(str(path), "qwen3moe")
    if experts:
        writer.add_expert_count(experts[0])
        writer.add_expert_used_count(experts[1])
    for name, array in tensors.items():
        writer.add_tensor(name, array)
    for name, array in quantized.items():
        writer.add_tensor(name, gguf.quants.quantize(array, gguf.GGMLQuantizationType.Q4_0),
                          raw_dtype=gguf.GGMLQuantizationType.Q4_0)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return str(path)


def test_bytes_per_token_counts_the_chosen_experts_and_skips_the_embedding(tmp_path):
    q = {"blk.0.attn_q.weight": np.random.default_rng(0).standard_normal((64, 256)).astype(np.float32)}
    tensors = {"token_embd.weight": np.zeros((100, 64), np.float32),
               "blk.0.attn_norm.weight": np.ones(64, np.float32),
               "blk.0.ffn_gate_inp.weight": np.zeros((4, 64), np.float32),
               "blk.0.ffn_up_exps.weight": np.zeros((4, 32, 64), np.float16)}
    q4_0 = 64 * 256 // 32 * 18  # Q4_0: an fp16 scale and 32 4-bit codes a block
    tied = write_gguf(tmp_path / "tied.gguf", tensors, q, experts=(4, 1))
    # tied: the head is the embedding, read whole every step
    assert llama_cpp.gguf_bytes_per_token(tied) == 100 * 64 * 4 + 4 * 64 * 4 + 4 * 32 * 64 * 2 / 4 + q4_0
    untied = write_gguf(tmp_path / "untied.gguf", {**tensors, "output.weight": np.zeros((100, 64), np.float16)},
                        q, experts=(4, 1))
    assert llama_cpp.gguf_bytes_per_token(untied) == 4 * 64 * 4 + 4 * 32 * 64 * 2 / 4 + 100 * 64 * 2 + q4_0
    dense = write_gguf(tmp_path / "dense.gguf", {"output.weight": np.zeros((100, 64), np.float16)}, q)
    assert llama_cpp.gguf_bytes_per_token(dense) == 100 * 64 * 2 + q4_0


def bench_test(n_prompt, n_gen, avg, sd):
    return {"model_type": "qwen3moe 30B.A3B Q4_0", "n_threads": 2, "n_prompt": n_prompt, "n_gen": n_gen,
            "n_depth": 0, "avg_ns": int(1e9 * max(n_prompt, n_gen) / avg), "avg_ts": avg, "stddev_ts": sd,
            "samples_ts": [avg - sd, avg + sd]}


def test_llama_bench_json_read_back():
    text = json.dumps([bench_test(512, 0, 101.5, 2.0), bench_test(0, 128, 17.25, 0.5)], indent=2)
    assert llama_cpp.parse_llama_bench(text) == {"prefill512": (101.5, 2.0), "decode1": (17.25, 0.5)}
    with pytest.raises(ValueError, match="decode1"):
        llama_cpp.parse_llama_bench(json.dumps([bench_test(512, 0, 101.5, 2.0)]))


def test_summary_ratios_and_fractions():
    ours = [{"decode1": {"decode_tok_s": 30.0, "decode_bound_tok_s": 40.0, "decode_fraction": 0.75, "bw_gbs": 20.0},
             "prefill512": {"prefill_tok_s": 300.0, "prefill_bound_tok_s": 600.0, "bf16_gflops": 100}}] * 3
    theirs = [{"decode1": 18.0, "prefill512": 200.0}, {"decode1": 20.0, "prefill512": 250.0},
              {"decode1": 22.0, "prefill512": 150.0}]
    out = llama_cpp.summary(ours, theirs, their_bytes=0.5e9)
    assert out["decode1"]["ours_over_theirs"] == 1.5
    assert out["decode1"]["llama_cpp_bound_tok_s"] == 40.0  # 20 GB/s over 0.5 GB a token
    assert out["decode1"]["llama_cpp_fraction"] == 0.5
    assert out["decode1"]["llama_over_our_bound"] == 0.5
    assert out["prefill512"]["ours_over_theirs"] == 1.5
    assert out["prefill512"]["llama_cpp_fraction"] == round(200 / 600, 3)
