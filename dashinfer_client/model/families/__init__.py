"""The model families this runtime serves, one module each (base.py says what a Family declares)."""
from ...errors import ModelSerializerException
from .apertus import APERTUS
from .arcee import ARCEE
from .cohere import COHERE, COHERE2
from .dots1 import DOTS1
from .ernie4_5 import ERNIE4_5
from .ernie4_5_moe import ERNIE4_5_MOE
from .exaone4 import EXAONE4
from .gemma2 import GEMMA2
from .gemma3 import GEMMA3
from .glm4 import GLM4
from .glm4_moe import GLM4_MOE
from .gpt_oss import GPT_OSS
from .granite import GRANITE
from .granite4 import GRANITE4
from .granitemoe import GRANITEMOE
from .helium import HELIUM
from .hunyuan import HUNYUAN
from .hunyuan_moe import HUNYUAN_MOE
from .llama import LLAMA, MINISTRAL3, MISTRAL, SEED_OSS
from .minimax_m2 import MINIMAX_M2
from .mixtral import MIXTRAL
from .nemotron import NEMOTRON
from .olmo2 import OLMO2
from .olmo3 import OLMO3
from .olmoe import OLMOE
from .phi3 import PHI3
from .qwen2 import QWEN2
from .qwen2_moe import QWEN2_MOE
from .qwen3 import QWEN3
from .qwen3_moe import QWEN3_MOE
from .smollm3 import SMOLLM3
from .starcoder2 import STARCODER2

FAMILIES = {f.name: f for f in (
    # dense
    LLAMA, MISTRAL, MINISTRAL3, SEED_OSS, ARCEE, APERTUS, HELIUM, NEMOTRON, STARCODER2, QWEN2, QWEN3, GEMMA2,
    GEMMA3, PHI3, GRANITE, GRANITE4, OLMO2, OLMO3, SMOLLM3, EXAONE4, GLM4, ERNIE4_5, HUNYUAN, COHERE, COHERE2,
    # mixture of experts
    QWEN3_MOE, QWEN2_MOE, MIXTRAL, OLMOE, GPT_OSS, GLM4_MOE, ERNIE4_5_MOE, DOTS1, GRANITEMOE, MINIMAX_M2,
    HUNYUAN_MOE)}
_BY_CLASS = {c: f for f in FAMILIES.values() for c in f.hf_classes}
_BY_MODEL_TYPE = {t: f for f in FAMILIES.values() for t in f.model_types}
BY_GGUF = {f.gguf_arch: f for f in FAMILIES.values() if f.gguf_arch}


def family(name):
    """The Family of a serialized model's architecture name."""
    if name not in FAMILIES:
        raise ModelSerializerException(f"unknown architecture {name!r}: known are {', '.join(FAMILIES)}")
    return FAMILIES[name]


def family_for_hf(hf):
    """(Family, HF class name) of a config.json dict. A model_type that is not the named class's
    own is refused: the config describes another model than the class says."""
    names = hf.get("architectures") or []
    model_type = hf.get("model_type")
    if not names and model_type in _BY_MODEL_TYPE:
        names = [_BY_MODEL_TYPE[model_type].hf_classes[0]]
    for name in names:
        if name in _BY_CLASS:
            fam = _BY_CLASS[name]
            if model_type is not None and model_type not in fam.model_types:
                raise ModelSerializerException(
                    f"config.json names {name} but model_type {model_type!r}, which is not a {name}'s "
                    f"({', '.join(fam.model_types)}): the config describes another model")
            return fam, name
    shown = names or [model_type]
    raise ModelSerializerException(
        f"unsupported architecture {', '.join(map(str, shown))}: supported are {', '.join(_BY_CLASS)}")
