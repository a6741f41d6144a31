"""GGUFModel: a llama.cpp GGUF file of a family llama.cpp's converter writes (LLaMA, SmolLM3, Qwen2,
Qwen3, Gemma 2/3, Phi-3, ERNIE 4.5, StarCoder2, Command R, Granite 3, Nemotron, and the mixtures of experts of gguf_experts.py: Qwen3-MoE,
Qwen2-MoE, Mixtral, OLMoE, GLM-4.5, MiniMax-M2, ERNIE 4.5 MoE), dequantized with the `gguf` package. The multi-token-prediction layers
llama.cpp keeps after the last ({arch}.nextn_predict_layers of {arch}.block_count) are not read.

GGUF names map onto the family's Hugging Face names (a norm by its role: families/base.py).
llama.cpp's converter permutes the rows of the LLaMA (and SmolLM3, Granite) Q and K projections (its RoPE pairs
neighbouring dims, HF's pairs the two halves of a head); the permutation is undone exactly as
transformers' own GGUF loader does it (transformers.modeling_gguf_pytorch_utils.LlamaTensorProcessor).
Other families are not permuted. Gemma's RMSNorm weights and Nemotron's LayerNorm1P ones are stored
as 1 + w (HF keeps w). The
family's checkpoint views then apply as to its HF checkpoints (ERNIE's interleaved RoPE: llama.cpp
rotates its pairs as HF does, so its rows are reordered as theirs are).
Hyper-parameters come from the GGUF metadata, the tokenizer from gguf_tokenizer.py (transformers'
GGUF conversion for the tokenizer kinds that module does not build).
"""
import math
import os
import re
import tempfile

import numpy as np

from ..errors import ModelSerializerException
from ..tokenizer import Tokenizer
from .arch import ModelConfig, eos_list
from .base import auto_tokenizer, reading_tokenizer
from .families import BY_GGUF
from .gguf_check import check_gguf
from .gguf_experts import expert_entries, expert_fields, gguf_family
from .gguf_tokenizer import Unsupported, has_tokenizer, write_tokenizer_dir
from .safetensors_io import drop_mapped_pages
from .source import SourceModel

_GLOBAL_NAMES = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
                 "output_norm.bias": "model.norm.bias",
                 "output.weight": "lm_head.weight"}
_BLOCK_NAMES = {"attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
                "attn_qkv": "self_attn.qkv_proj", "attn_output": "self_attn.o_proj",
                "attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm",
                "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj"}
_NORM_ROLES = {"attn_norm": "attn_in", "post_attention_norm": "attn_out", "ffn_norm": "mlp_in",
               "post_ffw_norm": "mlp_out"}
_BLOCK = re.compile(r"^blk\.(\d+)\.(\w+)\.(weight|bias)$")
LAYER_NORM_ARCHS = ("starcoder2", "command-r", "nemotron")  # LayerNorms: eps under layer_norm_epsilon
PERMUTED = ("llama", "smollm3", "granite", "granitemoe")  # Q/K rows permuted by llama.cpp's LlamaModel
_LAYER = re.compile(r"^blk\.(\d+)\.")


def hf_name(gguf_name, family):
    """GGUF tensor name -> the family's HF name, or None when it has no HF counterpart."""
    if gguf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[gguf_name]
    m = _BLOCK.match(gguf_name)
    if not m:
        return None
    part = m.group(2)
    if part in family.gguf_names:
        module = family.gguf_names[part]
    elif part in _NORM_ROLES and _NORM_ROLES[part] in family.norms:
        module = family.norms[_NORM_ROLES[part]]
    elif part in _BLOCK_NAMES:
        module = _BLOCK_NAMES[part]
    else:
        return None
    return f"model.layers.{m.group(1)}.{module}.{m.group(3)}"


def reverse_llama_permute(w, n_head, n_kv_head=None):
    """Undo llama.cpp's Q/K row permutation (rows of each head: interleaved pairs -> two halves)."""
    if n_kv_head is not None and n_head != n_kv_head:
        n_head = n_kv_head
    dim = w.shape[0] // n_head // 2
    return w.reshape(n_head, dim, 2, *w.shape[1:]).swapaxes(2, 1).reshape(w.shape)


class GGUFModel(SourceModel):
    """GGUFModel(gguf_path, model_name, user_set_data_type="bfloat16"|"float16"|"float32", ...):
    the same fluent steps as HuggingFaceModel, reading a GGUF file."""
    source_format = "gguf"

    def __init__(self, gguf_path, model_name, user_set_data_type="bfloat16", in_memory_serialize=False,
                 trust_remote_code=False, progress=None):
        super().__init__(gguf_path, model_name, in_memory_serialize=in_memory_serialize,
                         user_set_data_type=user_set_data_type, trust_remote_code=trust_remote_code,
                         progress=progress)
        self._reader = None

    def _open_reader(self):
        if self._reader is None:
            if not os.path.isfile(self.model_path):
                raise ModelSerializerException(f"GGUF file {self.model_path} does not exist")
            from gguf import GGUFReader
            check_gguf(self.model_path)  # the reader trusts every count and offset it reads
            try:
                self._reader = GGUFReader(self.model_path)
            except Exception as e:  # the reader raises ValueError/struct.error/... on a broken file
                raise ModelSerializerException(f"cannot read GGUF file {self.model_path}: {e}") from None
        return self._reader

    def _read_config(self):
        reader = self._open_reader()
        meta = _Metadata(reader, self.model_path)
        gguf_arch = meta.get("general.architecture")
        family = gguf_family(gguf_arch, meta)
        if family is None:
            raise ModelSerializerException(
                f"GGUF architecture {gguf_arch!r} in {self.model_path} is not supported: "
                f"supported are {', '.join(BY_GGUF)}")
        names = {t.name: t for t in reader.tensors}
        if "rope_freqs.weight" in names:
            raise ModelSerializerException(
                f"{self.model_path} carries per-dimension RoPE frequency factors (rope_freqs.weight, Llama 3.1 "
                "style), which this loader does not read; convert the Hugging Face checkpoint instead")
        if "token_embd.weight" not in names:
            raise ModelSerializerException(f"GGUF file {self.model_path} lacks tensor token_embd.weight")
        config = ModelConfig(**_gguf_fields(meta, gguf_arch, names, self.model_path))
        config.validate(f"GGUF metadata of {self.model_path}")
        generation = {k: v for k, v in (("bos_token_id", config.bos_token_id), ("pad_token_id", config.pad_token_id))
                      if v is not None}
        generation["eos_token_id"] = list(config.eos_token_id)
        self._gguf_arch, self._family = gguf_arch, family
        return family.name, config, generation

    def _open_weights(self, load_format):
        if load_format != "auto":
            raise ModelSerializerException(f"load_format={load_format!r}: a GGUF file is neither; use 'auto'")
        # the family's views over the HF-named tensors (ERNIE's interleaved RoPE dims reordered, ...)
        return self._family.checkpoint_view(
            GGUFWeights(self._open_reader(), self.config, self._gguf_arch, self._family, self.model_path), self.config)

    def free_model(self):
        self._reader = None
        return super().free_model()

    def _save_tokenizer(self, out_dir):
        if not has_tokenizer(self._open_reader()):
            return False  # converted without one, as a Hugging Face directory without tokenizer files
        try:  # tokenizers alone (gguf_tokenizer.py): serving and chatting need no transformers
            write_tokenizer_dir(self._open_reader(), out_dir)
        except Unsupported:
            self._gguf_tokenizer().save_pretrained(out_dir)
        return True

    def _gguf_tokenizer(self):
        if self.tokenizer is None:
            if not has_tokenizer(self._open_reader()):
                raise ModelSerializerException(f"GGUF file {self.model_path} has no tokenizer")
            with tempfile.TemporaryDirectory(prefix="gguf-tokenizer-") as out, \
                    reading_tokenizer(f"the tokenizer of GGUF file {self.model_path}"):
                try:
                    write_tokenizer_dir(self._open_reader(), out)
                    self.tokenizer = Tokenizer(out, padding_side="left")  # reads everything now
                    self.tokenizer.name_or_path = self.model_path
                except Unsupported:  # transformers reads other kinds out of the GGUF metadata
                    self.tokenizer = auto_tokenizer(
                        os.path.dirname(os.path.abspath(self.model_path)),
                        gguf_file=os.path.basename(self.model_path), padding_side="left")
        return self.tokenizer

    def init_tokenizer(self, padding_side="left"):
        if self.tokenizer is None:
            if self.model_output_dir:  # the serialized copy loads in a fraction of the GGUF conversion time
                return super().init_tokenizer(padding_side)
            self._gguf_tokenizer().padding_side = padding_side
        return self

    def _tokenizer_path(self):
        return os.path.join(self.model_output_dir, self.serialize_model_name + ".tokenizer")


class GGUFWeights:
    """HF-named tensors of a GGUF file, dequantized to float32 on fetch; a stacked expert tensor
    (gguf_experts.py) gives each expert's HF name, dequantized alone."""

    def __init__(self, reader, config, gguf_arch, family, path):
        self.path = path
        self._config = config
        self._permute = gguf_arch in PERMUTED  # llama.cpp's converters of these are its LlamaModel
        self._family = family
        self._tensors = {}  # HF name -> (GGUF tensor, expert index or None)
        for t in reader.tensors:
            layer = _LAYER.match(t.name)
            if layer and int(layer.group(1)) >= config.num_hidden_layers:
                continue  # a multi-token-prediction layer (nextn_predict_layers)
            m = _BLOCK.match(t.name)
            entries = expert_entries(m.group(1), m.group(2), m.group(3), family, config) if m else None
            if entries is None:
                name = hf_name(t.name, family)
                if name is None:
                    raise ModelSerializerException(
                        f"GGUF file {path} has tensor {t.name}, which this loader does not know")
                entries = [(name, None)]
            for name, expert in entries:
                self._tensors[name] = (t, expert)

    def keys(self):
        return list(self._tensors)

    def __contains__(self, name):
        return name in self._tensors

    def shape(self, name):
        t, expert = self._tensors[name]
        dims = tuple(int(d) for d in reversed(t.shape))
        if expert is not None:
            return dims[1:]
        layout = self._family.experts
        if len(dims) == 1 and layout and (name.endswith(f".{layout.shared_gate}.weight") or (
                layout.choice_bias_row and name.endswith(f".{layout.choice_bias}"))):
            return (1,) + dims  # Qwen2-MoE's shared expert gate, ERNIE's choice bias: rows of one there
        return dims

    def fetch(self, name):
        from gguf.quants import dequantize
        t, expert = self._tensors[name]
        source = t.data if expert is None else t.data[expert]
        try:
            w = dequantize(source, t.tensor_type)
        except NotImplementedError as e:
            raise ModelSerializerException(f"{self.path}: tensor {t.name}: {e}") from None
        drop_mapped_pages(source)  # read: one tensor of the file resident at a time (an F32 view faults back)
        if self._permute and (".q_proj." in name or ".k_proj." in name):
            kv = self._config.num_attention_heads if ".q_proj." in name else self._config.num_key_value_heads
            w = reverse_llama_permute(w, self._config.num_attention_heads, kv)
        if self._family.norm_offset and self._family.is_norm(name):
            w = w - np.float32(self._family.norm_offset)  # llama.cpp stores Gemma's norms as 1 + w
        return w.reshape(self.shape(name)), "F32"


class _Metadata:
    """Typed reads of a GGUF file's metadata: a value of the wrong type is a ModelSerializerException
    naming its key, never a TypeError or a division by zero further on."""

    def __init__(self, reader, path):
        self._fields = reader.fields
        self._path = path

    def get(self, key, default=None):
        field = self._fields.get(key)
        if field is None or not field.types:
            return default
        from gguf import GGUFValueType
        part = field.parts[field.data[0]]
        if field.types[0] == GGUFValueType.STRING:
            try:
                return bytes(part).decode("utf-8")
            except UnicodeDecodeError:
                raise ModelSerializerException(f"GGUF file {self._path}: metadata '{key}' is not UTF-8") from None
        if field.types[0] == GGUFValueType.ARRAY:
            return default  # no array-valued hyper-parameter is read here
        return part[0].item()

    def need(self, key):
        value = self.get(key)
        if value is None:
            raise ModelSerializerException(f"GGUF file {self._path} lacks the metadata key '{key}'")
        return value

    def count(self, key, default=None):
        """A positive integer (required when default is None)."""
        value = self.need(key) if default is None else self.get(key, default)
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ModelSerializerException(f"GGUF file {self._path}: metadata '{key}' is {value!r}, "
                                           "not a positive integer")
        return value

    def real(self, key, default=None):
        """A finite number (required when default is None)."""
        value = self.need(key) if default is None else self.get(key, default)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise ModelSerializerException(f"GGUF file {self._path}: metadata '{key}' is {value!r}, not a number")
        return float(value)


def _gguf_fields(meta, a, names, path):
    """ModelConfig fields out of GGUF metadata of architecture a, as llama.cpp reads them."""
    hidden = meta.count(f"{a}.embedding_length")
    heads = meta.count(f"{a}.attention.head_count")
    head_dim = meta.count(f"{a}.attention.key_length", hidden // heads)
    blocks, drafts = meta.count(f"{a}.block_count"), meta.get(f"{a}.nextn_predict_layers") or 0
    if isinstance(drafts, bool) or not isinstance(drafts, int) or not 0 <= drafts < blocks:
        raise ModelSerializerException(f"GGUF file {path}: metadata '{a}.nextn_predict_layers' is {drafts!r}, "
                                       f"not a count of the {blocks} blocks' last ones")
    layers = blocks - drafts  # llama.cpp's multi-token-prediction layers follow the model's
    rot = meta.count(f"{a}.rope.dimension_count", head_dim)
    eos = [meta.get("tokenizer.ggml.eos_token_id")] + [meta.get(f"tokenizer.ggml.{k}_token_id") for k in ("eot", "eom")]
    fields = dict(
        vocab_size=meta.count(f"{a}.vocab_size", int(names["token_embd.weight"].shape[-1])), hidden_size=hidden,
        intermediate_size=meta.count(f"{a}.feed_forward_length"), num_hidden_layers=layers,
        num_attention_heads=heads, num_key_value_heads=meta.count(f"{a}.attention.head_count_kv", heads),
        head_dim=head_dim, rms_norm_eps=meta.real(f"{a}.attention.layer_norm_epsilon" if a in LAYER_NORM_ARCHS
                                                  else f"{a}.attention.layer_norm_rms_epsilon"),
        rope_theta=meta.real(f"{a}.rope.freq_base", 10000.0), rope_scaling=_rope_scaling(meta, a, path),
        rotary_dim=rot if rot != head_dim else None,
        max_position_embeddings=meta.count(f"{a}.context_length"),
        tie_word_embeddings="output.weight" not in names,
        attention_bias=a == "qwen2" or "blk.0.attn_q.bias" in names or "blk.0.attn_qkv.bias" in names,
        attention_out_bias="blk.0.attn_output.bias" in names, mlp_bias="blk.0.ffn_down.bias" in names,
        use_qk_norm="blk.0.attn_q_norm.weight" in names,
        bos_token_id=meta.get("tokenizer.ggml.bos_token_id"),
        eos_token_id=eos_list(list(dict.fromkeys(e for e in eos if e is not None))),
        pad_token_id=meta.get("tokenizer.ggml.padding_token_id"))
    fields.update(expert_fields(meta, a, names, layers, path))
    window = meta.count(f"{a}.attention.sliding_window", fields["max_position_embeddings"])
    if a in ("granite", "granitemoe"):  # Granite's four scalars as llama.cpp's GraniteModel writes them
        attention = meta.real(f"{a}.attention.scale", 0.0)
        fields.update(embedding_multiplier=meta.real(f"{a}.embedding_scale", 1.0),
                      residual_multiplier=meta.real(f"{a}.residual_scale", 1.0),
                      attention_scale=attention or None, logits_multiplier=1.0 / meta.real(f"{a}.logit_scale"))
    if a in ("starcoder2", "nemotron"):  # llama.cpp's plain MLPs: GELU-tanh, ReLU^2
        fields["hidden_act"] = "gelu_tanh" if a == "starcoder2" else "relu2"
    if a == "command-r":  # Cohere's logits scale; Command R+'s q/k LayerNorms per head are not served
        fields["logits_multiplier"] = meta.real(f"{a}.logit_scale", 1.0)
        if "blk.0.attn_q_norm.weight" in names:
            raise ModelSerializerException(f"GGUF file {path}: {a} with attn_q_norm / attn_k_norm (Command R+'s "
                                           "LayerNorms of q and k per head) is not supported")
    if a in ("gemma2", "gemma3"):
        # llama.cpp: every other layer sliding (Gemma 2), five of six (Gemma 3); scores scaled by
        # head_dim ** -0.5 (query_pre_attn_scalar is head_dim but in the 27B models); the sliding
        # layers' RoPE base is 10000; Gemma 3's scores are never soft-capped (families/gemma3.py)
        pattern = 2 if a == "gemma2" else 6
        big = layers == (46 if a == "gemma2" else 62)
        fields.update(hidden_act="gelu_tanh", embedding_multiplier=hidden ** 0.5,
                      attention_scale=(hidden / heads if big else head_dim) ** -0.5,
                      attn_logit_softcap=_optional(meta, f"{a}.attn_logit_softcapping") if a == "gemma2" else None,
                      final_logit_softcap=_optional(meta, f"{a}.final_logit_softcapping"),
                      rope_local_theta=10000.0 if a == "gemma3" else None)
        types = ["sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(layers)]
    else:
        types = ["sliding_attention"] * layers
    if window < fields["max_position_embeddings"]:
        fields.update(layer_types=types, sliding_window=window)
    if a == "smollm3":  # no key says it: llama.cpp rotates no 4th layer (its n_no_rope_layer_step)
        fields["nope_layers"] = [i for i in range(layers) if (i + 1) % 4 == 0] or None
    return fields


def _optional(meta, key):
    return meta.real(key) if meta.get(key) is not None else None


def _rope_scaling(meta, arch, path):
    kind = meta.get(f"{arch}.rope.scaling.type", "none")
    if kind == "none":
        return None
    if kind == "linear":
        return {"rope_type": "linear", "factor": meta.real(f"{arch}.rope.scaling.factor")}
    raise ModelSerializerException(f"{path}: RoPE scaling type {kind!r} is not supported (none, linear)")
