"""Helpers of the engine tests: greedy configs, draining a request, transformers references whose
K/V are rounded like the engine's cache. The fixtures (`api_engine`, `serialized_tiny`) live in
tests/conftest.py; import these by name (`from tests.engine_helpers import collect, greedy`).
"""
import contextlib

import numpy as np

from dashinfer_client import ASGenerationConfigBuilder, AsModelRuntimeConfigBuilder, GenerateRequestStatus

FINAL = (GenerateRequestStatus.GenerateFinished, GenerateRequestStatus.GenerateInterrupted)
API_CONTEXT = 8192  # long enough for a model whose KV pool is smaller than one max_length request
API_MAX_BATCH = 16
# How AsCacheDefault stores K/V of an fp32 model.
DEFAULT_KV_FORMAT = "fp32"
# transformers' modeling modules whose eager attention cache_rounding wraps
HF_MODULES = ("llama", "mistral", "ministral", "ministral3", "cohere", "cohere2", "arcee", "apertus", "nemotron", "starcoder2", "qwen2", "qwen3", "granite", "olmo2", "olmo3", "smollm3", "exaone4", "glm4", "ernie4_5", "seed_oss", "granitemoehybrid", "hunyuan_v1_dense", "helium", "phi3", "gemma2", "gemma3", "qwen3_moe",
              "qwen2_moe", "mixtral", "olmoe", "glm4_moe", "ernie4_5_moe", "dots1", "granitemoe", "minimax_m2", "hunyuan_v1_moe")
DECODE_STEPS = 16  # tokens the logits tests decode after the prompt
BLOCK = 16         # their KV block size


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
    """Within: transformers' eager attention (every family's) sees K/V rounded like the cache."""
    import importlib
    modules = [importlib.import_module(f"transformers.models.{name}.modeling_{name}") for name in HF_MODULES]
    saved = {m: m.eager_attention_forward for m in modules}

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


def reference(hf_model, prompt, fmt):
    """(greedy continuation ids [DECODE_STEPS], plain logits, logits with K/V rounded like `fmt`),
    logits [DECODE_STEPS + 1, V] from the last prompt position on."""
    import torch
    with torch.no_grad():
        out = hf_model.generate(torch.tensor([prompt]), max_new_tokens=DECODE_STEPS, do_sample=False,
                                min_new_tokens=DECODE_STEPS, pad_token_id=0)
        full = torch.tensor([out[0].tolist()])
        plain = hf_model(full).logits[0].numpy()
        with cache_rounding(fmt):
            rounded = hf_model(full).logits[0].numpy()
    rows = slice(len(prompt) - 1, len(prompt) + DECODE_STEPS)
    return out[0, len(prompt):].tolist(), plain[rows], rounded[rows]


def engine_logits(loop, prompt, forced):
    """Run `prompt` through the loop's scheduler and model, feeding `forced` as the generated
    tokens -> (logits rows [len(forced) + 1, V], the sequence)."""
    from dashinfer_server.plan import build_plan
    from dashinfer_server.sequence import Sequence
    seq = Sequence(list(prompt), len(prompt) + len(forced) + 1)
    loop.scheduler.add(seq)
    rows = []
    while len(rows) <= len(forced):
        chunks, interrupted = loop.scheduler.schedule()
        assert not interrupted and chunks
        logits = loop.model.forward(build_plan(chunks, loop.pool.block_size))
        loop.scheduler.advance(chunks)
        sampled = [c.seq for c in chunks if c.sample]
        if not sampled:
            continue  # a prompt chunk that is not the last one
        assert sampled == [seq]
        rows.append(logits[0].copy())
        if len(rows) <= len(forced):
            seq.tokens.append(forced[len(rows) - 1])
    loop.scheduler.finish(seq)
    return np.array(rows), seq


def make_loop(model, kv_mode):
    """A loaded ModelLoop of a serialized model, stepped by hand (its thread is not started)."""
    from dashinfer_server.model_loop import ModelLoop
    cfg = (AsModelRuntimeConfigBuilder().model_name("tiny").model_dir(model.model_dir, model.prefix)
           .max_batch(4).max_length(256).max_prefill_length(16).kv_cache_span_size(BLOCK)
           .kv_cache_mode(kv_mode).build())
    loop = ModelLoop(model, cfg)
    loop.load()
    return loop
