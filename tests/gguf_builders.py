"""Tiny GGUF files for the tests, written with the `gguf` package as llama.cpp's converter writes
them (names, Q/K permutation, quantized types), and what transformers itself loads from a GGUF,
saved once as a Hugging Face dir: the reference the GGUF path is compared with."""
import json
import os

import numpy as np

from tests.chat_templates import CHATML, SPECIAL_TOKENS
from tests.helpers import chat_prompt_ids


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
               "self_attn.qkv_proj": "attn_qkv", "mlp.gate_up_proj": "ffn_up", "mlp.c_fc": "ffn_up",
               "mlp.c_proj": "ffn_down"}
# GLM-4.5's pre-MLP norm, as llama.cpp names it
_GGUF_GLM = {"post_attention_layernorm": "post_attention_norm"}
# Gemma's four norms, as llama.cpp names them (and stores them: 1 + w)
_GGUF_GEMMA = {"post_attention_layernorm": "post_attention_norm", "pre_feedforward_layernorm": "ffn_norm",
               "post_feedforward_layernorm": "post_ffw_norm"}


def build_tiny_gguf(gguf_path, hf_dir, quant_type=None, rope_theta=None, tokenizer_model="gpt2", tokenizer_pre="default"):
    """Write the float32 tiny HF model in hf_dir as a llama.cpp-style GGUF (LLaMA, Qwen2/3, Phi-3,
    Gemma 2/3, and the mixtures of experts of tests/gguf_moe.py) and return its path.

    quant_type: None (F32 tensors) or a gguf.GGMLQuantizationType name ("Q8_0", "Q4_1", ...) applied to
    the 2-D weights; the tokenizer (byte-level BPE, no merges) and chat template go into the metadata,
    the tokenizer under the kind `tokenizer_model` says (None: no vocabulary keys at all), its text
    split as `tokenizer_pre` names.
    """
    import gguf
    from safetensors.numpy import load_file
    with open(os.path.join(hf_dir, "config.json")) as f:
        cfg = json.load(f)
    from tests.gguf_moe import DRAFT_LAYERS, GGUF_ARCH, draft_layers, write_experts
    arch = dict(GGUF_ARCH, gemma3_text="gemma3", cohere="command-r").get(cfg["model_type"], cfg["model_type"])
    gemma = arch.startswith("gemma")
    heads, kv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    tensors = load_file(os.path.join(hf_dir, "model.safetensors"))
    writer = gguf.GGUFWriter(str(gguf_path), arch)
    writer.add_block_count(cfg["num_hidden_layers"] + DRAFT_LAYERS.get(cfg["model_type"], 0))
    writer.add_context_length(cfg["max_position_embeddings"])
    writer.add_embedding_length(cfg["hidden_size"])
    writer.add_feed_forward_length(cfg["intermediate_size"])
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv)
    if arch in ("starcoder2", "command-r", "nemotron"):  # LayerNorms
        writer.add_layer_norm_eps(cfg.get("norm_epsilon") or cfg.get("norm_eps") or cfg["layer_norm_eps"])
    else:
        writer.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    theta = rope_theta or (cfg.get("rope_parameters") or {}).get("rope_theta") or cfg.get("rope_theta", 10000.0)
    writer.add_rope_freq_base(theta)
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // heads
    rope = cfg.get("rope_parameters") or {}
    rotary = int(head_dim * rope.get("partial_rotary_factor", cfg.get("partial_rotary_factor") or 1.0))
    if arch in ("llama", "smollm3", "granite", "granitemoe") or rotary != head_dim:
        writer.add_rope_dimension_count(rotary)
    if cfg.get("sliding_window"):
        writer.add_sliding_window(cfg["sliding_window"])
    if cfg.get("logit_scale"):  # Cohere's
        writer.add_logit_scale(cfg["logit_scale"])
    if arch in ("granite", "granitemoe"):  # GraniteModel's scalars
        writer.add_attention_scale(cfg["attention_multiplier"])
        writer.add_embedding_scale(cfg["embedding_multiplier"])
        writer.add_residual_scale(cfg["residual_multiplier"])
        writer.add_logit_scale(cfg["logits_scaling"])
    for key in ("attn_logit_softcapping", "final_logit_softcapping"):
        if cfg.get(key):
            writer.add_float32(f"{arch}.{key}", cfg[key])
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    with open(os.path.join(hf_dir, "tokenizer.json")) as f:
        vocab = json.load(f)["model"]["vocab"]
    tokens = [t for t, _ in sorted(vocab.items(), key=lambda kv_: kv_[1])]
    tokens += [f"<|unused{i}|>" for i in range(cfg["vocab_size"] - len(tokens))]
    if tokenizer_model is not None:
        writer.add_tokenizer_model(tokenizer_model)
        writer.add_tokenizer_pre(tokenizer_pre)
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
    renames = _GGUF_GEMMA if gemma else _GGUF_GLM if arch == "glm4moe" else {}
    gguf_tensors = {}
    for name, w in tensors.items():
        if name.startswith("blk."):
            gname = name
        elif name == "model.embed_tokens.weight":
            gname = "token_embd.weight"
        elif name in ("model.norm.weight", "model.norm.bias"):
            gname = "output_norm." + name.rsplit(".", 1)[1]
        elif name == "lm_head.weight":
            gname = "output.weight"
        else:
            layer, rest = name[len("model.layers."):].split(".", 1)
            module, kind = rest.rsplit(".", 1)
            gname = f"blk.{layer}.{renames.get(module) or _GGUF_BLOCK[module]}.{kind}"
        if (gemma or arch == "nemotron") and name.endswith("norm.weight"):  # stored 1 + w (LayerNorm1P too)
            w = w + np.float32(1.0)
        if arch in ("llama", "smollm3", "granite", "granitemoe") and (".attn_q." in gname or ".attn_k." in gname):
            w = _llama_cpp_permute(w, heads, heads if ".attn_q." in gname else kv)
        gguf_tensors[gname] = w
    gguf_tensors.update(draft_layers(cfg, gguf_tensors))
    for gname, w in gguf_tensors.items():
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
