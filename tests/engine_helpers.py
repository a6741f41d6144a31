"""Helpers of the engine tests: greedy configs, draining a request, transformers references whose
K/V are rounded like the engine's cache. The fixtures (`api_engine`, `serialized_tiny`) live in
tests/conftest.py; import these by name (`from tests.engine_helpers import collect, greedy`).
"""
import contextlib

import numpy as np

from dashinfer_client import ASGenerationConfigBuilder, GenerateRequestStatus

FINAL = (GenerateRequestStatus.GenerateFinished, GenerateRequestStatus.GenerateInterrupted)
API_CONTEXT = 8192  # long enough for a model whose KV pool is smaller than one max_length request
API_MAX_BATCH = 16
# How AsCacheDefault stores K/V of an fp32 model.
DEFAULT_KV_FORMAT = "fp32"


def greedy(max_length, **options) -> ASGenerationConfigBuilder:
    """A greedy generation config that ignores eos unless told otherwise."""
    settings = dict(do_sample=False, max_length=max_length, early_stopping=False, top_k=0)
    settings.update(options)
    return ASGenerationConfigBuilder(seed=1).update(settings)


def collect(queue, timeout_s=120.0):
    """Every GeneratedElements of a request until Get returns None -> (ids, elements)."""
    ids, elements = [], []
    while True:
        ele = queue.GetWithTimeout(timeout_s * 1000)
        if ele is None:
            if queue.GenerateStatus() in FINAL:
                return ids, elements
            raise AssertionError(f"no news from the request for {timeout_s} s: {queue!r}")
        ids += ele.ids_from_generate
        elements.append(ele)


def hf_greedy(model, prompt, n, process=None, kv_format=DEFAULT_KV_FORMAT):
    """Greedy ids of a transformers model whose K/V are rounded like the engine's cache, so that
    near-ties are decided alike; recomputes the whole sequence each step (tiny models only).
    process(logits float64 [V], tokens so far list) may penalize the logits in place."""
    import torch
    tokens = list(prompt)
    out = []
    saved, model.config._attn_implementation = model.config._attn_implementation, "eager"
    with torch.no_grad(), cache_rounding(kv_format):
        for _ in range(n):
            logits = model(torch.tensor([tokens])).logits[0, -1].double().numpy()
            if process is not None:
                process(logits, tokens)
            token = int(np.argmax(logits))
            tokens.append(token)
            out.append(token)
    model.config._attn_implementation = saved
    return out


def round_like_cache(x, fmt):
    """x (torch float32 [..., head_dim]) rounded per vector as the KV cache stores it
    (native/kv_cache.c: bf16; int8 symmetric, scale amax/127; uint4 asymmetric over min..max)."""
    import torch
    if fmt == "fp32":
        return x
    if fmt == "bf16":
        return x.bfloat16().to(x.dtype)
    if fmt == "int8":
        s = x.abs().amax(-1, keepdim=True) / 127.0
        safe = torch.where(s > 0, s, torch.ones_like(s))
        return torch.round(x / safe).clamp(-127, 127) * s
    lo, hi = x.amin(-1, keepdim=True), x.amax(-1, keepdim=True)
    s = (hi - lo) / 15.0
    s = torch.where(s > 0, s, torch.where(lo != 0, lo.abs(), torch.ones_like(lo)))
    z = -lo / s
    return (torch.round(x / s + z).clamp(0, 15) - z) * s


@contextlib.contextmanager
def cache_rounding(fmt):
    """Within: transformers' eager attention (LLaMA, Qwen2) sees K/V rounded like the cache."""
    from transformers.models.llama import modeling_llama
    from transformers.models.qwen2 import modeling_qwen2
    saved = {m: m.eager_attention_forward for m in (modeling_llama, modeling_qwen2)}

    def wrap(original):
        def attention(module, query, key, value, *args, **kwargs):
            return original(module, query, round_like_cache(key, fmt), round_like_cache(value, fmt),
                            *args, **kwargs)
        return attention
    try:
        for module, original in saved.items():
            module.eager_attention_forward = wrap(original)
        yield
    finally:
        for module, original in saved.items():
            module.eager_attention_forward = original

