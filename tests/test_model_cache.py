"""resolve_model: HF directories and GGUF files converted once into the cache, serialized models used
in place, the default model by name, and clear errors for what cannot be resolved."""
import os
import subprocess
import sys

import pytest

from dashinfer_client import default_model
from dashinfer_client.errors import ModelSerializerException
from dashinfer_client.model import DashInferModel
from dashinfer_client.model_cache import resolve_model
from tests.gguf_builders import build_tiny_gguf
from tests.helpers import build_tiny_model


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    return build_tiny_model(str(tmp_path_factory.mktemp("cache-src") / "hf"))


def _graph_mtime(model_dir, prefix):
    return os.stat(os.path.join(model_dir, prefix + ".asgraph")).st_mtime_ns


def test_hf_directory_is_converted_once_and_reused(hf_dir, tmp_path):
    model_dir, prefix = resolve_model(hf_dir, dtype="float32", cache_dir=str(tmp_path))
    assert model_dir == os.path.join(str(tmp_path), "models")
    model = DashInferModel(model_dir, prefix)
    assert model.dtype == "float32" and model.quantization is None
    first = _graph_mtime(model_dir, prefix)
    assert resolve_model(hf_dir, dtype="float32", cache_dir=str(tmp_path)) == (model_dir, prefix)
    assert _graph_mtime(model_dir, prefix) == first  # reused, not rewritten
    # dtype and quantization are part of the key
    _, bf16 = resolve_model(hf_dir, cache_dir=str(tmp_path))
    _, int8 = resolve_model(hf_dir, dtype="float32", quant="int8", cache_dir=str(tmp_path))
    assert len({prefix, bf16, int8}) == 3
    assert DashInferModel(model_dir, bf16).dtype == "bfloat16"
    assert DashInferModel(model_dir, int8).quantization["weight_format"] == "int8"


def test_a_changed_source_is_converted_again(tmp_path):
    src = build_tiny_model(str(tmp_path / "hf"))
    _, before = resolve_model(src, cache_dir=str(tmp_path / "cache"))
    config = os.path.join(src, "config.json")
    st = os.stat(config)
    os.utime(config, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    _, after = resolve_model(src, cache_dir=str(tmp_path / "cache"))
    assert after != before


def test_a_source_without_a_tokenizer_is_converted_once(tmp_path):
    src = build_tiny_model(str(tmp_path / "hf"))
    for name in os.listdir(src):
        if name.startswith(("tokenizer", "special_tokens", "chat_template")):
            os.remove(os.path.join(src, name))
    model_dir, prefix = resolve_model(src, cache_dir=str(tmp_path / "cache"))
    assert DashInferModel(model_dir, prefix).graph["tokenizer"] is None
    first = _graph_mtime(model_dir, prefix)
    assert resolve_model(src, cache_dir=str(tmp_path / "cache")) == (model_dir, prefix)
    assert _graph_mtime(model_dir, prefix) == first  # reused, not converted again


def test_gguf_file_is_converted(hf_dir, tmp_path):
    gguf = build_tiny_gguf(str(tmp_path / "tiny.gguf"), hf_dir)
    model_dir, prefix = resolve_model(gguf, dtype="float32", cache_dir=str(tmp_path / "cache"))
    assert prefix.startswith("tiny-float32-")
    assert DashInferModel(model_dir, prefix).config.num_hidden_layers == 2


def test_serialized_model_is_used_in_place(hf_dir, tmp_path):
    model_dir, prefix = resolve_model(hf_dir, dtype="float32", cache_dir=str(tmp_path))
    assert resolve_model(os.path.join(model_dir, prefix + ".asgraph")) == (model_dir, prefix)
    assert resolve_model(os.path.join(model_dir, prefix), dtype="float32") == (model_dir, prefix)
    with pytest.raises(ModelSerializerException, match="float32 weights, not bfloat16"):
        resolve_model(os.path.join(model_dir, prefix), dtype="bfloat16")
    with pytest.raises(ModelSerializerException, match="quantized as None, not int8"):
        resolve_model(os.path.join(model_dir, prefix), quant="int8")
    alone = tmp_path / "alone"
    alone.mkdir()
    for ext in (".asgraph", ".asparam"):
        os.link(os.path.join(model_dir, prefix + ext), alone / (prefix + ext))
    assert resolve_model(str(alone)) == (str(alone), prefix)  # the only model of a directory


def test_several_serialized_models_need_a_prefix(hf_dir, tmp_path):
    resolve_model(hf_dir, dtype="float32", cache_dir=str(tmp_path))
    resolve_model(hf_dir, dtype="bfloat16", cache_dir=str(tmp_path))
    with pytest.raises(ModelSerializerException, match="several serialized models"):
        resolve_model(str(tmp_path / "models"))


def test_default_model_by_name_or_none():
    expected = default_model.ensure_default_model("bfloat16", progress=False)
    assert resolve_model(None) == expected
    assert resolve_model(default_model.MODEL_NAME) == expected


def test_unresolvable_paths_are_named(tmp_path):
    with pytest.raises(ModelSerializerException, match="cannot download") as hub:
        resolve_model("HuggingFaceTB/SmolLM2-135M-Instruct")
    assert "--local-dir" in str(hub.value)
    with pytest.raises(ModelSerializerException, match="does not exist"):
        resolve_model(str(tmp_path / "nowhere"))
    with pytest.raises(ModelSerializerException, match="no config.json"):
        resolve_model(str(tmp_path))
    (tmp_path / "notes.txt").write_text("hello")
    with pytest.raises(ModelSerializerException, match="not a GGUF"):
        resolve_model(str(tmp_path / "notes.txt"))
    with pytest.raises(TypeError, match="model_path"):
        resolve_model(42)
    with pytest.raises(ModelSerializerException, match="dtype 'int8'"):
        resolve_model(None, dtype="int8")


def test_two_processes_converting_at_once_agree(hf_dir, tmp_path):
    code = ("import sys; from dashinfer_client.model_cache import resolve_model; "
            "print(':'.join(resolve_model(sys.argv[1], dtype='float32', cache_dir=sys.argv[2])))")
    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    procs = [subprocess.Popen([sys.executable, "-c", code, hf_dir, str(tmp_path)], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outs = [p.communicate(timeout=300) for p in procs]
    assert all(p.returncode == 0 for p in procs), [o[1][-2000:] for o in outs]
    assert outs[0][0] == outs[1][0]
    model_dir, prefix = outs[0][0].strip().split(":")
    DashInferModel(model_dir, prefix)
    assert not [n for n in os.listdir(model_dir) if ".tmp-" in n]  # no half-written files left
