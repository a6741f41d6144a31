"""Fixtures and helpers shared by the engine tests.

`api_engine` yields (engine, model_name, loader) for a started tiny LLaMA: the model-independent
API tests are written against it and the public API only, so they run unchanged against every
engine that offers DashInfer's API (the in-process Engine now; the ClientEngine later).
Import this module from a test module (`from tests.engine_fixtures import *`) to get them.
"""
import contextlib
import os

import numpy as np
import pytest

import dashinfer_client as allspark
from dashinfer_client import ASGenerationConfigBuilder, GenerateRequestStatus
from tests.helpers import build_tiny_model

__all__ = ["api_engine", "tiny_checkpoint", "serialized_tiny", "greedy", "collect", "hf_greedy",
           "ENGINE_KINDS", "API_CONTEXT", "API_MAX_BATCH", "FINAL",
           "DEFAULT_KV_FORMAT", "round_like_cache", "cache_rounding"]

FINAL = (GenerateRequestStatus.GenerateFinished, GenerateRequestStatus.GenerateInterrupted)
ENGINE_KINDS = ["engine", "client"]  # in-process, and ClientEngine over gRPC to a spawned server
API_CONTEXT = 8192  # long enough for a model whose KV pool is smaller than one max_length request
API_MAX_BATCH = 16
# How AsCacheDefault stores K/V of an fp32 model.
DEFAULT_KV_FORMAT = "fp32"


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory):
    """tiny_checkpoint(arch, **config) -> directory of a random fp32 Hugging Face model, built once
    per session and configuration."""
    built = {}

    def get(arch="llama", **config):
        key = (arch, tuple(sorted(config.items())))
        if key not in built:
            out = tmp_path_factory.mktemp(f"tiny-{arch}")
            built[key] = build_tiny_model(str(out / "hf"), arch=arch, dtype="float32", **config)
        return built[key]
    return get


@pytest.fixture(scope="session")
def serialized_tiny(tiny_checkpoint):
    """serialized_tiny(arch, **config) -> a HuggingFaceModel loader whose model is serialized
    (float32 weights) beside its checkpoint, once per configuration."""
    loaders = {}

    def get(arch="llama", **config):
        key = (arch, tuple(sorted(config.items())))
        if key not in loaders:
            hf_dir = tiny_checkpoint(arch, **config)
            loader = allspark.HuggingFaceModel(hf_dir, f"tiny-{arch}", user_set_data_type="float32",
                                               progress=False)
            loader.load_model().read_model_config().serialize_to_path(
                None, os.path.join(os.path.dirname(hf_dir), "serialized")).free_model()
            loaders[key] = loader
        return loaders[key]
    return get


def _make_engine(kind):
    if kind == "engine":
        return allspark.Engine()
    if kind == "client":
        return allspark.ClientEngine(startup_timeout=120)
    raise ValueError(f"unknown engine kind {kind!r}")


@pytest.fixture(scope="module", params=ENGINE_KINDS)
def api_engine(request, serialized_tiny):
    """(engine, model_name, loader): a tiny LLaMA (fp32 weights, context 8192) installed and
    started with max_batch 16 and max_length 512. Tests may install more models from `loader`
    (loader.create_reference_runtime_config_builder) on the same engine."""
    loader = serialized_tiny("llama", max_position_embeddings=API_CONTEXT)
    engine = _make_engine(request.param)
    name = "tiny-api"
    cfg = (loader.create_reference_runtime_config_builder(name, allspark.TargetDevice.CPU, [0],
                                                          max_batch=API_MAX_BATCH)
           .max_length(512).kv_cache_span_size(16).build())
    assert engine.install_model(cfg) == allspark.AsStatus.ALLSPARK_SUCCESS
    assert engine.start_model(name) == allspark.AsStatus.ALLSPARK_SUCCESS
    yield engine, name, loader
    engine.release_model(name)
    if request.param == "client":
        engine.close()


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

