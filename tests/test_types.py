"""API types: enums, GeneratedElements, RequestStatInfo, PromptTemplate, and the light package import
(ResultQueue: test_result_queue.py)."""
import subprocess
import sys

import pytest

import dashinfer_client as allspark
from dashinfer_client import (AsCacheMode, AsStatus, GenerateRequestStatus,
                              PromptTemplate, RequestStatInfo, RoPEScaleMethod,
                              TargetDevice)


# ---- enums ---------------------------------------------------------------------------------------

def test_as_status_has_dashinfers_codes():
    assert {s.name: int(s) for s in AsStatus} == {
        "ALLSPARK_SUCCESS": 0, "ALLSPARK_UNKNOWN_ERROR": 1, "ALLSPARK_PARAM_ERROR": 2,
        "ALLSPARK_IO_ERROR": 3, "ALLSPARK_MEMORY_ERROR": 4, "ALLSPARK_RUNTIME_ERROR": 5,
        "ALLSPARK_EXCEED_LIMIT_ERROR": 7, "ALLSPARK_INVALID_CALL_ERROR": 8, "ALLSPARK_EMPTY_REQUEST": 9,
        "ALLSPARK_ILLEGAL_REQUEST_ID": 10, "ALLSPARK_CACHE_MEMORY_OUT": 11, "ALLSPARK_REQUEST_DENIED": 12,
        "ALLSPARK_LORA_NOT_LOADED": 13, "ALLSPARK_CHUNK_PREFILL": 14, "ALLSPARK_DEPRECATED": 20,
        "ALLSPARK_LORA_NUM_EXCEED_LIMIT_ERROR": 21, "ALLSPARK_LORA_RANK_EXCEED_LIMIT_ERROR": 22,
        "ALLSPARK_LORA_NOT_FOUND": 23, "ALLSPARK_LORA_ALREADY_LOADED": 24, "ALLSPARK_LORA_IN_USE": 25,
        "ALLSPARK_STREAMING": 200}


def test_other_enums():
    assert [(s.name, int(s)) for s in GenerateRequestStatus] == [
        ("Init", 0), ("ContextFinished", 1), ("Generating", 2), ("GenerateFinished", 3),
        ("GenerateInterrupted", 4), ("InternalError", 5)]
    assert [(m.name, int(m)) for m in AsCacheMode] == [
        ("AsCacheDefault", 0), ("AsCacheQuantI8", 1), ("AsCacheQuantU4", 2)]
    assert [d.name for d in TargetDevice] == ["CPU", "CPU_NUMA"]
    assert (RoPEScaleMethod.NO_SCALE.value, RoPEScaleMethod.YaRN.value, RoPEScaleMethod.NTK.value) == (0, 3, 4)


# ---- GeneratedElements, RequestStatInfo ----------------------------------------------------------

def test_request_stat_info_keys_and_attributes():
    info = RequestStatInfo({"time_to_first_token": 12.5, "context_token_length": 7})
    assert set(info) == {k.value for k in RequestStatInfo.Key}
    assert info.time_to_first_token == 12.5 and info.context_token_length == 7
    assert info.generated_token_length == 0 and info.finish_time == info["finished_time"] == 0
    assert info[RequestStatInfo.Key.KEY_TTFT_MS.value] == 12.5
    assert RequestStatInfo.from_dict(info.to_dict()) == info and type(info.to_dict()) is dict
    with pytest.raises(AttributeError, match="ttft"):
        info.ttft


# ---- PromptTemplate ------------------------------------------------------------------------------

def test_chatml_template():
    expected = ("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
                "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant ")
    assert PromptTemplate.apply_chatml_template("What is the capital of France?") == expected
    assert PromptTemplate.apply_chatml_template(["a", "b"])[1].startswith("<|im_start|>system\n")
    assert "<|im_start|>system\nBe brief.<|im_end|>" in PromptTemplate.apply_chatml_template("x", "Be brief.")
    with pytest.raises(TypeError, match="str"):
        PromptTemplate.apply_chatml_template(5)


def _tokenizer(chat_template):
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from transformers import PreTrainedTokenizerFast
    tok = Tokenizer(WordLevel({"<unk>": 0, "hi": 1}, unk_token="<unk>"))
    return PreTrainedTokenizerFast(tokenizer_object=tok, chat_template=chat_template)


def test_chat_template_of_the_tokenizer():
    template = ("{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}</s>{% endfor %}"
                "{% if add_generation_prompt %}<assistant>{% endif %}")
    tok = _tokenizer(template)
    assert PromptTemplate.apply_chat_template(tok, "hi") == "<user>hi</s><assistant>"
    assert PromptTemplate.apply_chat_template(tok, ["hi"], system_prompt="S") == [
        "<system>S</s><user>hi</s><assistant>"]
    with pytest.raises(ValueError, match="no chat template"):
        PromptTemplate.apply_chat_template(_tokenizer(None), "hi")


# ---- the package ---------------------------------------------------------------------------------

def test_contract_names_are_exported():
    eager = ["AsModelRuntimeConfigBuilder", "ASGenerationConfigBuilder", "TargetDevice", "AsCacheMode",
             "AsStatus", "GenerateRequestStatus", "GeneratedElements", "ResultQueue", "RequestStatInfo",
             "PromptTemplate", "RoPEScaleMethod", "ModelState"]
    lazy = ["Engine", "ClientEngine", "HuggingFaceModel", "GGUFModel", "DashInferModel",
            "ModelSerializerException"]
    for name in eager:
        assert getattr(allspark, name) is not None
    assert set(eager + lazy) <= set(allspark.__all__) and set(lazy) <= set(dir(allspark))


def test_lazy_names_fail_with_a_clear_import_error(monkeypatch):
    monkeypatch.setitem(allspark._LAZY, "Missing", "dashinfer_client.no_such_module")
    with pytest.raises(ImportError, match="dashinfer_client.Missing comes from dashinfer_client.no_such_module"):
        allspark.Missing
    with pytest.raises(AttributeError, match="Nonexistent"):
        allspark.Nonexistent


def test_lazy_name_resolves_and_is_cached(monkeypatch):
    monkeypatch.setitem(allspark._LAZY, "DEFAULT_SYSTEM_PROMPT", "dashinfer_client.prompt")
    monkeypatch.delitem(allspark.__dict__, "DEFAULT_SYSTEM_PROMPT", raising=False)
    assert allspark.DEFAULT_SYSTEM_PROMPT == "You are a helpful assistant."
    assert "DEFAULT_SYSTEM_PROMPT" in allspark.__dict__
    monkeypatch.delitem(allspark.__dict__, "DEFAULT_SYSTEM_PROMPT")


def test_import_is_light():
    code = ("import sys, dashinfer_client as a\n"
            "a.ASGenerationConfigBuilder().build(); a.ResultQueue().push(1)\n"
            "heavy = [m for m in ('grpc', 'torch', 'transformers', 'dashinfer_server') if m in sys.modules]\n"
            "print(heavy)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         cwd=__file__.rsplit("/tests/", 1)[0])
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
