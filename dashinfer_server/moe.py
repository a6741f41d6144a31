"""A sparse layer's mixture of experts on one rank: its share of the router and experts, loaded
(weights.py calls load_experts), and the op-by-op forward, native/moe.c's computation written
again in numpy over the linear kernels (the reference model.py's Python path runs and the tests
hold the native decoder to)."""
from dataclasses import dataclass

import numpy as np

from dashinfer_client.model.families import family


@dataclass
class ExpertWeights:
    """Named as native/decoder.c takes a sparse layer's fields (py_moe.c's DN_MOE_FIELDS)."""
    router: np.ndarray                 # packed f32 [E, H]
    experts_gate_up: np.ndarray        # uint8 [n_local, stride]: row j a packed [2*I_r, H] (gate, then up)
    experts_down: np.ndarray           # uint8 [n_local, stride]: row j a packed [H, I_r] (partial sums)
    shared_gate_up: np.ndarray | None  # packed [2*S_r, H] of the shared expert
    shared_down: np.ndarray | None     # packed [H, S_r]
    shared_gate: np.ndarray | None     # [H] f32: the shared expert's output times sigmoid(x . it); None:
    #                                    added ungated (GLM-4.5)
    router_bias: np.ndarray | None = None           # [E] f32 (gpt-oss, as the two below)
    router_choice_bias: np.ndarray | None = None    # [E] f32: picks the experts, weighs none (GLM-4.5)
    experts_gate_up_bias: np.ndarray | None = None  # [n_local, 2*I_r] f32: gate, then up
    experts_down_bias: np.ndarray | None = None     # [n_local, H] f32; of experts split by rows, rank 0's only


def load_experts(loader, prefix, out_scale=1.0) -> ExpertWeights:
    """This rank's share (shard.experts, shard.expert_rows) of the sparse block of the layer under
    `prefix` ("model.layers.{i}.")."""
    cfg, shard = loader.model.config, loader.shard
    layout = family(loader.model.architecture).experts
    rows = shard.expert_rows(cfg.moe_intermediate_size)
    gate_up = [((layout.expert(prefix, e, "gate"), rows), (layout.expert(prefix, e, "up"), rows))
               for e in shard.experts]
    down = [((layout.expert(prefix, e, "down"), None, rows),) for e in shard.experts]
    shared = {}
    if cfg.shared_expert_intermediate_size:
        s_rows = shard.rows_of(cfg.shared_expert_intermediate_size)
        shared = dict(
            shared_gate_up=loader.linear((layout.shared_name(prefix, "gate"), s_rows),
                                         (layout.shared_name(prefix, "up"), s_rows)),
            shared_down=loader.linear((layout.shared_name(prefix, "down"), None, s_rows), scale=out_scale),
            shared_gate=loader.vector(layout.shared_name(prefix, "gate_weight") + ".weight").reshape(-1)
            if layout.shared_gate else None)
    if layout.choice_bias:
        shared["router_choice_bias"] = loader.vector(layout.choice_bias_name(prefix)).reshape(-1)
    if layout.biases:
        # a whole expert's down bias is its rank's to add; rows split, rank 0 adds it once
        down_bias = shard.expert_split == "experts" or shard.rank == 0
        def bias(e, role, rows=None):
            return loader.vector(f"{layout.expert(prefix, e, role)}.bias", rows)

        shared.update(
            router_bias=loader.vector(layout.router_name(prefix) + ".bias"),
            experts_gate_up_bias=np.stack([np.concatenate([bias(e, "gate", rows), bias(e, "up", rows)])
                                           for e in shard.experts]),
            experts_down_bias=np.stack([bias(e, "down") * np.float32(out_scale) for e in shard.experts])
            if down_bias else None)
    return ExpertWeights(router=loader.linear((layout.router_name(prefix),), f32=True),
                         experts_gate_up=loader.stacked(gate_up), experts_down=loader.stacked(down, scale=out_scale),
                         **{"shared_gate_up": None, "shared_down": None, "shared_gate": None, **shared})


def routing(logits: np.ndarray, cfg, choice_bias=None) -> tuple[np.ndarray, np.ndarray]:
    """(experts [T, k], weights [T, k]) of router logits [T, E]: the top k scores (cfg.expert_scoring's:
    a softmax over all experts or each one's sigmoid), chosen by score + choice_bias where there is
    one, best first; their scores renormalised to sum to 1 when norm_topk_prob, times
    routed_scaling_factor (fp32, as transformers' routers compute it)."""
    if cfg.expert_scoring == "sigmoid":
        p = np.float32(1) / (np.float32(1) + np.exp(-logits))
    else:
        p = np.exp(logits - logits.max(axis=1, keepdims=True))
        p /= p.sum(axis=1, keepdims=True)
    choice = np.argsort(-(p if choice_bias is None else p + choice_bias), axis=1, kind="stable")[:, :cfg.num_experts_per_tok]
    weight = np.take_along_axis(p, choice, axis=1)
    if cfg.norm_topk_prob:
        weight /= weight.sum(axis=1, keepdims=True)
    return choice, weight * np.float32(cfg.routed_scaling_factor)


def moe_forward(K, w: ExpertWeights, x, out, cfg, experts, act) -> None:
    """out [T, H] = this rank's part of the block over x [T, H]: experts (a range of expert ids)
    are the rank's, row j of w's expert arrays holding experts[j]."""
    logits = np.empty((x.shape[0], cfg.num_experts), np.float32)
    K.linear(x, w.router, w.router_bias, logits)
    choice, weight = routing(logits, cfg, w.router_choice_bias)
    out[...] = 0
    for j, e in enumerate(experts):
        tokens, slots = np.nonzero(choice == e)
        if len(tokens):  # an expert no token chose is not read
            y = _gated_mlp(K, x[tokens], w.experts_gate_up[j], w.experts_down[j], act,
                           *(None if b is None else b[j] for b in (w.experts_gate_up_bias, w.experts_down_bias)))
            out[tokens] += weight[tokens, slots, None] * y  # a token chooses an expert once
    if w.shared_gate_up is not None:
        y = _gated_mlp(K, x, w.shared_gate_up, w.shared_down, act)
        out += y if w.shared_gate is None else y / (np.float32(1) + np.exp(-(x @ w.shared_gate)))[:, None]


def _gated_mlp(K, x, gate_up, down, act, gate_up_bias=None, down_bias=None):
    inter = K.unpack_linear(gate_up)[1] // 2
    h, a = np.empty((len(x), 2 * inter), np.float32), np.empty((len(x), inter), np.float32)
    if gate_up_bias is None:
        K.linear_glu(np.ascontiguousarray(x), gate_up, h, a, act=act)
    else:  # the bias joins before the activation
        K.glu_mul(K.linear(np.ascontiguousarray(x), gate_up, gate_up_bias), a, act=act)
    return K.linear(a, down, down_bias)
