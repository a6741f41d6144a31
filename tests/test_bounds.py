"""bench/bounds.py: the flops it counts against the weights transformers builds, and the decode
bounds against their definitions worked by hand."""
import pytest

from bench import bounds
from tests.helpers import tiny_config


def meta_model(arch, **overrides):
    """(ModelConfig, transformers' model of it on the meta device) of a tiny config."""
    import torch
    from transformers import AutoModelForCausalLM
    from dashinfer_client.model.arch import normalize_hf_config
    config = tiny_config(arch, **overrides)
    with torch.device("meta"):
        return normalize_hf_config(config.to_dict())[1], AutoModelForCausalLM.from_config(config)


@pytest.fixture(scope="module")
def qwen2():
    return meta_model("qwen2", uneven=True)


def test_flops_are_two_per_linear_weight(qwen2):
    import torch
    config, model = qwen2
    layer_weights = sum(m.weight.numel() for m in model.model.layers.modules() if isinstance(m, torch.nn.Linear))
    assert bounds.layer_flops_per_token(config) == 2 * layer_weights
    assert bounds.head_flops(config) == 2 * model.lm_head.weight.numel()
    assert bounds.flops_per_token(config) == 2 * (layer_weights + model.lm_head.weight.numel())


def test_a_token_computes_the_router_and_its_top_k_experts():
    """A sparse layer's flops: its router, top_k of its experts (transformers' 3-D expert tensors)
    and the dense layers' MLP (Qwen3-MoE's mlp_only_layers)."""
    import torch
    config, model = meta_model("qwen3_moe")
    active = 0
    for layer in model.model.layers:
        active += sum(m.weight.numel() for m in layer.self_attn.modules() if isinstance(m, torch.nn.Linear))
        if hasattr(layer.mlp, "experts"):
            experts = layer.mlp.experts
            per_expert = (experts.gate_up_proj.numel() + experts.down_proj.numel()) // config.num_experts
            active += layer.mlp.gate.weight.numel() + config.num_experts_per_tok * per_expert
        else:
            active += sum(m.weight.numel() for m in layer.mlp.modules() if isinstance(m, torch.nn.Linear))
    assert bounds.layer_flops_per_token(config) == 2 * active


def test_a_prompt_computes_logits_once_and_causal_attention(qwen2):
    config, _ = qwen2
    n = 10
    # token i attends to i + 1 positions: q.k and p.v, 2 flops per multiply-add, every query head
    attention = sum(2 * 2 * config.num_attention_heads * config.head_dim * (i + 1) for i in range(n))
    want = n * bounds.layer_flops_per_token(config) + config.num_hidden_layers * attention + bounds.head_flops(config)
    assert bounds.prompt_flops(config, n) == pytest.approx(want)
    assert bounds.prefill_bound(config, n, 100.0) == pytest.approx(n * 100e9 / want)


def test_decode_window_counts_the_prompts_prefilled_inside_it(qwen2):
    config, _ = qwen2
    flops, layers = bounds.flops_per_token(config), bounds.layer_flops_per_token(config)
    peak, bw, nbytes = 1.0, 1e9, 1.0  # GFLOP/s, GB/s (bytes negligible): compute binds
    # every prompt prefilled before the window opens: the window is its decodes alone
    before = 1000 * layers / (peak * 1e9)
    bound, kind = bounds.decode_window_bound(80, 10, 1000, before, nbytes, config, bw, peak)
    assert kind == "bf16 peak"
    assert bound == pytest.approx(peak * 1e9 / flops)  # = decode_bound of any rows, compute-bound
    # half of them left: the window also computes 500 prompt tokens
    bound, _ = bounds.decode_window_bound(80, 10, 1000, before / 2, nbytes, config, bw, peak)
    assert bound == pytest.approx(80 / ((80 * flops + 500 * layers) / (peak * 1e9)))


def test_decode_window_of_a_batch_is_the_step_bound_when_bandwidth_binds(qwen2):
    config, _ = qwen2
    flops = bounds.flops_per_token(config)
    nbytes, bw, peak = 3e9, 40.0, 1e6  # a step reads 3 GB at 40 GB/s: 75 ms, compute free
    bound, kind = bounds.decode_window_bound(8 * 127, 127, 512, 10.0, nbytes, config, bw, peak)
    assert kind == "bw" and bound == pytest.approx(8 / 0.075)
    assert bound == pytest.approx(bounds.decode_bound(8, nbytes, flops, bw, peak)[0])


def test_total_bound(qwen2):
    config, _ = qwen2
    peak = 1.0
    work = 300 * bounds.layer_flops_per_token(config) + 3 * bounds.head_flops(config) + 27 * bounds.flops_per_token(config)
    got = bounds.total_bound(300, 30, 3, 10, 1.0, config, 1e9, peak)
    assert got == pytest.approx(30 / (work / 1e9))
