"""Tiny random Hugging Face models of each family and transformers references, for the tests
(GGUF files: tests/gguf_builders.py).

Every builder writes a complete model directory (config.json, generation_config.json, weights,
tokenizer) and returns its path; torch and transformers are imported inside, so importing this
module stays cheap. The engine's tests build their models with these too.
"""
import contextlib
import glob
import json
import os
import shutil
import time

import numpy as np

from tests.chat_templates import CHATML, SPECIAL_TOKENS

TINY = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            intermediate_size=128, vocab_size=272, max_position_embeddings=512, rms_norm_eps=1e-6)
# 9 query heads over 3 KV heads (SmolLM2's ratio): the uneven tensor-parallel split.
UNEVEN = dict(TINY, hidden_size=144, num_attention_heads=9, num_key_value_heads=3, head_dim=16)
# Tiny models of each family: (transformers config class, what the family sets beyond TINY). Each
# feature is switched on with a value far from neutral, so leaving it out shows in the logits.
FAMILY_CONFIGS = {
    "llama": ("LlamaConfig", {}),
    "qwen2": ("Qwen2Config", {}),
    "llama-bias": ("LlamaConfig", dict(attention_bias=True, mlp_bias=True)),
    "qwen3": ("Qwen3Config", dict(head_dim=32)),
    "granite": ("GraniteConfig", dict(embedding_multiplier=6.0, residual_multiplier=0.4,
                                      attention_multiplier=0.3, logits_scaling=3.0)),
    "olmo2": ("Olmo2Config", {}),
    # a sliding layer (8 keys, its own unscaled RoPE base) and a full one (YaRN)
    "olmo3": ("Olmo3Config", dict(sliding_window=8, layer_types=["sliding_attention", "full_attention"],
                                  rope_parameters={"full_attention": {"rope_type": "yarn", "rope_theta": 10000.0,
                                                                      "factor": 4.0,
                                                                      "original_max_position_embeddings": 128},
                                                   "sliding_attention": {"rope_type": "default",
                                                                         "rope_theta": 100.0}})),
    # RoPE on half of each head, its dims interleaved
    "glm4": ("Glm4Config", dict(head_dim=16)),
    # every projection biased, RoPE over interleaved dims, tied embeddings
    "ernie4_5": ("Ernie4_5Config", dict(head_dim=16, use_bias=True)),
    # q/k/v biased, o not
    "seed_oss": ("SeedOssConfig", dict(head_dim=16, attention_bias=True, attention_out_bias=False)),
    # Granite 4.0 micro's shape: attention layers only, no experts, the shared MLP, RoPE
    "granite4": ("GraniteMoeHybridConfig", dict(layer_types=["attention", "attention"], num_local_experts=0,
                                                shared_intermediate_size=96, position_embedding_type="rope",
                                                embedding_multiplier=6.0, residual_multiplier=0.4,
                                                attention_multiplier=0.3, logits_scaling=3.0, mamba_n_heads=2)),
    # q/k norms after RoPE, every attention projection biased, NTK-alpha RoPE
    "hunyuan": ("HunYuanDenseV1Config", dict(head_dim=16, attention_bias=True,
                                             rope_parameters={"rope_type": "dynamic", "alpha": 1000.0,
                                                              "factor": 1.0, "rope_theta": 10000.0})),
    # interleaved RoPE, q/k/v biased, o not
    "helium": ("HeliumConfig", dict(head_dim=16, attention_bias=True)),
    # hybrid: a sliding layer with RoPE, then a full one without (NoPE)
    "exaone4": ("Exaone4Config", dict(sliding_window=8, sliding_window_pattern=2)),
    # NoPE on the 2nd layer of 2 (interval 2), and a window of 8 keys there
    "smollm3": ("SmolLM3Config", dict(no_rope_layer_interval=2, use_sliding_window=True, sliding_window=8)),
    "phi3": ("Phi3Config", dict(sliding_window=None)),
    # Arcee AFM: a plain MLP (relu^2, no gate), its projections biased
    "arcee": ("ArceeConfig", dict(head_dim=16, mlp_bias=True, attention_bias=True)),
    # Apertus: a plain MLP of xIELU (learned scalars per layer), q/k norms, Llama 3's RoPE
    "apertus": ("ApertusConfig", dict(head_dim=16, rope_parameters={
        "rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 64})),
    # Nemotron: LayerNorm1P (1 + w, a bias), RoPE on half of each head, a plain relu^2 MLP
    "nemotron": ("NemotronConfig", dict(head_dim=16, partial_rotary_factor=0.5, norm_eps=1e-5)),
    # StarCoder2: biased LayerNorms and projections, a plain GELU-tanh MLP (c_fc, c_proj), windows of 8
    "starcoder2": ("Starcoder2Config", dict(head_dim=16, use_bias=True, sliding_window=8, norm_epsilon=1e-5)),
    # Cohere: one LayerNorm a layer feeding attention and MLP in parallel, interleaved RoPE, q/k/v/o
    # biased, logits scaled
    "cohere": ("CohereConfig", dict(head_dim=16, attention_bias=True, logit_scale=0.5, layer_norm_eps=1e-5)),
    # Cohere2: a sliding layer (8 keys) with RoPE, then a full one without
    "cohere2": ("Cohere2Config", dict(head_dim=16, sliding_window=8, layer_types=["sliding_attention", "full_attention"],
                                      logit_scale=0.5)),
    # windows of 8 keys: a 45-token prompt crosses them many times
    "mistral": ("MistralConfig", dict(sliding_window=8)),
    "ministral": ("MinistralConfig", dict(head_dim=16, sliding_window=8,
                                          layer_types=["sliding_attention", "full_attention"])),
    # Ministral 3: YaRN over an original context of 16 positions, past which each query is scaled
    # (llama-4's 1 + 0.1 log(1 + floor(p / 16))): a 45-token prompt reaches the third step
    "ministral3": ("Ministral3Config", dict(head_dim=16, sliding_window=None, rope_parameters={
        "rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 16,
        "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0, "llama_4_scaling_beta": 0.1})),
    "qwen2-window": ("Qwen2Config", dict(use_sliding_window=True, sliding_window=8, max_window_layers=1)),
    "gemma2": ("Gemma2Config", dict(head_dim=16, query_pre_attn_scalar=24, sliding_window=8,
                                    attn_logit_softcapping=2.0, final_logit_softcapping=3.0)),
    "gemma3": ("Gemma3TextConfig", dict(head_dim=16, query_pre_attn_scalar=24, sliding_window=8,
                                        layer_types=["sliding_attention", "full_attention"],
                                        rope_local_base_freq=100.0, rope_theta=10000.0)),
    # Phi-4-mini's shape of RoPE: longrope with partial rotary and a sliding window. The tests'
    # prompts (30-45 tokens) pass original_max_position_embeddings, so transformers rotates them
    # with the long factors, as the engine does when it serves more than that context
    "phi4-mini": ("Phi3Config", dict(sliding_window=12, partial_rotary_factor=0.5, original_max_position_embeddings=24,
                                     rope_scaling={"type": "longrope", "short_factor": [1.0, 1.3, 1.7, 2.2],
                                                   "long_factor": [2.0, 2.5, 3.0, 3.5]})),
    "qwen2-yarn": ("Qwen2Config", dict(rope_scaling={"rope_type": "yarn", "factor": 4.0,
                                                      "original_max_position_embeddings": 128})),
    # mixtures of experts: 8 experts of 64 rows (Mixtral 4), 2 a token; Qwen3-MoE's middle layer dense
    "qwen3_moe": ("Qwen3MoeConfig", dict(head_dim=32, num_hidden_layers=3, mlp_only_layers=[1], num_experts=8,
                                         num_experts_per_tok=2, moe_intermediate_size=64, norm_topk_prob=True)),
    "qwen2_moe": ("Qwen2MoeConfig", dict(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=64,
                                         shared_expert_intermediate_size=96)),
    "mixtral": ("MixtralConfig", dict(num_local_experts=4, num_experts_per_tok=2, intermediate_size=64,
                                      sliding_window=8)),
    "olmoe": ("OlmoeConfig", dict(num_experts=8, num_experts_per_tok=2, intermediate_size=64)),
    # GLM-4.5: sigmoid routing with a choice bias (drawn: transformers starts it at 0) and a scale,
    # two experts' worth of an ungated shared MLP, the first layer dense, q/k norms, q/k/v biases,
    # RoPE on half of each head
    "glm4_moe": ("Glm4MoeConfig", dict(head_dim=16, num_hidden_layers=3, n_routed_experts=8, num_experts_per_tok=2,
                                       moe_intermediate_size=32, n_shared_experts=2, first_k_dense_replace=1,
                                       routed_scaling_factor=2.5, use_qk_norm=True, attention_bias=True)),
    # Granite 3 MoE: Granite's four scalars, 8 experts of 64 rows in every layer
    "granitemoe": ("GraniteMoeConfig", dict(num_local_experts=8, num_experts_per_tok=2, intermediate_size=64,
                                            embedding_multiplier=6.0, residual_multiplier=0.4,
                                            attention_multiplier=0.3, logits_scaling=3.0)),
    # MiniMax-M2: whole-projection q/k norms, RoPE on half of each head, GLM's router without a shared
    # expert or a scale, in every layer
    "minimax_m2": ("MiniMaxM2Config", dict(head_dim=16, num_local_experts=8, num_experts_per_tok=2,
                                           intermediate_size=64, rotary_dim=8)),
    # Hunyuan-A13B: Hunyuan dense's attention (q/k norms after RoPE, NTK-alpha RoPE) over experts and an
    # ungated shared MLP in every layer
    "hunyuan_moe": ("HunYuanMoEV1Config", dict(head_dim=16, num_experts=8, moe_topk=2, intermediate_size=64,
                                               rope_parameters={"rope_type": "dynamic", "alpha": 1000.0,
                                                                "factor": 1.0, "rope_theta": 10000.0})),
    # dots.llm1: GLM-4.5's router with the weights not renormalised, one shared expert, every
    # projection of attention biased, the last layer of 3 sliding (8 keys)
    "dots1": ("Dots1Config", dict(head_dim=16, num_hidden_layers=3, n_routed_experts=8, num_experts_per_tok=2,
                                  moe_intermediate_size=32, n_shared_experts=1, first_k_dense_replace=1,
                                  routed_scaling_factor=2.5, norm_topk_prob=False, attention_bias=True,
                                  sliding_window=8, max_window_layers=2)),
    # ERNIE 4.5 MoE: softmax routing with a choice bias, two experts' worth of an ungated shared MLP,
    # the last layer of 3 dense (moe_layer_end_index 1), interleaved RoPE, tied embeddings
    "ernie4_5_moe": ("Ernie4_5_MoeConfig", dict(head_dim=16, num_hidden_layers=3, moe_num_experts=8, moe_k=2,
                                                moe_intermediate_size=32, moe_num_shared_experts=2,
                                                moe_layer_start_index=0, moe_layer_end_index=1)),
    # gpt-oss: sinks, biases everywhere, windows of 8 keys on alternate layers, YaRN (its own factor
    # over a shorter original context, so the scaling shows within 512 positions)
    "gpt_oss": ("GptOssConfig", dict(head_dim=16, num_hidden_layers=3, intermediate_size=64, num_local_experts=8,
                                     num_experts_per_tok=2, sliding_window=8,
                                     rope_parameters={"rope_type": "yarn", "rope_theta": 150000.0, "factor": 4.0,
                                                      "original_max_position_embeddings": 128, "beta_fast": 32.0,
                                                      "beta_slow": 1.0, "truncate": False})),
}


def tiny_config(arch="llama", uneven=False, **overrides):
    """A transformers config of a tiny model of a family (FAMILY_CONFIGS); overrides go to the
    config class (e.g. rope_parameters)."""
    import transformers
    class_name, family = FAMILY_CONFIGS[arch]
    kwargs = dict(UNEVEN if uneven else TINY, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    kwargs.update(family)
    kwargs.update(overrides)
    return getattr(transformers, class_name)(**kwargs)


def randomized(model):
    """model with its weights drawn with std 1/sqrt(fan_in) (not transformers' 0.02), so that a wrong
    tensor anywhere changes the logits visibly; norms near 1."""
    import torch
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
            else:
                p.copy_(torch.randn_like(p) / p.shape[-1] ** 0.5 if p.ndim >= 2 else 0.1 * torch.randn_like(p))
        for name, b in model.named_buffers():
            # GLM-4.5's choice bias, which transformers starts at 0: drawn with std 0.5 (the scores lie
            # in (0, 1)) it reorders experts, and no two of this model's experts come within 0.0035 of a
            # tie (measured), which the rounding of a bf16 / int8 run could flip
            if name.endswith("e_score_correction_bias"):
                b.copy_(0.5 * torch.randn_like(b))
    return model


def build_tiny_model(out_dir, arch="llama", dtype="float32", weights="safetensors", uneven=False, seed=0,
                     **config_overrides):
    """Write a random tiny model into out_dir and return out_dir.

    arch: a FAMILY_CONFIGS key; dtype: "float32" | "bfloat16" | "float16" (checkpoint dtype);
    weights: "safetensors" (one file) | "sharded" (safetensors + index) | "bin" | "bin-sharded".
    Weights are drawn with std 1/sqrt(fan_in) (not transformers' 0.02) so a wrong tensor anywhere
    changes the logits visibly.
    """
    import torch
    from transformers import AutoModelForCausalLM
    torch.manual_seed(seed)
    config = tiny_config(arch, uneven, **config_overrides)
    model = randomized(AutoModelForCausalLM.from_config(config))
    model = model.to(getattr(torch, dtype)).eval()
    os.makedirs(out_dir, exist_ok=True)
    if weights in ("safetensors", "sharded"):
        model.save_pretrained(out_dir, max_shard_size="40KB" if weights == "sharded" else "10GB")
    elif weights in ("bin", "bin-sharded"):
        model.config.save_pretrained(out_dir)
        model.generation_config.save_pretrained(out_dir)
        _save_bin(model, out_dir, sharded=weights == "bin-sharded")
    else:
        raise ValueError(f"unknown weights layout {weights!r}")
    build_tiny_tokenizer(out_dir)
    return str(out_dir)


def _save_bin(model, out_dir, sharded):
    """pytorch_model.bin as transformers 4.x wrote it (5.x writes safetensors only)."""
    import torch
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    if model.config.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    if not sharded:
        torch.save(state, os.path.join(out_dir, "pytorch_model.bin"))
        return
    names = list(state)
    half = len(names) // 2
    weight_map = {}
    for i, part in enumerate((names[:half], names[half:])):
        file = f"pytorch_model-{i + 1:05d}-of-00002.bin"
        torch.save({k: state[k] for k in part}, os.path.join(out_dir, file))
        weight_map.update({k: file for k in part})
    with open(os.path.join(out_dir, "pytorch_model.bin.index.json"), "w") as f:
        json.dump({"metadata": {}, "weight_map": weight_map}, f)


def build_tiny_tokenizer(out_dir, chat_template=CHATML, extra_special=(), extra_added=()):
    """A byte-level BPE tokenizer (ChatML specials, 256 byte tokens, then extra_special, then
    extra_added: added tokens that are not special, as Qwen's <tool_call> and <think>; ids < 272)
    with a chat template."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    byte_chars = pre_tokenizers.ByteLevel.alphabet()
    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS)}
    for ch in sorted(byte_chars):
        vocab[ch] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    for extra in extra_special:
        vocab[extra] = len(vocab)
    tok.add_special_tokens(list(SPECIAL_TOKENS) + list(extra_special))
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in extra_added])  # as Qwen's
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|im_start|>", eos_token="<|im_end|>",
                                   unk_token="<|endoftext|>", pad_token="<|endoftext|>")
    fast.chat_template = chat_template
    fast.save_pretrained(out_dir)
    return str(out_dir)


def write_config_variant(model_dir, edit):
    """Rewrite model_dir/config.json through edit(dict) -> dict (for hand-written 4.x/5.x spellings)."""
    path = os.path.join(model_dir, "config.json")
    with open(path) as f:
        config = json.load(f)
    config = edit(config)
    with open(path, "w") as f:
        json.dump(config, f, indent=1)
    return path


def load_hf_model(model_dir):
    """transformers model (float32, eval) of a tiny model dir, for logits references."""
    import torch
    from transformers import AutoModelForCausalLM
    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()


def chat_prompt_ids(tokenizer, question="What is the capital of France?"):
    """The question as a one-turn chat, templated for generation, as token ids."""
    text = tokenizer.apply_chat_template([{"role": "user", "content": question}], tokenize=False,
                                         add_generation_prompt=True)
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def eventually(predicate, timeout=10.0, poll_s=0.02) -> bool:
    """Whether `predicate` holds within `timeout` s (a bound for something to happen, never a speed check)."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(poll_s)
    return True


def source_tensors(model_dir):
    """The checkpoint's tensors read by torch/safetensors (not by the code under test), as numpy."""
    import torch
    from safetensors.torch import load_file
    state = {}
    for path in glob.glob(os.path.join(model_dir, "*.safetensors")):
        state.update(load_file(path))
    for path in glob.glob(os.path.join(model_dir, "*.bin")):
        state.update(torch.load(path, weights_only=True))
    out = {}
    for name, t in state.items():
        out[name] = t.view(torch.int16).numpy().view(np.uint16) if t.dtype == torch.bfloat16 else t.numpy()
    return out


def serialize(model_dir, out_dir, dtype="float32", **kwargs):
    """Serialize the checkpoint at model_dir into out_dir as "tiny" -> its loader."""
    from dashinfer_client.model import HuggingFaceModel
    loader = HuggingFaceModel(model_dir, "tiny", user_set_data_type=dtype, progress=False)
    loader.load_model().read_model_config().serialize_to_path(None, str(out_dir), **kwargs)
    return loader


@contextlib.contextmanager
def kernel_threads(n):
    """The kernels run on n OpenMP threads inside the block, on as many as before after it."""
    from dashinfer_server import kernels as K
    before = K.num_threads()
    K.set_num_threads(n)
    try:
        yield
    finally:
        K.set_num_threads(before)


def tiny_with_template(tmp_path_factory, name, template, max_position_embeddings=2048, extra_special=(),
                       extra_added=()):
    """A tiny LLaMA whose tokenizer speaks `template` (extra_special: more special tokens; extra_added:
    added tokens that are not special), serialized (float32) as "tiny" -> (its checkpoint dir, the
    serialized model's directory)."""
    hf_dir = build_tiny_model(str(tmp_path_factory.mktemp(name) / "hf"), max_position_embeddings=max_position_embeddings)
    build_tiny_tokenizer(hf_dir, template, extra_special, extra_added)
    out = tmp_path_factory.mktemp(name) / "serialized"
    serialize(hf_dir, out).free_model()
    return hf_dir, str(out)


def variant(base, tmp_path, edit):
    out = tmp_path / "variant"
    shutil.copytree(base, out)
    write_config_variant(out, edit)
    return str(out)


# x86-64 syscalls a prompt waits in: read(0, ...) on a pipe; select, poll, pselect6 (readline's loop)
_READ, _SELECT, _POLL, _PSELECT6 = "0", "23", "7", "270"


def waiting_for_input(pid) -> bool:
    """The process's main thread waits for its input: a prompt is ready for a SIGINT. One sent
    before, between the prompt's write and that wait, only sets CPython's flag, which is looked at
    once the wait returns, so the prompt would sit there (seen on a loaded machine)."""
    with open(f"/proc/{pid}/syscall") as f:
        fields = f.read().split()
    return fields[:2] == [_READ, "0x0"] or fields[:1] in ([_SELECT], [_POLL], [_PSELECT6])


def yield_to_the_test(pid) -> None:
    """Every thread of the process at the lowest priority (nice is per thread on Linux; threads it
    starts later inherit it). On an idle machine nothing changes; on a busy one the test, woken by
    the process's output, runs before the process writes much more, so it can act in the middle."""
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            os.setpriority(os.PRIO_PROCESS, int(tid), 19)
        except ProcessLookupError:  # a thread that ended meanwhile
            pass
