"""Tiny random Hugging Face models (LLaMA, Qwen2) and transformers references, for the tests.

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
UNEVEN = dict(TINY, hidden_size=72, num_attention_heads=9, num_key_value_heads=3, head_dim=8)
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
    "phi3": ("Phi3Config", dict(sliding_window=None)),
    # windows of 8 keys: a 45-token prompt crosses them many times
    "mistral": ("MistralConfig", dict(sliding_window=8)),
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
    model = AutoModelForCausalLM.from_config(config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
            else:
                p.copy_(torch.randn_like(p) / p.shape[-1] ** 0.5 if p.ndim >= 2 else 0.1 * torch.randn_like(p))
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


def build_tiny_tokenizer(out_dir, chat_template=CHATML, extra_special=()):
    """A byte-level BPE tokenizer (ChatML specials, 256 byte tokens, then extra_special: ids < 272)
    with a chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
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


def gguf_reference_dir(gguf_path, cache_dir):
    """What transformers loads from a GGUF, saved once as a Hugging Face dir (float32) and reused.

    AutoModelForCausalLM.from_pretrained(gguf_file=...) needs `accelerate`, so this calls the loader
    underneath it (transformers.modeling_gguf_pytorch_utils.load_gguf_checkpoint: name map, Q/K
    un-permutation, dequantization). Building takes ~30 s (transformers parses the whole vocabulary
    in Python), so the result is cached per transformers/gguf version. The dir also holds
    reference_ids.json: the chat-templated capital-of-France prompt encoded by the tokenizer that
    transformers builds from the GGUF.
    """
    import gguf
    import transformers
    out = os.path.join(cache_dir, "test-reference", f"transformers-{transformers.__version__}-gguf-{_gguf_version(gguf)}",
                       os.path.splitext(os.path.basename(gguf_path))[0])
    done = os.path.join(out, "reference_ids.json")
    if not os.path.exists(done):
        import fcntl
        os.makedirs(out, exist_ok=True)
        with open(os.path.join(out, ".lock"), "w") as lock:  # concurrent test runs build it once
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not os.path.exists(done):
                _build_gguf_reference(gguf_path, out, done)
    return out


def _build_gguf_reference(gguf_path, out, done):
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint
    folder, name = os.path.dirname(os.path.abspath(gguf_path)), os.path.basename(gguf_path)
    config = AutoConfig.from_pretrained(folder, gguf_file=name)
    with torch.device("meta"):
        skeleton = AutoModelForCausalLM.from_config(config)
    tensors = load_gguf_checkpoint(gguf_path, return_tensors=True, model_to_load=skeleton)["tensors"]
    model = AutoModelForCausalLM.from_config(config).float()
    missing, unexpected = model.load_state_dict(tensors, strict=False)
    if unexpected or [k for k in missing if k != "lm_head.weight"]:
        raise RuntimeError(f"transformers GGUF reference: missing {missing}, unexpected {unexpected}")
    model.tie_weights()
    model.save_pretrained(out)
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    ids = chat_prompt_ids(tokenizer)
    with open(done + ".tmp", "w") as f:
        json.dump({"prompt_ids": ids}, f)
    os.replace(done + ".tmp", done)


def chat_prompt_ids(tokenizer, question="What is the capital of France?"):
    """The question as a one-turn chat, templated for generation, as token ids."""
    text = tokenizer.apply_chat_template([{"role": "user", "content": question}], tokenize=False,
                                         add_generation_prompt=True)
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def _gguf_version(gguf):
    from importlib.metadata import version
    try:
        return version("gguf")
    except Exception:
        return getattr(gguf, "__version__", "unknown")


def _llama_cpp_permute(w, n_head, n_kv_head):
    """llama.cpp's converter permutation of LLaMA Q/K rows (convert_hf_to_gguf.py LlamaModel.permute)."""
    if n_head != n_kv_head:
        n_head = n_kv_head
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


_GGUF_BLOCK = {"input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
               "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
               "post_attention_layernorm": "ffn_norm", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
               "mlp.down_proj": "ffn_down", "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm",
               "self_attn.qkv_proj": "attn_qkv", "mlp.gate_up_proj": "ffn_up"}
# Gemma's four norms, as llama.cpp names them (and stores them: 1 + w)
_GGUF_GEMMA = {"post_attention_layernorm": "post_attention_norm", "pre_feedforward_layernorm": "ffn_norm",
               "post_feedforward_layernorm": "post_ffw_norm"}


def build_tiny_gguf(gguf_path, hf_dir, quant_type=None, rope_theta=None, tokenizer_model="gpt2"):
    """Write the float32 tiny HF model in hf_dir as a llama.cpp-style GGUF (LLaMA, Qwen2/3, Phi-3,
    Gemma 2/3, and the mixtures of experts of tests/gguf_moe.py) and return its path.

    quant_type: None (F32 tensors) or a gguf.GGMLQuantizationType name ("Q8_0", "Q4_1", ...) applied to
    the 2-D weights; the tokenizer (byte-level BPE, no merges) and chat template go into the metadata,
    the tokenizer under the kind `tokenizer_model` says.
    """
    import gguf
    from safetensors.numpy import load_file
    with open(os.path.join(hf_dir, "config.json")) as f:
        cfg = json.load(f)
    from tests.gguf_moe import GGUF_ARCH, write_experts
    arch = dict(GGUF_ARCH, gemma3_text="gemma3").get(cfg["model_type"], cfg["model_type"])
    gemma = arch.startswith("gemma")
    heads, kv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    tensors = load_file(os.path.join(hf_dir, "model.safetensors"))
    writer = gguf.GGUFWriter(str(gguf_path), arch)
    writer.add_block_count(cfg["num_hidden_layers"])
    writer.add_context_length(cfg["max_position_embeddings"])
    writer.add_embedding_length(cfg["hidden_size"])
    writer.add_feed_forward_length(cfg["intermediate_size"])
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv)
    writer.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    theta = rope_theta or (cfg.get("rope_parameters") or {}).get("rope_theta") or cfg.get("rope_theta", 10000.0)
    writer.add_rope_freq_base(theta)
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // heads
    rope = cfg.get("rope_parameters") or {}
    rotary = int(head_dim * rope.get("partial_rotary_factor", cfg.get("partial_rotary_factor") or 1.0))
    if arch == "llama" or rotary != head_dim:
        writer.add_rope_dimension_count(rotary)
    if cfg.get("sliding_window"):
        writer.add_sliding_window(cfg["sliding_window"])
    for key in ("attn_logit_softcapping", "final_logit_softcapping"):
        if cfg.get(key):
            writer.add_float32(f"{arch}.{key}", cfg[key])
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    with open(os.path.join(hf_dir, "tokenizer.json")) as f:
        vocab = json.load(f)["model"]["vocab"]
    tokens = [t for t, _ in sorted(vocab.items(), key=lambda kv_: kv_[1])]
    tokens += [f"<|unused{i}|>" for i in range(cfg["vocab_size"] - len(tokens))]
    writer.add_tokenizer_model(tokenizer_model)
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types([gguf.TokenType.CONTROL if t in SPECIAL_TOKENS or t.startswith("<|unused")
                            else gguf.TokenType.NORMAL for t in tokens])
    writer.add_token_scores([0.0] * len(tokens))  # no merges: transformers derives (none) from scores
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_pad_token_id(0)
    writer.add_chat_template(CHATML)
    if cfg["model_type"] in GGUF_ARCH:
        tensors = write_experts(writer, cfg, tensors)
    for name, w in tensors.items():
        if name.startswith("blk."):
            gname = name
        elif name == "model.embed_tokens.weight":
            gname = "token_embd.weight"
        elif name == "model.norm.weight":
            gname = "output_norm.weight"
        elif name == "lm_head.weight":
            gname = "output.weight"
        else:
            layer, rest = name[len("model.layers."):].split(".", 1)
            module, kind = rest.rsplit(".", 1)
            gname = f"blk.{layer}.{(_GGUF_GEMMA if gemma else {}).get(module) or _GGUF_BLOCK[module]}.{kind}"
        if gemma and name.endswith("norm.weight"):
            w = w + np.float32(1.0)
        if arch == "llama" and (".attn_q." in gname or ".attn_k." in gname):
            w = _llama_cpp_permute(w, heads, heads if ".attn_q." in gname else kv)
        if quant_type and w.ndim >= 2:
            qtype = gguf.GGMLQuantizationType[quant_type]
            writer.add_tensor(gname, gguf.quants.quantize(w, qtype), raw_dtype=qtype)
        else:
            writer.add_tensor(gname, np.ascontiguousarray(w, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return str(gguf_path)


def build_sentencepiece_gguf(gguf_path, arch="llama"):
    """A GGUF holding only a SentencePiece-style ("llama") tokenizer, as llama.cpp writes Llama 2's:
    byte-fallback tokens, word-start pieces with scores and no merges, a user-defined token."""
    import gguf
    words = ["\u2581the", "\u2581a", "\u2581cap", "\u2581capital", "\u2581of", "\u2581France", "\u2581is",
             "\u2581Paris", "\u2581hello", "\u2581world", "ing", "\u2581t", "\u2581th", "he", "th", "ca", "pi", "tal",
             "\u2581c", "\u2581ca", "an", "ce", "ar", "ri", "or", "ld", "ll", "el", "lo", "\u2581h", "\u2581he"]
    letters = sorted(set("".join(words).replace("\u2581", "")) | set("bdgjkmnuvxyzBCDEGHIJKLMNOQRSTUVWXYZ.,!?'"))
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] + ["\u2581"] + letters + words + ["<tool>"]
    T = gguf.TokenType
    types = [T.UNKNOWN, T.CONTROL, T.CONTROL] + [T.BYTE] * 256 + [T.NORMAL] * (1 + len(letters) + len(words)) \
        + [T.USER_DEFINED]
    scores = [0.0] * 259 + [-1.0] + [-2.0 - 0.01 * i for i in range(len(letters))] \
        + [-10.0 - 0.1 * len(w) - 0.01 * i for i, w in enumerate(words)] + [0.0]
    writer = gguf.GGUFWriter(str(gguf_path), arch)
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_scores(scores)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_unk_token_id(0)
    writer.add_chat_template("{% for m in messages %}[INST] {{ m['content'] }} [/INST]</s>{% endfor %}")
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return str(gguf_path)


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


def tiny_with_template(tmp_path_factory, name, template, max_position_embeddings=2048, extra_special=()):
    """A tiny LLaMA whose tokenizer speaks `template` (extra_special: more special tokens),
    serialized (float32) as "tiny" -> (its checkpoint dir, the serialized model's directory)."""
    hf_dir = build_tiny_model(str(tmp_path_factory.mktemp(name) / "hf"), max_position_embeddings=max_position_embeddings)
    build_tiny_tokenizer(hf_dir, template, extra_special)
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
