"""HuggingFaceModel: a transformers checkpoint directory (config.json + safetensors or pytorch_model.bin).

safetensors are mapped and read without torch; .bin files need torch (loaded lazily, mmap'd,
weights_only=True so a checkpoint cannot run code).
"""
import glob
import json
import os
import re
import shutil

import numpy as np

from ..errors import ModelSerializerException
from ..tokenizer import CHAT_TEMPLATE_DIR
from . import awq, compressed, fp8, multimodal
from .arch import normalize_hf_config
from .families import family, family_for_hf
from .families.fused_experts import holds_mxfp4
from .safetensors_io import SafetensorsFile, ShardedSafetensors
from .serialized import DTYPES, weight_shapes
from .source import SourceModel

FLOAT_CODES = ("F32", "F16", "BF16")
# Tensors some checkpoints carry that the runtime recomputes or does not need.
_IGNORED = re.compile(r"(^|\.)rotary_emb\.inv_freq$")
# Files AutoTokenizer may read; copied next to the serialized model (config.json lets it pick the class).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model",
                   "vocab.json", "merges.txt", "added_tokens.json", "chat_template.json", "chat_template.jinja",
                   "config.json")
VOCABULARY_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json")  # without one there is no tokenizer

# The quant_methods of checkpoints quantized as released that convert: each module reads its config
# (read_config) and shows the weights dequantized (view).
STORED_QUANT = {"fp8": fp8, "compressed-tensors": compressed, "awq": awq}


def release_quant(model_dir):
    """The InstantQuant format of a checkpoint quantized as released, at its own width ("uint4" for a
    4-bit AWQ or compressed-tensors release, "int8" for an 8-bit one; None for FP8, which converts
    exactly, and for float checkpoints): what a conversion that names no quantization takes, so a
    4-bit release is not served as floats four times its size."""
    try:
        q = _read_json(os.path.join(model_dir, "config.json"), what="config.json").get("quantization_config")
    except ModelSerializerException:
        return None  # the conversion says what is wrong with it
    module = STORED_QUANT.get(q.get("quant_method")) if isinstance(q, dict) else None
    return module.release_format(q) if module else None


class HuggingFaceModel(SourceModel):
    """HuggingFaceModel(model_path, model_name, in_memory_serialize=False, user_set_data_type=None,
    trust_remote_code=False): DashInfer's loader for a local HF model dir, in its argument order.
    user_set_data_type "bfloat16" | "float16" | "float32"; None keeps config.json's torch_dtype."""
    source_format = "huggingface"

    def _read_config(self):
        path = os.path.join(self.model_path, "config.json")
        if not os.path.isdir(self.model_path):
            raise ModelSerializerException(f"model directory {self.model_path} does not exist")
        hf = _read_json(path, what="config.json")
        self._wrapper = multimodal.wrapper_of(hf)  # a vision-language checkpoint: its text model is served
        text = multimodal.text_config(hf) if self._wrapper else hf
        self._stored = None  # a checkpoint quantized as released: (its quant_method, its settings)
        if hf.get("quantization_config"):
            quant = hf["quantization_config"]
            method = quant.get("quant_method", "?")
            if method in STORED_QUANT:
                self._stored = method, STORED_QUANT[method].read_config(quant, path)
            elif method != family_for_hf(text)[0].stored_quant:  # gpt-oss's MXFP4 experts: kept as stored
                raise ModelSerializerException(
                    f"{path}: checkpoints already quantized ({method}) are not supported; use a float checkpoint "
                    "(or an FP8, compressed-tensors or AWQ one) and enable_quant=True (InstantQuant)")
        gen_path = os.path.join(self.model_path, "generation_config.json")
        gen = _read_json(gen_path, what="generation_config.json") if os.path.exists(gen_path) else {}
        arch, config = normalize_hf_config(text, gen)
        generation = {k: v for k, v in gen.items() if not k.startswith("_") and k != "transformers_version"}
        generation["eos_token_id"] = list(config.eos_token_id)
        return arch, config, generation

    def _checkpoint_dtype(self):
        hf = _read_json(os.path.join(self.model_path, "config.json"), what="config.json")
        name = hf.get("torch_dtype") or hf.get("dtype")  # transformers 4.x / 5.x spelling
        return name if name in DTYPES else super()._checkpoint_dtype()

    def _open_weights(self, load_format):
        weights = HFWeights(self.model_path, load_format)
        if self._wrapper:
            weights = multimodal.text_tensors(weights)
            # transformers ties by the wrapper's own config (its class default where the file says
            # nothing), which releases leave out: a checkpoint holds lm_head exactly when it is untied
            self.config.tie_word_embeddings = "lm_head.weight" not in weights
        if self._stored:  # dequantized at conversion
            method, settings = self._stored
            weights = STORED_QUANT[method].view(weights, settings, self.model_path)
        fam = family(self.architecture)
        if fam.stored_quant == "mxfp4":
            self.config.mxfp4_experts = holds_mxfp4(weights.keys())
        weights = fam.checkpoint_view(weights, self.config)
        unexpected = unexpected_tensors(weights.keys(), self.config, self.architecture)
        if unexpected:
            raise ModelSerializerException(
                f"checkpoint {self.model_path} has tensor(s) this architecture does not use: "
                f"{', '.join(sorted(unexpected)[:5])}; it is not a plain {self.architecture} model")
        return weights

    def _save_tokenizer(self, out_dir):
        return copy_tokenizer_files(self.model_path, out_dir)

    def _tokenizer_path(self):
        return self.model_path

    def _tokenizer_kwargs(self):
        return {"trust_remote_code": self.trust_remote_code}


def unexpected_tensors(names, config, architecture):
    """The tensor names a checkpoint of this config should not have (a tied lm_head and the
    rotary inv_freq buffers some checkpoints carry are expected)."""
    expected = weight_shapes(config, architecture)
    tied_head = {"lm_head.weight"} if config.tie_word_embeddings else set()
    return [n for n in names if n not in expected and n not in tied_head and not _IGNORED.search(n)]


def copy_tokenizer_files(model_dir, out_dir):
    """Copy a Hugging Face directory's tokenizer files into out_dir; False when it has none."""
    if not any(os.path.isfile(os.path.join(model_dir, name)) for name in VOCABULARY_FILES):
        return False
    for name in TOKENIZER_FILES:
        src = os.path.join(model_dir, name)
        if os.path.isfile(src):
            shutil.copy2(src, os.path.join(out_dir, name))
    named = os.path.join(model_dir, CHAT_TEMPLATE_DIR)  # transformers' named chat templates ("tool_use")
    if os.path.isdir(named):
        os.makedirs(os.path.join(out_dir, CHAT_TEMPLATE_DIR))
        for name in os.listdir(named):
            if name.endswith(".jinja") and os.path.isfile(os.path.join(named, name)):
                shutil.copy2(os.path.join(named, name), os.path.join(out_dir, CHAT_TEMPLATE_DIR, name))
    return True


def _read_json(path, what):
    try:
        with open(path) as f:
            data = json.load(f)
    except FileNotFoundError:
        raise ModelSerializerException(f"{what} is missing: {path}") from None
    except (OSError, json.JSONDecodeError) as e:
        raise ModelSerializerException(f"{path} is not valid JSON: {e}") from None
    if not isinstance(data, dict):
        raise ModelSerializerException(f"{path} is not a JSON object")
    return data


class HFWeights:
    """The tensors of a checkpoint directory by name, whatever the file layout."""

    def __init__(self, model_path, load_format="auto"):
        """load_format: "auto" (safetensors when present, else the PyTorch files), "safetensors" or
        "pt" (only that layout; its absence is an error)."""
        self.model_path = model_path
        st_index = os.path.join(model_path, "model.safetensors.index.json")
        st_single = os.path.join(model_path, "model.safetensors")
        bin_index = os.path.join(model_path, "pytorch_model.bin.index.json")
        bin_single = os.path.join(model_path, "pytorch_model.bin")
        use_st, use_pt = load_format in ("auto", "safetensors"), load_format in ("auto", "pt")
        if use_st and os.path.exists(st_index):
            self._st = ShardedSafetensors(st_index)
        elif use_st and os.path.exists(st_single):
            self._st = SafetensorsFile(st_single)
        elif use_pt and (os.path.exists(bin_index) or os.path.exists(bin_single)):
            self._st = None
            self._bin = _load_bin(bin_index, bin_single)
        else:
            found = sorted(os.path.basename(p) for p in glob.glob(os.path.join(model_path, "*.safetensors")))
            expected = (["model.safetensors", "model.safetensors.index.json"] if use_st else []) + \
                       (["pytorch_model.bin", "pytorch_model.bin.index.json"] if use_pt else [])
            raise ModelSerializerException(
                f"no weights in {model_path} for load_format={load_format!r}: expected "
                f"{' or '.join(expected)}" + (f" (found {found})" if found else ""))

    def keys(self):
        return self._st.keys() if self._st is not None else list(self._bin)

    def __contains__(self, name):
        return name in self._st if self._st is not None else name in self._bin

    def shape(self, name):
        return self._st.info(name)[1] if self._st is not None else tuple(self._bin[name].shape)

    def code(self, name):
        """The tensor's safetensors dtype code (a .bin tensor's: the one fetch would give, else its torch dtype)."""
        if self._st is not None:
            return self._st.info(name)[0]
        return _TORCH_CODES.get(str(self._bin[name].dtype), str(self._bin[name].dtype))

    def fetch(self, name, codes=FLOAT_CODES):
        """(numpy array, dtype code), the code one of `codes`; bf16 as uint16 bits."""
        if self._st is not None:
            code = self._st.info(name)[0]
            if code not in codes:
                raise ModelSerializerException(
                    f"tensor '{name}' in {self.model_path} has dtype {code}; expected one of {', '.join(codes)}")
            return self._st.get(name), code
        return torch_tensor_to_numpy(name, self._bin[name], self.model_path, codes)


def _load_bin(index_path, single_path):
    """{name: torch tensor} of .bin checkpoint file(s), memory-mapped (torch imported only here)."""
    try:
        import torch
    except ImportError:
        raise ModelSerializerException(
            "reading pytorch_model.bin checkpoints needs torch, which is not installed: "
            "pip install 'dashinfer-py[convert]' (safetensors checkpoints do not need it)") from None
    if os.path.exists(index_path):
        with open(index_path) as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
        paths = [os.path.join(os.path.dirname(index_path), name) for name in files]
    else:
        paths = [single_path]
    tensors = {}
    for path in paths:
        try:
            tensors.update(torch.load(path, map_location="cpu", mmap=True, weights_only=True))
        except Exception as e:  # torch raises many types for a broken file
            raise ModelSerializerException(f"cannot read PyTorch checkpoint {path}: {e}") from None
    return tensors


_TORCH_CODES = {"torch.float32": "F32", "torch.float16": "F16", "torch.bfloat16": "BF16", "torch.uint8": "U8",
                "torch.float8_e4m3fn": "F8_E4M3"}


def torch_tensor_to_numpy(name, tensor, where, codes=FLOAT_CODES):
    """(numpy array sharing the tensor's memory when it can, dtype code), the code one of `codes`;
    bf16 as uint16 bits."""
    import torch
    code = _TORCH_CODES.get(str(tensor.dtype))
    if code not in codes:
        raise ModelSerializerException(f"tensor '{name}' in {where} has dtype {tensor.dtype}; expected one of "
                                       f"{', '.join(codes)}")
    tensor = tensor.detach().contiguous()
    if tensor.dtype == torch.bfloat16:
        return tensor.view(torch.int16).numpy().view(np.uint16), "BF16"
    if code == "F8_E4M3":
        return tensor.view(torch.uint8).numpy(), code
    return tensor.numpy(), code
