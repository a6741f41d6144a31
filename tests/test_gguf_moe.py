"""Mixture-of-experts GGUF files in llama.cpp's layout (tests/gguf_moe.py writes them from a tiny
random checkpoint transformers wrote): logits within 1e-3 of transformers' on that checkpoint and
its greedy tokens; a quantized stack's experts dequantized one by one as the gguf package
dequantizes the whole stack; routers and expert layouts this runtime does not compute refused by
their key or tensor name."""
import numpy as np
import pytest

from dashinfer_client import AsCacheMode
from dashinfer_client.errors import ModelSerializerException
from dashinfer_client.model import DashInferModel, GGUFModel
from tests.engine_helpers import DEFAULT_KV_FORMAT, engine_logits, make_loop, reference
from tests.gguf_builders import build_tiny_gguf
from tests.helpers import load_hf_model
from tests.test_families import TOLERANCE, prompt_of

# Qwen3-MoE with its middle layer dense (a layer without a router keeps ffn_gate/up/down), Qwen2-MoE
# with its shared expert, Mixtral as llama.cpp writes it (general.architecture llama, Q/K permuted)
CASES = {"qwen3_moe": "qwen3moe", "qwen2_moe": "qwen2moe", "mixtral": "llama", "olmoe": "olmoe", "glm4_moe": "glm4moe",
         "minimax_m2": "minimax-m2", "ernie4_5_moe": "ernie4_5-moe", "granitemoe": "granitemoe"}


def _converted(gguf_path, out_dir):
    GGUFModel(str(gguf_path), "g", user_set_data_type="float32", progress=False).load_model() \
        .serialize_to_path(None, str(out_dir))
    return DashInferModel(str(out_dir), "g")


@pytest.mark.parametrize("name", CASES)
def test_moe_gguf_gives_transformers_logits_and_tokens(tmp_path, tiny_checkpoint, name):
    import gguf
    hf_dir = tiny_checkpoint(name)
    gguf_path = build_tiny_gguf(tmp_path / f"{name}.gguf", hf_dir)
    reader = gguf.GGUFReader(str(gguf_path))
    assert reader.fields["general.architecture"].contents() == CASES[name]
    assert any(t.name.endswith(".ffn_gate_exps.weight") for t in reader.tensors)
    model = _converted(gguf_path, tmp_path / "out")
    assert model.architecture == name and model.config.num_experts > 0
    hf = load_hf_model(hf_dir)
    hf.config._attn_implementation = "eager"
    assert model.config.num_experts == (getattr(hf.config, "num_experts", None) or hf.config.num_local_experts)
    assert model.config.norm_topk_prob == bool(getattr(hf.config, "norm_topk_prob", True))
    prompt = prompt_of(model, 30, seed=11)
    forced, plain, _ = reference(hf, prompt, DEFAULT_KV_FORMAT)
    got, _ = engine_logits(make_loop(model, AsCacheMode.AsCacheDefault), prompt, forced)
    assert list(np.argmax(got[:-1], axis=1)) == forced
    assert np.abs(got - plain).max() < TOLERANCE


def test_quantized_expert_stack_dequantizes_per_expert_as_gguf_does(tmp_path, tiny_checkpoint):
    """Q8_0 experts: each expert's weight read out of the stack equals the gguf package's
    dequantization of the whole stack, row for row."""
    import gguf
    from gguf.quants import dequantize
    gguf_path = build_tiny_gguf(tmp_path / "q.gguf", tiny_checkpoint("qwen2_moe"), quant_type="Q8_0")
    loader = GGUFModel(str(gguf_path), "q", user_set_data_type="float32", progress=False).load_model()
    stacks = {t.name: t for t in gguf.GGUFReader(str(gguf_path)).tensors}
    for proj in ("gate", "up", "down"):
        t = stacks[f"blk.1.ffn_{proj}_exps.weight"]
        assert t.tensor_type == gguf.GGMLQuantizationType.Q8_0
        whole = dequantize(t.data, t.tensor_type)
        for e in range(whole.shape[0]):
            w, _ = loader.weights.fetch(f"model.layers.1.mlp.experts.{e}.{proj}_proj.weight")
            np.testing.assert_array_equal(w, whole[e])


def _edited_gguf(tmp_path, tiny_checkpoint, edit):
    """The qwen2_moe tiny GGUF rewritten with edit(metadata dict, tensors dict) applied."""
    import gguf
    src = build_tiny_gguf(tmp_path / "src.gguf", tiny_checkpoint("qwen2_moe"))
    reader = gguf.GGUFReader(src)
    meta = {k: f for k, f in reader.fields.items() if not k.startswith("GGUF.")}
    tensors = {t.name: np.array(t.data) for t in reader.tensors}
    extra = {}
    edit(extra, tensors)
    writer = gguf.GGUFWriter(str(tmp_path / "edited.gguf"), "qwen2moe")
    for key, field in meta.items():
        if key == "general.architecture":
            continue
        kind = field.types[0]
        if kind == gguf.GGUFValueType.ARRAY:
            writer.add_array(key, field.contents())
        else:
            writer.add_key_value(key, field.contents(), kind)
    for key, (value, kind) in extra.items():
        writer.add_key_value(key, value, kind)
    for name, data in tensors.items():
        writer.add_tensor(name, data)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return str(tmp_path / "edited.gguf")


U32, F32 = 4, 6  # gguf.GGUFValueType.UINT32 / FLOAT32


@pytest.mark.parametrize("edit, refused", [
    (lambda m, t: m.update({"qwen2moe.expert_gating_func": (2, U32)}), "expert_gating_func 2 is not softmax"),
    (lambda m, t: m.update({"qwen2moe.expert_weights_scale": (2.5, F32)}), "expert_weights_scale = 2.5"),
    (lambda m, t: m.update({"qwen2moe.expert_group_count": (4, U32)}), "expert_group_count = 4"),
    (lambda m, t: [t.pop(f"blk.{i}.ffn_{p}_shexp.weight") for i in (0, 1) for p in ("gate", "up", "down")],
     "gives a shared expert .* but no layer has its ffn_.*_shexp tensors"),
    (lambda m, t: t.update({"blk.0.exp_probs_b.bias": np.zeros(8, np.float32)}),
     "blk.0.exp_probs_b.bias .a router bias. is an expert layout this loader does not know for qwen2moe"),
    (lambda m, t: t.update({"blk.0.ffn_gate_up_exps.weight": np.concatenate(
        [t.pop("blk.0.ffn_gate_exps.weight"), t.pop("blk.0.ffn_up_exps.weight")], axis=1)}),
     "blk.0.ffn_gate_up_exps.weight"),
])
def test_unknown_router_or_expert_layout_is_refused_by_name(tmp_path, tiny_checkpoint, edit, refused):
    path = _edited_gguf(tmp_path, tiny_checkpoint, edit)
    with pytest.raises(ModelSerializerException, match=refused):
        GGUFModel(path, "x", user_set_data_type="float32", progress=False).load_model()
