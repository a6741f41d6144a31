"""The decoder forward of the LLaMA / Qwen2 families on one rank's shard, over the C kernels.

Pre-norm blocks; the residual stream `res` is updated by the fused add of rms_norm.
Row-parallel outputs (o_proj, down_proj) are completed by the group's allreduce; the
vocabulary-sharded logits are gathered on rank 0. Every buffer is allocated once, for the
largest step, and steps use leading slices of them.

The layers run in one native call (K.decoder_run) when the group's allreduce is native too
(one rank, or shared memory); else op by op from Python (_layers), the same kernels in the
same order, with MPI's allreduce between them.
"""
import logging
import math
import os

import numpy as np

from dashinfer_server.rope import rope_table

from . import kernels as K
from . import op_profile
from .cpu_share import CpuShare
from .group import LocalGroup
from .kv_cache import KVCache
from .plan import StepPlan
from .shard import Shard
from .weights import WeightLoader, drop_mapped_pages
from .kv_cache import bytes_per_block

# The embedding table is read in place from the model file's mapping: the rows a step looks up
# stay resident. After a step of at least this many tokens they are dropped again (~0.5 ms),
# so prompts do not pile up a copy of the table (56 MB for SmolLM2) in resident memory.
EMBEDDING_DROP_TOKENS = 64


class Workspace:
    """Activation buffers for up to `max_tokens` tokens and `max_seqs` sampled rows."""

    def __init__(self, max_tokens, max_seqs, hidden, q_width, kv_width, inter, vocab_r, vocab):
        f = lambda *shape: np.zeros(shape, np.float32)  # noqa: E731
        self.res, self.h, self.o = f(max_tokens, hidden), f(max_tokens, hidden), f(max_tokens, hidden)
        self.q, self.attn = f(max_tokens, q_width), f(max_tokens, q_width)
        self.k, self.v = f(max_tokens, kv_width), f(max_tokens, kv_width)
        self.gate_up, self.act = f(max_tokens, 2 * inter), f(max_tokens, inter)
        self.last = f(max_seqs, hidden)
        self.logits_r = f(max_seqs, vocab_r)
        self.logits = f(max_seqs, vocab) if vocab != vocab_r else self.logits_r


class DecoderModel:
    def __init__(self, model, kv_mode: str, num_blocks: int, block_size: int, max_tokens: int,
                 max_seqs: int, group=None, fused: bool = True):
        """fused False: always run the layers op by op from Python (the reference the tests
        hold the native decoder to)."""
        self.group = group or LocalGroup()
        cfg = self.cfg = model.config
        self.shard = Shard(self.group.rank, self.group.world, cfg.num_attention_heads,
                           cfg.num_key_value_heads, cfg.intermediate_size, cfg.vocab_size,
                           intermediate_align=max(64, (model.quantization or {}).get("group_size") or 1))
        self.weights = WeightLoader(model, self.shard).load()
        d = cfg.head_dim
        heads = self.shard.heads[1] - self.shard.heads[0]
        kv_heads = self.shard.kv_heads[1] - self.shard.kv_heads[0]
        inter = self.shard.intermediate[1] - self.shard.intermediate[0]
        vocab_r = self.shard.vocab[1] - self.shard.vocab[0]
        self.heads, self.kv_heads = heads, kv_heads
        self.max_tokens = max_tokens
        self.cos_sin = rope_table(d, d, cfg.rope_theta, cfg.rope_scaling, cfg.max_position_embeddings)
        self.kv = KVCache(kv_mode, cfg.num_hidden_layers, num_blocks, kv_heads, block_size, d)
        # attention's keyword arguments per layer, built once: the caches and their scales/zeros
        self.kv_args = [{n: a for n, a in arrays.items() if not n.endswith("cache")}
                        | dict(group=self.shard.group, q_head0=self.shard.q_head0) for arrays in self.kv.layers]
        self.ws = Workspace(max_tokens, max_seqs, cfg.hidden_size, heads * d, kv_heads * d, inter,
                            vocab_r, cfg.vocab_size)
        self.scale = 1.0 / math.sqrt(d)
        self.fused = fused
        self.cpu_share = CpuShare()
        # The kernel module forward() calls: a profiler may put a timing wrapper here (bench/
        # engine.py --profile); read once per step, so it costs nothing when left alone.
        self.kernels = K
        self.bind_native()

    def bind_native(self) -> None:
        """(Re)build the native decoder over the weights, KV cache and workspace arrays as they
        are now (it holds those very arrays: call again after replacing one)."""
        # each layer by name: its LayerWeights fields and its KV cache arrays
        layers = [dict(vars(weights), **cache) for weights, cache in zip(self.weights.layers, self.kv.layers)]
        self.native = K.decoder_new(layers, vars(self.ws), self.cos_sin, self.heads,
                                    self.cfg.rms_norm_eps, self.scale, self.shard.group, self.shard.q_head0)

    def forward(self, plan: StepPlan) -> np.ndarray:
        """Run the step; on rank 0 return the logits [S, V] of plan.sample_rows (a view into
        the workspace, valid until the next step)."""
        K = self.kernels
        w, ws, eps = self.weights, self.ws, self.cfg.rms_norm_eps
        t = plan.num_tokens
        if t > self.max_tokens:
            raise ValueError(f"step of {t} tokens exceeds the workspace of {self.max_tokens}")
        res, h, o = ws.res[:t], ws.h[:t], ws.o[:t]
        self.cpu_share.adapt()  # the kernel threads follow the cores other processes leave
        K.embedding(plan.token_ids, w.embedding, res)
        if t >= EMBEDDING_DROP_TOKENS:
            drop_mapped_pages(w.embedding)
        native = self.group.native_allreduce() if self.fused else None
        if native is not None:
            K.decoder_run(self.native, plan.positions, plan.slots, plan.block_tables, plan.q_offsets,
                          plan.context_lens, *native)
        else:
            self._layers(plan)
        s = len(plan.sample_rows)
        last = ws.last[:s]
        np.take(o, plan.sample_rows, axis=0, out=last)
        np.take(res, plan.sample_rows, axis=0, out=h[:s])
        K.rms_norm(last, w.final_norm, eps, last, residual=h[:s])
        K.linear(last, w.lm_head, None, ws.logits_r[:s])
        self.group.gather_vocab(ws.logits_r[:s], ws.logits[:s])
        return ws.logits[:s]

    def _layers(self, plan: StepPlan) -> None:
        """The layers op by op (what K.decoder_run does in one call)."""
        K = self.kernels
        w, ws, eps = self.weights, self.ws, self.cfg.rms_norm_eps
        t, d = plan.num_tokens, self.cfg.head_dim
        res, h, o = ws.res[:t], ws.h[:t], ws.o[:t]
        q, k, v, attn = ws.q[:t], ws.k[:t], ws.v[:t], ws.attn[:t]
        gate_up, act = ws.gate_up[:t], ws.act[:t]
        # per-head views, built once per step, so the loop below only calls
        q3, attn3 = q.reshape(t, self.heads, d), attn.reshape(t, self.heads, d)
        k3, v3 = k.reshape(t, self.kv_heads, d), v.reshape(t, self.kv_heads, d)
        positions, slots, cos_sin, scale = plan.positions, plan.slots, self.cos_sin, self.scale
        tables, q_offsets, context_lens = plan.block_tables, plan.q_offsets, plan.context_lens
        linear, rms_norm, allreduce_ = K.linear, K.rms_norm, self.group.allreduce_
        for i, layer in enumerate(w.layers):
            if i == 0:
                rms_norm(res, layer.input_norm, eps, h)
            else:
                rms_norm(o, layer.input_norm, eps, h, residual=res)
            linear(h, layer.q, layer.q_bias, q)
            linear(h, layer.k, layer.k_bias, k)
            linear(h, layer.v, layer.v_bias, v)
            K.rope(q3, k3, positions, cos_sin)
            cache, extra = self.kv.layers[i], self.kv_args[i]
            K.kv_write(k3, v3, slots, **cache)
            K.attention(q3, cache["k_cache"], cache["v_cache"], tables, q_offsets, context_lens,
                        attn3, scale, **extra)
            linear(attn, layer.o, None, o)
            allreduce_(o)
            rms_norm(o, layer.post_norm, eps, h, residual=res)
            K.linear_glu(h, layer.gate_up, gate_up, act, act="silu")
            linear(act, layer.down, None, o)
            allreduce_(o)


# ---- sizing: a runtime config -> this rank's decoder (rank 0's model loop and the workers) ----

log = logging.getLogger("dashinfer_server")


def kv_format(cfg, model) -> str:
    """The KV cache format of AsCacheMode cfg.kv_cache_mode for this model: the default keeps
    an fp32 model's K/V in fp32 (so its logits match the reference), any other model's in bf16."""
    mode = int(cfg.kv_cache_mode)
    if mode == 0:
        return "fp32" if model.dtype == "float32" else "bf16"
    return {1: "int8", 2: "uint4"}[mode]


# Tokens per step when max_prefill_length is 0: a step this long keeps the linear kernels at
# full speed while running decodes wait at most one such step for their next token.
DEFAULT_STEP_TOKENS = 512


def max_step_tokens(cfg) -> int:
    """Tokens one step computes at most (a prefill chunk plus the decodes beside it)."""
    return max(cfg.max_prefill_length or DEFAULT_STEP_TOKENS, cfg.max_batch + 1)


def num_kv_blocks(cfg, model, block_size) -> int:
    """KV blocks of the pool: the memory budget, or max_batch requests of max_length."""
    mc = model.config
    if cfg.kv_cache_memory_mb:
        per_block = bytes_per_block(kv_format(cfg, model), mc.num_hidden_layers,
                                    mc.num_key_value_heads, block_size, mc.head_dim)
        return max(1, cfg.kv_cache_memory_mb * 2**20 // per_block)
    return cfg.max_batch * -(-cfg.max_length // block_size)


def memory_bound(cfg, model) -> int:
    """Bytes the model's KV pool and step workspaces can reach on one rank at most (fp32
    activations of a whole step's rows: hidden states, MLP, logits), weights left out."""
    mc = model.config
    kv = num_kv_blocks(cfg, model, cfg.kv_cache_span_size) * bytes_per_block(
        kv_format(cfg, model), mc.num_hidden_layers, mc.num_key_value_heads, cfg.kv_cache_span_size, mc.head_dim)
    step = max_step_tokens(cfg) * 4 * (4 * mc.hidden_size + 2 * mc.intermediate_size + mc.vocab_size)
    return kv + step


def apply_thread_num(cfg) -> None:
    """Run the kernels on cfg.thread_num threads, at most one per cpu this process may use: a
    server rank is pinned to its NUMA node's cores, and more threads than cores only take turns."""
    if cfg.thread_num:
        cpus = len(os.sched_getaffinity(0))
        if cfg.thread_num > cpus:
            log.warning("thread_num %d exceeds the %d cpu(s) of this process: using %d",
                        cfg.thread_num, cpus, cpus)
        K.set_num_threads(min(cfg.thread_num, cpus))


def build_decoder(model, cfg, group=None) -> DecoderModel:
    """This rank's DecoderModel for the runtime config cfg. Rank 0's model loop and every worker
    build theirs here, so workspaces and KV caches agree with the plans rank 0 broadcasts."""
    block_size = cfg.kv_cache_span_size
    return DecoderModel(model, kv_format(cfg, model),
                        num_kv_blocks(cfg, model, block_size), block_size,
                        max_step_tokens(cfg), cfg.max_batch, group,
                        fused=not op_profile.enabled())  # profiled: op by op on every rank
