"""The decoder forward of the LLaMA / Qwen2 families on one rank's shard, over the C kernels.

Pre-norm blocks; the residual stream `res` is updated by the fused add of rms_norm.
Row-parallel outputs (o_proj, down_proj) are completed by the group's allreduce; the
vocabulary-sharded logits are gathered on rank 0. Every buffer is allocated once, for the
largest step, and steps use leading slices of them.

The layers run in one native call (K.decoder_run) when the group's allreduce is native too
(one rank, or shared memory); else op by op from Python (_layers), the same kernels in the
same order, with MPI's allreduce between them.
"""
import math

import numpy as np

from dashinfer_server.rope import rope_cos_sin, rope_inv_freq

from . import kernels as K
from .kv_cache import KVCache
from .parallel import LocalGroup, Shard
from .plan import StepPlan
from .weights import WeightLoader, drop_mapped_pages

# The embedding table is read in place from the model file's mapping: the rows a step looks up
# stay resident. After a step of at least this many tokens they are dropped again (~0.5 ms),
# so prompts do not pile up a copy of the table (56 MB for SmolLM2) in resident memory.
EMBEDDING_DROP_TOKENS = 64
KV_ARRAYS = ("k_cache", "v_cache", "k_scale", "v_scale", "k_zero", "v_zero")


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
        self.cos_sin = rope_cos_sin(rope_inv_freq(d, cfg.rope_theta, cfg.rope_scaling),
                                    cfg.max_position_embeddings)
        self.kv = KVCache(kv_mode, cfg.num_hidden_layers, num_blocks, kv_heads, block_size, d)
        # attention's keyword arguments per layer, built once: the caches and their scales/zeros
        self.kv_args = [{n: a for n, a in self.kv.layer(i).items() if not n.endswith("cache")}
                        for i in range(cfg.num_hidden_layers)]
        self.ws = Workspace(max_tokens, max_seqs, cfg.hidden_size, heads * d, kv_heads * d, inter,
                            vocab_r, cfg.vocab_size)
        self.scale = 1.0 / math.sqrt(d)
        self.fused = fused
        # The kernel module forward() calls: a profiler may put a timing wrapper here (bench/
        # engine.py --profile); read once per step, so it costs nothing when left alone.
        self.kernels = K
        self.bind_native()

    def bind_native(self) -> None:
        """(Re)build the native decoder over the weights, KV cache and workspace arrays as they
        are now (it holds those very arrays: call again after replacing one)."""
        ws = self.ws
        self.native = K.decoder_new(
            [(layer.input_norm, layer.post_norm, layer.q, layer.k, layer.v, layer.o, layer.gate_up,
              layer.down, layer.q_bias, layer.k_bias, layer.v_bias,
              *(self.kv.layer(i).get(name) for name in KV_ARRAYS))
             for i, layer in enumerate(self.weights.layers)],
            (ws.res, ws.h, ws.o, ws.q, ws.k, ws.v, ws.attn, ws.gate_up, ws.act), self.cos_sin,
            self.heads, self.cfg.rms_norm_eps, self.scale)

    def forward(self, plan: StepPlan) -> np.ndarray:
        """Run the step; on rank 0 return the logits [S, V] of plan.sample_rows (a view into
        the workspace, valid until the next step)."""
        K = self.kernels
        w, ws, eps = self.weights, self.ws, self.cfg.rms_norm_eps
        t = plan.num_tokens
        if t > self.max_tokens:
            raise ValueError(f"step of {t} tokens exceeds the workspace of {self.max_tokens}")
        res, h, o = ws.res[:t], ws.h[:t], ws.o[:t]
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
            linear(h, layer.gate_up, None, gate_up)
            K.silu_mul(gate_up, act)
            linear(act, layer.down, None, o)
            allreduce_(o)
