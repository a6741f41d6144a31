"""OLMo 3: OLMo 2's layer with sliding-window layers (three to one full layer by default) and RoPE
per layer type: the full layers' (YaRN in the long-context releases), the sliding layers' unscaled."""
from ..rope_scaling import rope_of
from .base import Family
from .olmo2 import OLMO2

DEFAULT_THETA = 500_000.0  # Olmo3Config.default_theta


def rope_parameters(hf):
    """config.json's RoPE per layer type as transformers 5's Olmo3Config reads either spelling: the
    full layers' from rope_parameters, updated by a rope_scaling, with rope_theta; the sliding
    layers' from rope_parameters alone (a top-level rope_theta is the full layers': the config
    class takes it once), else the default base."""
    given = hf.get("rope_parameters") or {}
    full = dict(given.get("full_attention") or {"rope_type": "default"})
    full.update(hf.get("rope_scaling") or {})
    full.setdefault("rope_theta", hf.get("rope_theta") or DEFAULT_THETA)
    sliding = dict(given.get("sliding_attention") or {"rope_type": "default"})
    sliding.setdefault("rope_theta", DEFAULT_THETA)
    return {"full_attention": full, "sliding_attention": sliding}


def _olmo3(hf, r):
    layers = r.need("num_hidden_layers")
    # a window wider than the context is kept: the sliding layers' RoPE may still differ
    types, window = r.window(r.layer_types(layers, lambda i: "sliding_attention" if (i + 1) % 4 else "full_attention"),
                             keep_wide=True)
    head_dim = r.get("head_dim") or r.need("hidden_size") // r.need("num_attention_heads")
    rope = dict(hf, rope_parameters=rope_parameters(hf))
    fields = dict(OLMO2.read_config(hf, r), layer_types=types, sliding_window=window)
    fields["rope_theta"], fields["rope_scaling"] = rope_of(rope, head_dim, "full_attention")
    fields["rope_local_theta"], scaling = rope_of(rope, head_dim, "sliding_attention")
    if scaling is not None:
        r.refuse(f"RoPE scaling on the sliding layers ({scaling})")
    return fields


OLMO3 = Family("olmo3", ("Olmo3ForCausalLM",), ("olmo3",), _olmo3, qk_norm=OLMO2.qk_norm, norms=dict(OLMO2.norms),
               config_defaults={"sliding_window": 4096})
