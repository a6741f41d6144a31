"""DashInfer's module paths and small API details, as its own scripts import and print them
(issue 10, points 1 and 13). The expected names and texts are upstream's (modelscope/dash-infer:
python/pyhie/allspark/*.py and the pybind11 bindings), not this runtime's output."""
import importlib
import subprocess
import sys

import pytest
from jinja2 import Template

import dashinfer_client

# module -> names upstream scripts import from it (examples at HEAD, the rc2 tests, the docs).
UPSTREAM_MODULES = {
    "engine": ["Engine", "TargetDevice", "RoPEScaleMethod", "RequestStatInfo", "AsStatus", "AsModelConfig",
               "AsCacheMode", "ASGenerationConfigBuilder"],
    "prompt_utils": ["PromptTemplate"],
    "_allspark": ["AsStatus", "GenerateRequestStatus", "AsCacheMode", "AsModelConfig", "AsMHAPrefill",
                  "AsEvictionStrategy", "AsSchedulingStrategy", "VocabType", "MultiMediaInfo",
                  "GeneratedElements", "ResultQueue"],
    "runtime_config": ["AsModelRuntimeConfigBuilder", "AsModelConfig", "get_cache_mode_from_str"],
    "generation_config": ["ASGenerationConfigBuilder"],
    "model_loader": ["HuggingFaceModel", "DashInferModel", "ModelSerializerException", "LoadFormat"],
    "quantization": ["KVCacheConfig"],
    "client": ["ClientEngine"],
}


@pytest.mark.parametrize("package", ["dashinfer_client", "dashinfer.allspark"])
@pytest.mark.parametrize("module,names", sorted(UPSTREAM_MODULES.items()))
def test_upstream_submodules_have_upstream_names(package, module, names):
    mod = importlib.import_module(f"{package}.{module}")
    for name in names:
        assert getattr(mod, name) is not None, f"{package}.{module}.{name}"


@pytest.mark.parametrize("module", sorted(UPSTREAM_MODULES))
def test_dashinfer_allspark_modules_are_the_same_objects(module):
    """One implementation: the compatibility package holds no second copy of a class."""
    assert importlib.import_module(f"dashinfer.allspark.{module}") is \
        importlib.import_module(f"dashinfer_client.{module}")
    import dashinfer.allspark as allspark
    assert allspark.GenerateRequestStatus is dashinfer_client.GenerateRequestStatus
    assert allspark.HuggingFaceModel is dashinfer_client.HuggingFaceModel


def test_star_imports_and_upstream_import_lines_run():
    """The import lines of upstream's examples, run in a fresh interpreter."""
    script = "\n".join([
        "from dashinfer import allspark",
        "from dashinfer.allspark.engine import *",
        "from dashinfer.allspark.engine import TargetDevice, RequestStatInfo, RoPEScaleMethod",
        "from dashinfer.allspark.prompt_utils import PromptTemplate",
        "from dashinfer.allspark._allspark import AsStatus, GenerateRequestStatus, AsCacheMode",
        "from dashinfer.allspark._allspark import AsModelConfig",
        "from dashinfer.allspark import AsModelRuntimeConfigBuilder, GenerateRequestStatus, AsStatus",
        "from dashinfer.allspark.runtime_config import AsModelRuntimeConfigBuilder",
        "assert Engine is allspark.Engine and TargetDevice.CPU.name == 'CPU'",
        "assert allspark.AsModelConfig is AsModelConfig",
        "import sys; assert 'torch' not in sys.modules, 'the compatibility imports pulled in torch'",
    ])
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


def test_chatml_template_is_upstreams_text():
    """Upstream renders this jinja template (prompt_utils.py); jinja drops the final newline."""
    upstream = Template("{{start_text}}{{system_role}}\n{{system_content}}{{end_text}}\n"
                        "{{start_text}}{{user_role}}\n{{user_content}}{{end_text}}\n"
                        "{{start_text}}{{assistant_role}} \n")
    question = "Who are you?"
    expected = upstream.render(start_text="<|im_start|>", end_text="<|im_end|>", system_role="system",
                               system_content="You are a helpful assistant.", user_role="user",
                               user_content=question, assistant_role="assistant")
    assert expected.endswith("<|im_start|>assistant ")
    assert dashinfer_client.PromptTemplate.apply_chatml_template(question) == expected


def test_enums_print_as_upstreams():
    from dashinfer_client import AsCacheMode, AsStatus, GenerateRequestStatus
    status = GenerateRequestStatus.Generating
    assert str(status) == "GenerateRequestStatus.Generating"
    assert f"status: {status}" == "status: GenerateRequestStatus.Generating"
    assert str(AsStatus.ALLSPARK_SUCCESS) == "AsStatus.ALLSPARK_SUCCESS"
    assert str(AsCacheMode.AsCacheQuantI8) == "AsCacheMode.AsCacheQuantI8"
    assert status == 2 and int(AsStatus.ALLSPARK_STREAMING) == 200  # still the C++ values


def test_as_status_lora_codes_and_misspelt_alias():
    from dashinfer_client import AsStatus
    codes = {"ALLSPARK_LORA_NUM_EXCEED_LIMIT_ERROR": 21, "ALLSPARK_LORA_RANK_EXCEED_LIMIT_ERROR": 22,
             "ALLSPARK_LORA_NOT_FOUND": 23, "ALLSPARK_LORA_ALREADY_LOADED": 24, "ALLSPARK_LORA_IN_USE": 25}
    assert {name: int(getattr(AsStatus, name)) for name in codes} == codes
    assert AsStatus.ALLSPARK_ALLSPARK_INVALID_CALL_ERROR is AsStatus.ALLSPARK_INVALID_CALL_ERROR


def test_upstream_enums_have_upstream_values():
    from dashinfer_client import AsEvictionStrategy, AsMHAPrefill, AsSchedulingStrategy, VocabType
    assert {m.name: int(m) for m in VocabType} == {"VOCAB_TYPE_WPM": 0, "VOCAB_TYPE_SPM": 1,
                                                   "VOCAB_TYPE_UGM": 2, "VOCAB_TYPE_BPE": 3}
    assert {m.name: int(m) for m in AsEvictionStrategy} == {"MaxLength": 0, "Random": 1}
    assert {m.name: int(m) for m in AsSchedulingStrategy} == {"ContextPriority": 0, "Balance": 1}
    assert {m.name: int(m) for m in AsMHAPrefill} == {"AsPrefillDefault": 0, "AsPrefillFlashV2": 10,
                                                      "AsPrefillXformer": 11}


def test_multimedia_info_builds_and_kv_cache_config_maps():
    from dashinfer_client import AsCacheMode, AsStatus, MultiMediaInfo
    from dashinfer_client.quantization import KVCacheConfig
    info = MultiMediaInfo()
    assert info.set_multimedia_type(1) == AsStatus.ALLSPARK_SUCCESS
    assert info.add_multimedia_content("image", [b"x", b"y"]) == AsStatus.ALLSPARK_SUCCESS
    assert info.contents == {"image": [b"x", b"y"]} and info.multimedia_type == 1
    assert KVCacheConfig("int8").cache_mode == AsCacheMode.AsCacheQuantI8
    assert KVCacheConfig("UINT4").quantize_type == KVCacheConfig.QuantType.UINT4
    with pytest.raises(ValueError, match="'int8' or 'uint4'"):
        KVCacheConfig("fp8")
