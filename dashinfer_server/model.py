"""The decoder forward of every model family on one rank's shard, over the C kernels.

What a layer computes is native/decoder.h's comment; which norms, biases, q/k norms, windows and
soft-caps a model uses come from its family (dashinfer_client/model/families/) and config.
The residual stream `res` is updated by the fused add of rms_norm where a norm follows.
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

from dashinfer_client import settings
from dashinfer_client.model.families import family
from dashinfer_client.model.safetensors_io import drop_mapped_pages
from dashinfer_server.rope import identity_table, query_scales, rope_table

from . import kernels as K
from . import op_profile
from .cpu_share import CpuShare
from .group import LocalGroup
from .kv_cache import KVCache, bytes_per_block
from .moe import moe_forward
from .plan import StepPlan
from .shard import Shard
from .weights import WeightLoader


def expert_split() -> str:
    """How this group spreads a sparse layer's experts (shard.py), DASHINFER_MOE_SPLIT: every rank
    reads the same environment."""
    return settings.get("DASHINFER_MOE_SPLIT")


# The embedding table is read in place from the model file's mapping: the rows a step looks up
# stay resident. After a step of at least this many tokens they are dropped again (~0.5 ms),
# so prompts do not pile up a copy of the table (56 MB for SmolLM2) in resident memory.
EMBEDDING_DROP_TOKENS = 64


def _plain_act(u, name, params):
    """A plain MLP's activation of u (native/elementwise.c's dn_act_rows): relu2 (Arcee, Nemotron),
    xielu (Apertus, params: alpha_p, alpha_n, beta, eps as applied), gelu_tanh (StarCoder2)."""
    if name == "relu2":
        return np.square(np.maximum(u, np.float32(0)))
    if name == "xielu":
        ap, an, beta, eps = params
        return np.where(u > 0, ap * u * u + beta * u, (np.expm1(np.minimum(u, eps)) - u) * an + beta * u)
    z = u * (np.float32(1.5957691216057308) + np.float32(0.07135481627260025) * u * u)  # glu.h's GELU_Z1, Z3
    return u / (np.float32(1) + np.exp(-z))


class Workspace:
    """Activation buffers for up to `max_tokens` tokens and `max_seqs` sampled rows."""

    def __init__(self, max_tokens, max_seqs, hidden, q_width, kv_width, inter, vocab_r, vocab, parallel=False):
        f = lambda *shape: np.zeros(shape, np.float32)  # noqa: E731
        self.res, self.h, self.o = f(max_tokens, hidden), f(max_tokens, hidden), f(max_tokens, hidden)
        if parallel:  # a parallel block's MLP output beside the attention's (native/decoder.h)
            self.o2 = f(max_tokens, hidden)
        self.q, self.attn = f(max_tokens, q_width), f(max_tokens, q_width)
        self.k, self.v = f(max_tokens, kv_width), f(max_tokens, kv_width)
        self.gate_up, self.act = f(max_tokens, 2 * inter), f(max_tokens, inter)
        self.norm_ss = f(max_tokens, 2)  # q's and k's sums of squares of a whole-projection norm
        self.last = f(max_seqs, hidden)
        self.logits_r = f(max_seqs, vocab_r)
        self.logits = f(max_seqs, vocab) if vocab != vocab_r else self.logits_r


class DecoderModel:
    def __init__(self, model, kv_mode: str, num_blocks: int, block_size: int, max_tokens: int,
                 max_seqs: int, group=None, fused: bool = True, max_positions: int | None = None):
        """fused False: always run the layers op by op from Python (the reference the tests
        hold the native decoder to). max_positions: the served context (the rope tables' rows;
        it picks longrope's factors); default the model's max_position_embeddings."""
        self.group = group or LocalGroup()
        cfg = self.cfg = model.config
        self.shard = Shard(self.group.rank, self.group.world, cfg.num_attention_heads,
                           cfg.num_key_value_heads, cfg.intermediate_size, cfg.vocab_size,
                           intermediate_align=max(64, (model.quantization or {}).get("group_size") or 1),
                           num_experts=cfg.num_experts, expert_split=expert_split())
        self.weights = WeightLoader(model, self.shard).load()
        d = cfg.head_dim
        heads = self.shard.heads[1] - self.shard.heads[0]
        kv_heads = self.shard.kv_heads[1] - self.shard.kv_heads[0]
        inter = self.shard.intermediate[1] - self.shard.intermediate[0]
        shared = self.shard.rows_of(cfg.shared_expert_intermediate_size) if cfg.shared_expert_intermediate_size else (0, 0)
        self.shared_inter = shared[1] - shared[0]
        vocab_r = self.shard.vocab[1] - self.shard.vocab[0]
        self.heads, self.kv_heads = heads, kv_heads
        self.max_tokens = max_tokens
        self.family = family(model.architecture)
        self.rot_dim = cfg.rotary_dim or d
        max_positions = max_positions or cfg.max_position_embeddings
        table = rope_table(d, self.rot_dim, cfg.rope_theta, cfg.rope_scaling, max_positions)
        # Gemma 3's sliding layers rotate with a base of their own, unscaled
        local = table if cfg.rope_local_theta is None else rope_table(d, self.rot_dim, cfg.rope_local_theta,
                                                                      None, max_positions)
        # a layer without positional encoding (SmolLM3's NoPE layers) rotates by cos 1, sin 0: exactly nothing
        nope = identity_table(self.rot_dim, max_positions) if cfg.nope_layers else None
        self.cos_sin = [nope if i in (cfg.nope_layers or ()) else local if cfg.layer_window(i) else table
                        for i in range(cfg.num_hidden_layers)]
        self.windows = [cfg.layer_window(i) for i in range(cfg.num_hidden_layers)]
        self.q_scale = None if cfg.query_scale_beta is None else \
            query_scales(cfg.query_scale_beta, cfg.query_scale_period, max_positions)
        self.kv = KVCache(kv_mode, cfg.num_hidden_layers, num_blocks, kv_heads, block_size, d)
        # attention's keyword arguments per layer, built once: the caches and their scales/zeros
        self.kv_args = [{n: a for n, a in arrays.items() if not n.endswith("cache")}
                        | dict(group=self.shard.group, q_head0=self.shard.q_head0) for arrays in self.kv.layers]
        self.ws = Workspace(max_tokens, max_seqs, cfg.hidden_size, heads * d, kv_heads * d, inter,
                            vocab_r, cfg.vocab_size, parallel=self.family.parallel_block)
        self.scale = cfg.attention_scale or 1.0 / math.sqrt(d)
        # a whole-projection q/k norm spans every rank's heads: the widths it divides by, and
        # whether this rank's first kv head is summed by the rank before (which also holds it)
        self.qk_whole = self.family.qk_norm == "whole"
        self.qk_totals = (cfg.num_attention_heads * d, cfg.num_key_value_heads * d)
        self.k_shared_first = self.shard.q_head0 != 0
        self.embedding_multiplier = np.float32(cfg.embedding_multiplier)
        self.fused = fused
        self.cpu_share = CpuShare()
        # The kernel module forward() calls: a profiler may put a timing wrapper here (bench/
        # engine.py --profile); read once per step, so it costs nothing when left alone.
        self.kernels = K
        self.bind_native()

    def bind_native(self) -> None:
        """(Re)build the native decoder over the weights, KV cache and workspace arrays as they
        are now (it holds those very arrays: call again after replacing one)."""
        # each layer by name: its LayerWeights fields (a sparse layer's experts among them), its KV
        # cache arrays, rope table and window
        layers = [dict({k: v for k, v in vars(weights).items() if k != "moe"}, **(vars(weights.moe) if weights.moe else {}),
                       **cache, cos_sin=cos_sin, window=window) for weights, cache, cos_sin, window
                  in zip(self.weights.layers, self.kv.layers, self.cos_sin, self.windows)]
        cfg, experts = self.cfg, self.shard.experts
        self.native = K.decoder_new(
            layers, vars(self.ws), self.heads, cfg.rms_norm_eps, self.scale, self.shard.group,
            self.shard.q_head0, softcap=cfg.attn_logit_softcap or 0.0, act=cfg.hidden_act,
            rot_dim=self.rot_dim, qk_whole=int(self.qk_whole), q_total=self.qk_totals[0],
            k_total=self.qk_totals[1], k_shared_first=int(self.k_shared_first),
            n_experts=cfg.num_experts, top_k=cfg.num_experts_per_tok, norm_topk=int(cfg.norm_topk_prob),
            expert0=experts.start if experts else 0, expert_step=experts.step if experts else 1,
            shared_inter=self.shared_inter, qk_after_rope=int(self.family.qk_norm_after_rope),
            scoring=cfg.expert_scoring, routed_scale=cfg.routed_scaling_factor, q_scale=self.q_scale,
            layer_norm=int(self.family.layer_norm), parallel=int(self.family.parallel_block),
            gated=int(self.family.gated_mlp))

    def forward(self, plan: StepPlan, score=None) -> np.ndarray:
        """Run the step; on rank 0 return the logits [S, V] of plan.sample_rows (a view into
        the workspace, valid until the next step). The logits of plan.score_rows come first, as
        many rows at a time as the sampled rows' workspace holds, each slice handed to
        score(first row, logits [n, V]) on rank 0 (prompt_logprobs.StepScores)."""
        K = self.kernels
        w, ws = self.weights, self.ws
        t = plan.num_tokens
        if t > self.max_tokens:
            raise ValueError(f"step of {t} tokens exceeds the workspace of {self.max_tokens}")
        res, o = ws.res[:t], ws.o[:t]
        self.cpu_share.adapt()  # the kernel threads follow the cores other processes leave
        K.embedding(plan.token_ids, w.embedding, res)
        if self.embedding_multiplier != 1.0:
            res *= self.embedding_multiplier
        if t >= EMBEDDING_DROP_TOKENS:
            drop_mapped_pages(w.embedding)
        native = self.group.native_allreduce() if self.fused else None
        if native is not None:
            K.decoder_run(self.native, plan.positions, plan.slots, plan.block_tables, plan.q_offsets,
                          plan.context_lens, *native)
        else:
            self._layers(plan)
        width = len(ws.last)
        for first in range(0, len(plan.score_rows), width):
            logits = self._head(plan.score_rows[first:first + width], res, o, last=False)
            if score is not None:
                score(first, logits)
        return self._head(plan.sample_rows, res, o)

    def _head(self, rows, res, o, last=True) -> np.ndarray:
        """The logits of the step's `rows` (at most the workspace's sampled rows) on rank 0:
        final norm, lm_head, the vocabulary shards gathered (last: the step's last gather)."""
        K, w, ws = self.kernels, self.weights, self.ws
        s = len(rows)
        last_h, h = ws.last[:s], ws.h[:s]
        np.take(o, rows, axis=0, out=last_h)
        np.take(res, rows, axis=0, out=h)
        K.rms_norm(last_h, w.final_norm, self.cfg.rms_norm_eps, last_h, residual=h, centered=self.family.layer_norm,
                   bias=w.final_norm_bias)
        K.linear(last_h, w.lm_head, None, ws.logits_r[:s])
        self.group.gather_vocab(ws.logits_r[:s], ws.logits[:s], last=last)
        logits = ws.logits[:s]
        if self.cfg.logits_multiplier != 1.0:
            logits *= np.float32(self.cfg.logits_multiplier)
        if self.cfg.final_logit_softcap:
            cap = np.float32(self.cfg.final_logit_softcap)
            np.tanh(logits / cap, out=logits)
            logits *= cap
        return logits

    def _layers(self, plan: StepPlan) -> None:
        """The layers op by op: the reference the tests hold K.decoder_run to (and the path of an
        MPI group whose allreduce is not native), written as native/decoder.h describes a layer."""
        K = self.kernels
        w, ws, eps = self.weights, self.ws, self.cfg.rms_norm_eps
        t, d = plan.num_tokens, self.cfg.head_dim
        res, h, o = ws.res[:t], ws.h[:t], ws.o[:t]
        q, k, v, attn = ws.q[:t], ws.k[:t], ws.v[:t], ws.attn[:t]
        gate_up, act = ws.gate_up[:t], ws.act[:t]
        # per-head views, built once per step, so the loop below only calls
        q3, attn3 = q.reshape(t, self.heads, d), attn.reshape(t, self.heads, d)
        k3, v3 = k.reshape(t, self.kv_heads, d), v.reshape(t, self.kv_heads, d)
        positions, slots, scale = plan.positions, plan.slots, self.scale
        softcap = self.cfg.attn_logit_softcap or 0.0
        tables, q_offsets, context_lens = plan.block_tables, plan.q_offsets, plan.context_lens
        linear, rms_norm, allreduce_ = K.linear, K.rms_norm, self.group.allreduce_
        centered = self.family.layer_norm  # LayerNorms (Cohere, StarCoder2, Nemotron)

        def sublayer_input(norm, prev, bias=None):  # norm(res + prev), or res += prev without a norm
            if norm is None:
                if prev is not None:
                    res[...] += prev
                return res
            rms_norm(res if prev is None else prev, norm, eps, h, centered=centered, bias=bias,
                     **({} if prev is None else {"residual": res}))
            return h

        for i, layer in enumerate(w.layers):
            x = sublayer_input(layer.attn_norm, o if i else None, layer.attn_norm_bias)
            linear(x, layer.q, layer.q_bias, q)
            linear(x, layer.k, layer.k_bias, k)
            linear(x, layer.v, layer.v_bias, v)
            if layer.q_norm is not None and not self.family.qk_norm_after_rope:
                self._qk_norm(layer, q, k, q3, k3, t)
            K.rope(q3, k3, positions, self.cos_sin[i])
            if layer.q_norm is not None and self.family.qk_norm_after_rope:  # Hunyuan's order
                self._qk_norm(layer, q, k, q3, k3, t)
            if self.q_scale is not None:
                q3 *= self.q_scale[positions][:, None, None]
            cache, extra = self.kv.layers[i], self.kv_args[i]
            K.kv_write(k3, v3, slots, **cache)
            K.attention(q3, cache["k_cache"], cache["v_cache"], tables, q_offsets, context_lens,
                        attn3, scale, window=self.windows[i], softcap=softcap, sinks=layer.sinks, **extra)
            linear(attn, layer.o, layer.o_bias, o)
            if self.family.parallel_block:  # the MLP of the same input; one allreduce of the sum
                o2 = ws.o2[:t]
                self._dense_mlp(layer, x, gate_up, act, o2)
                o += o2
                allreduce_(o)
                continue
            allreduce_(o)
            if layer.attn_out_norm is not None:
                rms_norm(o, layer.attn_out_norm, eps, o)
            x = sublayer_input(layer.mlp_norm, o, layer.mlp_norm_bias)
            if layer.moe is not None:
                moe_forward(K, layer.moe, x, o, self.cfg, self.shard.experts, self.cfg.hidden_act)
            else:
                self._dense_mlp(layer, x, gate_up, act, o)
            allreduce_(o)
            if layer.mlp_out_norm is not None:
                rms_norm(o, layer.mlp_out_norm, eps, o)

    def _dense_mlp(self, layer, x, gate_up, act, out):
        """out = the layer's MLP of x (native/decoder.c's dense_mlp)."""
        K = self.kernels
        if not self.family.gated_mlp:  # plain: act(up(x)), as dn_act_rows computes it
            K.linear(x, layer.gate_up, layer.gate_up_bias, act)
            act[...] = _plain_act(act, self.cfg.hidden_act, layer.act_params)
        elif layer.gate_up_bias is None:
            K.linear_glu(x, layer.gate_up, gate_up, act, act=self.cfg.hidden_act)
        else:
            K.linear(x, layer.gate_up, layer.gate_up_bias, gate_up)
            K.glu_mul(gate_up, act, act=self.cfg.hidden_act)
        K.linear(act, layer.down, layer.down_bias, out)

    def _qk_norm(self, layer, q, k, q3, k3, t):
        """q and k through their norms (native/decoder.c's qk_norm)."""
        eps = self.cfg.rms_norm_eps
        if not self.qk_whole:
            self.kernels.rms_norm(q3.reshape(-1, q3.shape[2]), layer.q_norm, eps, q3.reshape(-1, q3.shape[2]))
            self.kernels.rms_norm(k3.reshape(-1, k3.shape[2]), layer.k_norm, eps, k3.reshape(-1, k3.shape[2]))
            return
        ss = self.ws.norm_ss[:t]
        skip = self.cfg.head_dim if self.k_shared_first else 0
        ss[:, 0] = np.einsum("ij,ij->i", q, q)
        ss[:, 1] = np.einsum("ij,ij->i", k[:, skip:], k[:, skip:])
        self.group.allreduce_(ss)
        for x, col, total, weight in ((q, 0, self.qk_totals[0], layer.q_norm), (k, 1, self.qk_totals[1], layer.k_norm)):
            x *= (np.float32(1.0) / np.sqrt(ss[:, col:col + 1] / np.float32(total) + np.float32(eps))) * weight


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
    if mc.num_experts:  # native/moe.h's scratch: probabilities, slots, gathered rows, an expert's MLP
        widest = max(mc.moe_intermediate_size, mc.shared_expert_intermediate_size)
        step += max_step_tokens(cfg) * 4 * (mc.num_experts + 4 * mc.num_experts_per_tok + 2 * mc.hidden_size + 3 * widest)
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
                        fused=not op_profile.enabled(),  # profiled: op by op on every rank
                        max_positions=cfg.max_length)
