"""GGUFModel: a llama.cpp GGUF file (LLaMA or Qwen2), dequantized with the `gguf` package.

GGUF names map onto the Hugging Face LLaMA names. llama.cpp's converter permutes the rows of the
LLaMA Q and K projections (its RoPE pairs neighbouring dims, HF's pairs the two halves of a head);
the permutation is undone exactly as transformers' own GGUF loader does it
(transformers.modeling_gguf_pytorch_utils.LlamaTensorProcessor). Qwen2 files are not permuted.
Hyper-parameters come from the GGUF metadata, the tokenizer from gguf_tokenizer.py (transformers'
GGUF conversion for the tokenizer kinds that module does not build).
"""
import os
import re
import tempfile

from ..errors import ModelSerializerException
from ..tokenizer import Tokenizer
from .arch import ModelConfig, eos_list
from .base import auto_tokenizer
from .gguf_tokenizer import Unsupported, write_tokenizer_dir
from .source import SourceModel

ARCHITECTURES = {"llama": "llama", "qwen2": "qwen2"}  # GGUF general.architecture -> ours
_GLOBAL_NAMES = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
                 "output.weight": "lm_head.weight"}
_BLOCK_NAMES = {"attn_norm": "input_layernorm", "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
                "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj",
                "ffn_norm": "post_attention_layernorm", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
                "ffn_down": "mlp.down_proj"}
_BLOCK = re.compile(r"^blk\.(\d+)\.(\w+)\.(weight|bias)$")


def hf_name(gguf_name):
    """GGUF tensor name -> HF LLaMA name, or None when it has no HF counterpart."""
    if gguf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[gguf_name]
    m = _BLOCK.match(gguf_name)
    if m and m.group(2) in _BLOCK_NAMES:
        return f"model.layers.{m.group(1)}.{_BLOCK_NAMES[m.group(2)]}.{m.group(3)}"
    return None


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
            try:
                self._reader = GGUFReader(self.model_path)
            except Exception as e:  # the reader raises ValueError/struct.error/... on a broken file
                raise ModelSerializerException(f"cannot read GGUF file {self.model_path}: {e}") from None
        return self._reader

    def _read_config(self):
        reader = self._open_reader()
        meta = _Metadata(reader, self.model_path)
        gguf_arch = meta.get("general.architecture")
        if gguf_arch not in ARCHITECTURES:
            raise ModelSerializerException(
                f"GGUF architecture {gguf_arch!r} in {self.model_path} is not supported: "
                f"supported are {', '.join(ARCHITECTURES)}")
        names = {t.name: t for t in reader.tensors}
        if "rope_freqs.weight" in names:
            raise ModelSerializerException(
                f"{self.model_path} carries per-dimension RoPE frequency factors (rope_freqs.weight, Llama 3.1 "
                "style), which this loader does not read; convert the Hugging Face checkpoint instead")
        a = gguf_arch
        hidden = meta.need(f"{a}.embedding_length")
        heads = meta.need(f"{a}.attention.head_count")
        kv_heads = meta.get(f"{a}.attention.head_count_kv", heads)
        head_dim = meta.get(f"{a}.attention.key_length", hidden // heads)
        rot = meta.get(f"{a}.rope.dimension_count", head_dim)
        if rot != head_dim:
            raise ModelSerializerException(
                f"{self.model_path}: partial rotary embeddings (rope.dimension_count {rot} != head_dim {head_dim}) "
                "are not supported")
        if "token_embd.weight" not in names:
            raise ModelSerializerException(f"GGUF file {self.model_path} lacks tensor token_embd.weight")
        vocab = meta.get(f"{a}.vocab_size", int(names["token_embd.weight"].shape[1]))
        eos = [meta.get("tokenizer.ggml.eos_token_id")]
        eos += [meta.get(f"tokenizer.ggml.{k}_token_id") for k in ("eot", "eom")]
        eos = eos_list(list(dict.fromkeys(e for e in eos if e is not None)))
        config = ModelConfig(
            vocab_size=int(vocab), hidden_size=int(hidden),
            intermediate_size=int(meta.need(f"{a}.feed_forward_length")),
            num_hidden_layers=int(meta.need(f"{a}.block_count")),
            num_attention_heads=int(heads), num_key_value_heads=int(kv_heads), head_dim=int(head_dim),
            rms_norm_eps=float(meta.need(f"{a}.attention.layer_norm_rms_epsilon")),
            rope_theta=float(meta.get(f"{a}.rope.freq_base", 10000.0)),
            rope_scaling=_rope_scaling(meta, a, self.model_path),
            max_position_embeddings=int(meta.need(f"{a}.context_length")),
            tie_word_embeddings="output.weight" not in names,
            attention_bias=gguf_arch == "qwen2" or "blk.0.attn_q.bias" in names,
            bos_token_id=meta.get("tokenizer.ggml.bos_token_id"), eos_token_id=eos,
            pad_token_id=meta.get("tokenizer.ggml.padding_token_id"))
        config.validate(f"GGUF metadata of {self.model_path}")
        generation = {k: v for k, v in (("bos_token_id", config.bos_token_id), ("pad_token_id", config.pad_token_id))
                      if v is not None}
        generation["eos_token_id"] = list(eos)
        self._gguf_arch = gguf_arch
        return ARCHITECTURES[gguf_arch], config, generation

    def _open_weights(self, load_format):
        if load_format != "auto":
            raise ModelSerializerException(f"load_format={load_format!r}: a GGUF file is neither; use 'auto'")
        return GGUFWeights(self._open_reader(), self.config, self._gguf_arch, self.model_path)

    def free_model(self):
        self._reader = None
        return super().free_model()

    def _save_tokenizer(self, out_dir):
        try:  # tokenizers alone (gguf_tokenizer.py): serving and chatting need no transformers
            write_tokenizer_dir(self._open_reader(), out_dir)
        except Unsupported:
            self._gguf_tokenizer().save_pretrained(out_dir)
        return True

    def _gguf_tokenizer(self):
        if self.tokenizer is None:
            with tempfile.TemporaryDirectory(prefix="gguf-tokenizer-") as out:
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
    """HF-named tensors of a GGUF file, dequantized to float32 on fetch."""

    def __init__(self, reader, config, gguf_arch, path):
        self.path = path
        self._config = config
        self._permute = gguf_arch == "llama"
        self._tensors = {}
        for t in reader.tensors:
            name = hf_name(t.name)
            if name is None:
                raise ModelSerializerException(f"GGUF file {path} has tensor {t.name}, which this loader does not know")
            self._tensors[name] = t

    def keys(self):
        return list(self._tensors)

    def __contains__(self, name):
        return name in self._tensors

    def shape(self, name):
        return tuple(int(d) for d in reversed(self._tensors[name].shape))

    def fetch(self, name):
        from gguf.quants import dequantize
        t = self._tensors[name]
        try:
            w = dequantize(t.data, t.tensor_type)
        except NotImplementedError as e:
            raise ModelSerializerException(f"{self.path}: tensor {t.name}: {e}") from None
        if self._permute and (".q_proj." in name or ".k_proj." in name):
            kv = self._config.num_attention_heads if ".q_proj." in name else self._config.num_key_value_heads
            w = reverse_llama_permute(w, self._config.num_attention_heads, kv)
        return w.reshape(self.shape(name)), "F32"


class _Metadata:
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
            return bytes(part).decode("utf-8")
        if field.types[0] == GGUFValueType.ARRAY:
            return default  # no array-valued hyper-parameter is read here
        return part[0].item()

    def need(self, key):
        value = self.get(key)
        if value is None:
            raise ModelSerializerException(f"GGUF file {self._path} lacks the metadata key '{key}'")
        return value


def _rope_scaling(meta, arch, path):
    kind = meta.get(f"{arch}.rope.scaling.type", "none")
    if kind == "none":
        return None
    if kind == "linear":
        return {"rope_type": "linear", "factor": float(meta.need(f"{arch}.rope.scaling.factor"))}
    raise ModelSerializerException(f"{path}: RoPE scaling type {kind!r} is not supported (none, linear)")
