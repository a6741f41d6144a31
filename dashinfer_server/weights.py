"""A rank's weights: its shard of every tensor, sliced from the serialized model and packed
into the kernels' layout in memory this process touches first (so it lands on its NUMA node).

The serialized tensors are read from a memory mapping of the .asparam file; once a linear is
packed, its source pages are dropped from this process (madvise DONTNEED: the file stays in the
page cache, the process's resident memory does not keep a second copy of every weight).

Packed linears then move side by side into 2 MiB-aligned mappings advised to use transparent
huge pages (HugePageArena). numpy advises huge pages only for arrays of 4 MiB or more: SmolLM2's
per-layer weights (0.1-3.5 MiB each, 200 of its 256 MiB) sat on 4 KiB pages, and a decode step
that streams every weight then takes a TLB miss every 4 KiB and its prefetchers stop at each
page border.
"""
import mmap
from dataclasses import dataclass

import numpy as np

from dashinfer_client.dtypes import from_bf16, to_bf16
from dashinfer_client.model.families import family
from dashinfer_client.model.families.fused_experts import MXFP4_PARTS
from dashinfer_client.model.quant import PARTS, PER_CHANNEL, uniform_groups
from dashinfer_client.model.safetensors_io import drop_mapped_pages

from . import kernels as K
from .moe import ExpertWeights, load_experts
from .shard import Shard


@dataclass
class LayerWeights:
    """One layer's shard, by the names native/decoder.c takes. A norm or bias the family does not
    have is None (families/base.py: the four norm roles)."""
    attn_norm: np.ndarray | None      # [H] f32: before attention
    attn_out_norm: np.ndarray | None  # [H] f32: on attention's output (Gemma, OLMo2)
    mlp_norm: np.ndarray | None       # [H] f32: before the MLP
    mlp_out_norm: np.ndarray | None   # [H] f32: on the MLP's output
    q_norm: np.ndarray | None         # [D] per head, or this rank's [heads_r*D] of a whole-projection norm
    k_norm: np.ndarray | None         # [D], or [kv_heads_r*D]
    q: np.ndarray                     # packed [heads_r*D, H]
    k: np.ndarray                     # packed [kv_heads_r*D, H]
    v: np.ndarray
    q_bias: np.ndarray | None
    k_bias: np.ndarray | None
    v_bias: np.ndarray | None
    o: np.ndarray                     # packed [H, heads_r*D]  (row-parallel: partial sums)
    o_bias: np.ndarray | None         # [H], on rank 0 only (the allreduce adds it once)
    gate_up: np.ndarray | None        # packed [2*I_r, H]: gate rows, then up rows (None in a sparse layer)
    gate_up_bias: np.ndarray | None   # [2*I_r]
    down: np.ndarray | None           # packed [H, I_r]     (row-parallel: partial sums)
    down_bias: np.ndarray | None      # [H], on rank 0 only
    sinks: np.ndarray | None = None   # [heads_r] f32: attention sink logits of this rank's heads (gpt-oss)
    act_params: np.ndarray | None = None  # [4] f32: a plain MLP's xielu (alpha_p, alpha_n, beta, eps) as applied
    attn_norm_bias: np.ndarray | None = None  # [H] f32: a LayerNorm's bias (StarCoder2, Nemotron)
    mlp_norm_bias: np.ndarray | None = None
    moe: ExpertWeights | None = None  # a sparse layer's router and experts, in place of gate_up / down


@dataclass
class ModelWeights:
    embedding: np.ndarray    # [V, H] f32 or bf16 bits (replicated)
    layers: list
    final_norm: np.ndarray   # [H] f32
    lm_head: np.ndarray      # packed [V_r, H]
    final_norm_bias: np.ndarray | None = None  # [H] f32: a LayerNorm's bias


HUGE_PAGE = 2 << 20
ARENA_CHUNK = 256 << 20  # bytes mapped at a time; pages never written stay unmapped


class HugePageArena:
    """Arrays copied side by side (64-byte aligned) into anonymous mappings advised to use
    transparent huge pages, each mapping's used part starting on a 2 MiB border."""

    def __init__(self):
        self.buf, self.offset, self.end = None, 0, 0

    def copy(self, a: np.ndarray) -> np.ndarray:
        out = self.empty(a.shape, a.dtype)
        out[...] = a
        return out

    def empty(self, shape, dtype) -> np.ndarray:
        """An array of the arena, not yet written."""
        size = int(np.prod(shape))
        n = -(-size * np.dtype(dtype).itemsize // 64) * 64
        if self.buf is None or self.offset + n > self.end:
            mapped = max(ARENA_CHUNK, n) + HUGE_PAGE
            self.buf = mmap.mmap(-1, mapped, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
            if hasattr(mmap, "MADV_HUGEPAGE"):
                self.buf.madvise(mmap.MADV_HUGEPAGE)
            self.offset = -np.frombuffer(self.buf, np.uint8, count=1).ctypes.data % HUGE_PAGE
            self.end = mapped
        out = np.frombuffer(self.buf, dtype, count=size, offset=self.offset).reshape(shape)
        self.offset += n
        return out


def _float(t: np.ndarray) -> np.ndarray:
    """A float tensor as the kernels take it: f32 stays, bf16 bits stay, f16 -> f32."""
    return t.astype(np.float32) if t.dtype == np.float16 else t


def _scaled_float(w: np.ndarray, scale: float) -> np.ndarray:
    """A float weight times scale, in its own dtype (bf16 bits stay bf16, rounded once)."""
    scaled = _as_f32(w) * np.float32(scale)
    return to_bf16(scaled) if w.dtype == np.uint16 else scaled


def _as_f32(t: np.ndarray) -> np.ndarray:
    return from_bf16(t) if t.dtype == np.uint16 else np.asarray(t, np.float32)


class WeightLoader:
    def __init__(self, model, shard: Shard):
        self.model, self.shard = model, shard
        self.family = family(model.architecture)
        self.names = set(model.tensor_names())
        quant = model.quantization or {}
        self.wtype = {"int8": "i8", "uint4": "u4"}.get(quant.get("weight_format"))
        self.activate_quant = quant.get("compute_method") == "activate_quant"
        self._read = []  # tensors read since the last release_read()
        self.arena = HugePageArena()

    def tensor(self, name):
        t = self.model.tensor(name)
        self._read.append(t)
        return t

    def release_read(self) -> None:
        """Drop the mapped pages of every tensor read so far from this process."""
        for t in self._read:
            drop_mapped_pages(t)
        self._read = []

    def vector(self, name, rows=None) -> np.ndarray:
        t = self.tensor(name)
        return np.ascontiguousarray(_as_f32(t if rows is None else t[rows[0]:rows[1]]))

    def slices(self, base, rows=None, cols=None) -> tuple:
        """(codes or float weight, scales, zeros, row scales) of base's [rows, cols] slice; the
        rest None for a float weight, zeros None for MXFP4 (blocks, e8m0 scales), row scales
        None but for uint4 (quant.PARTS)."""
        r = slice(*rows) if rows else slice(None)
        if f"{base}.weight.{MXFP4_PARTS[0]}" in self.names:  # blocks (2 k a byte), e8m0 scales, no zeros
            c0, c1 = cols or (0, self.tensor(f"{base}.weight.{MXFP4_PARTS[1]}").shape[1] * 32)
            if c0 % 32 or c1 % 32:
                raise ValueError(f"{base}: shard columns {c0}:{c1} split an MXFP4 block of 32")
            blocks, scales = (self.tensor(f"{base}.weight.{p}") for p in MXFP4_PARTS)
            return (np.ascontiguousarray(blocks[r, c0 // 2:c1 // 2]),
                    np.ascontiguousarray(scales[r, c0 // 32:c1 // 32]), None, None)
        if f"{base}.weight.qweight" not in self.names:
            w = _float(self.tensor(f"{base}.weight"))
            return np.ascontiguousarray(w[r, slice(*cols) if cols else slice(None)]), None, None, None
        u4 = self.wtype == "u4"
        q, s, z, *row_scales = (self.tensor(f"{base}.weight.{p}") for p, _ in PARTS["uint4" if u4 else "int8"])
        per_byte = 2 if u4 else 1
        k = q.shape[1] * per_byte
        c0, c1 = cols or (0, k)
        if c0 % per_byte or c1 % per_byte:
            raise ValueError(f"{base}: shard columns {c0}:{c1} split a byte of two uint4 codes")
        group_size = self.model.quantization["group_size"]
        if group_size == PER_CHANNEL:
            # w = (q - zero) * scale with one (scale, zero) a row: any columns of the row are a group
            # of their own under it, and the ranks' partial sums (zero term included: zero * scale
            # times the rank's own x) add up to the row's (no per-row constant to count once)
            groups = slice(None)
        else:
            # a ragged last group (the group does not divide k) is served in equal groups that do
            s, z, group = uniform_groups(s, z, k, group_size)
            if c0 % group or c1 % group:
                served = "" if group == group_size else f", served in groups of {group} on input size {k}"
                raise ValueError(f"{base}: shard columns {c0}:{c1} split a quantization group (group_size "
                                 f"{group_size}{served})")
            groups = slice(c0 // group, c1 // group)
        return (np.ascontiguousarray(q[r, c0 // per_byte:c1 // per_byte]),
                np.ascontiguousarray(s[r, groups]), np.ascontiguousarray(z[r, groups]),
                np.ascontiguousarray(row_scales[0][r]) if u4 else None)

    def linear(self, *parts, **options) -> np.ndarray:
        """One linear packed from parts (base, rows, cols) stacked along the output rows, in the
        arena; options as packed() takes them."""
        return self.arena.copy(self.packed(*parts, **options))

    def stacked(self, linears, **options) -> np.ndarray:
        """Linears of one shape (each a tuple of parts) packed side by side: row j of a uint8
        [len(linears), stride] array of the arena holds linear j (native/moe.h's experts)."""
        first = self.packed(*linears[0], **options)
        out = self.arena.empty((len(linears), -(-first.nbytes // 64) * 64), np.uint8)
        out[0, :first.nbytes] = first
        for j, parts in enumerate(linears[1:], 1):
            packed = self.packed(*parts, **options)
            out[j, :packed.nbytes] = packed
        return out

    def packed(self, *parts, quantize_float=False, scale=1.0, f32=False) -> np.ndarray:
        """Pack one linear from parts (base, rows, cols) stacked along the output rows.
        quantize_float: a float weight of a quantized model is quantized to int8 here.
        scale: the weight times a constant (a float weight's values, a quantized one's scales).
        f32: a float weight packed in fp32 whatever its dtype (a router's logits)."""
        pieces = [self.slices(*p) for p in parts]
        w = np.concatenate([p[0] for p in pieces]) if len(pieces) > 1 else pieces[0][0]
        if pieces[0][1] is not None and pieces[0][2] is None:  # MXFP4, packed as stored
            if scale != 1.0:
                raise ValueError(f"{parts[0][0]}: an MXFP4 weight cannot be scaled by {scale}")
            packed = K.pack_linear(w, "mxfp4", 32, np.concatenate([p[1] for p in pieces]))
            self.release_read()
            return packed
        if f32:
            w = _as_f32(w)
        if scale != 1.0 and pieces[0][1] is None:
            w = _scaled_float(w, scale)
        elif scale != 1.0 and pieces[0][3] is not None:  # uint4: the row scales carry the scales' factor
            pieces = [(c, s, z, rows * np.float32(scale)) for c, s, z, rows in pieces]
        elif scale != 1.0:
            pieces = [(c, s * np.float32(scale), z, rows) for c, s, z, rows in pieces]
        if pieces[0][1] is None and quantize_float and self.wtype:
            group = head_group(self.model.quantization["group_size"], w.shape[1])
            codes, *params = K.quantize(w, group, HEAD_BITS)
            self.release_read()  # the float head's pages go before its packed copy is made (151936 x 2048: 0.6 GB)
            packed = K.pack_linear(codes, quantized_wtype("i8" if HEAD_BITS == 8 else "u4", group), group, *params)
        elif pieces[0][1] is None:
            packed = K.pack_linear(w, "bf16" if w.dtype == np.uint16 else "f32")
        else:
            params = [np.concatenate([p[i] for p in pieces]) for i in (1, 2)]
            if pieces[0][3] is not None:
                params.append(np.concatenate([p[3] for p in pieces]))
            k = w.shape[1] * (2 if self.wtype == "u4" else 1)
            group = k // params[0].shape[1]
            packed = K.pack_linear(w, quantized_wtype(self.wtype, group, self.activate_quant), group, *params)
        self.release_read()
        return packed

    def bias(self, base, rows=None, offset=0) -> np.ndarray | None:
        name = f"{base}.bias"
        if name not in self.names:
            return None
        r = (0, self.model.tensor(name).shape[0]) if rows is None else rows
        return self.vector(name, (r[0] + offset, r[1] + offset))

    def norm(self, name, rows=None) -> np.ndarray:
        """An RMSNorm weight as the kernel multiplies by it (Gemma's stored w - 1 made 1 + w)."""
        w = self.vector(name, rows)
        return w + np.float32(self.family.norm_offset) if self.family.norm_offset else w

    def load(self) -> ModelWeights:
        cfg, shard, fam = self.model.config, self.shard, self.family
        d = cfg.head_dim
        h0, h1 = shard.heads
        kv0, kv1 = shard.kv_heads
        i0, i1 = shard.intermediate
        q_rows, kv_rows = (h0 * d, h1 * d), (kv0 * d, kv1 * d)
        rows = {"q": q_rows, "k": kv_rows, "v": kv_rows, "gate": (i0, i1), "up": (i0, i1)}
        first = shard.rank == 0  # a row-parallel bias is added once, by rank 0's partial sum
        # Granite scales attention's and the MLP's outputs before the residual add: folded into o and down
        out_scale = cfg.residual_multiplier
        layers = []
        for i in range(cfg.num_hidden_layers):
            p = f"model.layers.{i}"

            def part(role):  # (HF base, this rank's rows of it) of a projection
                base, offset = fam.linear(role, cfg)
                return f"{p}.{base}", (rows[role][0] + offset, rows[role][1] + offset)

            def bias(role):
                base, offset = fam.linear(role, cfg)
                return self.bias(f"{p}.{base}", rows[role], offset)

            def norm(role):
                return self.norm(f"{p}.{fam.norms[role]}.weight") if role in fam.norms else None

            def norm_bias(role):
                return self.bias(f"{p}.{fam.norms[role]}") if role in fam.norms else None

            o_base, down_base = f"{p}.self_attn.o_proj", f"{p}.mlp.down_proj"
            sparse = cfg.is_moe_layer(i)
            mlp = ("gate", "up") if fam.gated_mlp else ("up",)  # a plain MLP's "gate_up" is up alone
            mlp_biases = [] if sparse else [bias(role) for role in mlp]
            mlp_bias = np.concatenate(mlp_biases) if mlp_biases and all(b is not None for b in mlp_biases) else None
            layers.append(LayerWeights(
                attn_norm=norm("attn_in"), attn_out_norm=norm("attn_out"),
                mlp_norm=norm("mlp_in"), mlp_out_norm=norm("mlp_out"),
                q_norm=self._qk_norm(f"{p}.self_attn.q_norm.weight", q_rows),
                k_norm=self._qk_norm(f"{p}.self_attn.k_norm.weight", kv_rows),
                sinks=self.vector(f"{p}.self_attn.sinks", (h0, h1)) if fam.sinks else None,
                act_params=self._xielu(f"{p}.mlp.act_fn") if cfg.hidden_act == "xielu" else None,
                attn_norm_bias=norm_bias("attn_in"), mlp_norm_bias=norm_bias("mlp_in"),
                q=self.linear(part("q")), k=self.linear(part("k")), v=self.linear(part("v")),
                q_bias=bias("q"), k_bias=bias("k"), v_bias=bias("v"),
                o=self.linear((o_base, None, q_rows), scale=out_scale),
                o_bias=self._scaled(self.bias(o_base), out_scale) if first else None,
                gate_up=None if sparse else self.linear(*map(part, mlp)),
                gate_up_bias=mlp_bias,
                down=None if sparse else self.linear((down_base, None, (i0, i1)), scale=out_scale),
                down_bias=self._scaled(self.bias(down_base), out_scale) if first and not sparse else None,
                moe=load_experts(self, f"{p}.", out_scale) if sparse else None,
            ))
        head = "lm_head" if "lm_head.weight" in self.names or "lm_head.weight.qweight" in self.names \
            else "model.embed_tokens"
        return ModelWeights(
            embedding=np.ascontiguousarray(_float(self.tensor("model.embed_tokens.weight"))),
            layers=layers,
            final_norm=self.norm("model.norm.weight"), final_norm_bias=self.bias("model.norm"),
            # the output head (the embedding when tied) is quantized whenever the layers are
            # (HEAD_BITS): in bf16 it is 15% of Qwen2-1.5B's bytes and would cap the decode
            # speed-up at 1.6x (int8) / 2.4x (uint4); the embedding lookup stays exact on the bf16 table
            lm_head=self.linear((head, shard.vocab), quantize_float=True),
        )

    def _xielu(self, base):
        """xIELU's parameters as the activation applies them (transformers' XIELUActivation):
        softplus(alpha_p), beta + softplus(alpha_n), beta, eps."""
        ap, an, beta, eps = (self.vector(f"{base}.{n}").reshape(-1)[0] for n in ("alpha_p", "alpha_n", "beta", "eps"))
        softplus = lambda v: np.log1p(np.exp(v, dtype=np.float32), dtype=np.float32)  # noqa: E731
        return np.array([softplus(ap), beta + softplus(an), beta, eps], np.float32)

    def _qk_norm(self, name, rows):
        """A q/k norm weight: the same [D] for every head, or this rank's slice of a whole one."""
        if self.family.qk_norm is None or not self.model.config.use_qk_norm:
            return None
        return self.norm(name, rows if self.family.qk_norm == "whole" else None)

    @staticmethod
    def _scaled(v, scale):
        return v if v is None or scale == 1.0 else v * np.float32(scale)


# Bits of a float head quantized at load. int8 under uint4 layers too: on the default model
# (python -m bench.quality) a 4-bit head in groups of 32 costs +1.8% next-token NLL against bf16
# where an int8 head costs +0.1%, and it turned the first answer to "What is the capital of
# France?" wrong on CPUs without VNNI (fp32 activations); its price is the head's extra bytes,
# a few % of a uint4 decode step from 1.5B parameters up (bench/bounds.py counts them).
HEAD_BITS = 8
# An int8 head's group: the largest of these that divides its width. 128 takes 8.25 bits a weight
# with i8q's fp16 pairs where groups of 32 took 9 (Qwen3-30B-A3B's head: 320 MB a token against
# 350); on the default model (576 columns: 64) +0.10% NLL against groups of 32's +0.11%.
HEAD_GROUPS = (128, 64, 32)


def head_group(group_size: int, k: int) -> int:
    """The group of a head quantized at load: per channel (K) under a per-channel model; else for
    int8 the first of HEAD_GROUPS dividing K, for a 4-bit head the model's group (K where that
    does not divide K)."""
    if group_size == -1:
        return k
    if HEAD_BITS == 8:
        return next((g for g in HEAD_GROUPS if k % g == 0), k)
    return k if k % group_size else group_size


def quantized_wtype(wtype: str, group: int, activate_quant: bool = False) -> str:
    """i8/u4 codes computed with int8 activations (i8q/u4q, native/linear.h) where that is the
    faster kernel here and the group is whole blocks of 32; else exact. With VNNI both are
    (~2x/3x faster than bf16 at decode); on AVX2 alone u4q is (vpmaddubsw, 1.3-1.7x exact u4's
    GEMV) and exact i8 is not slower. activate_quant (DashInfer's A8W8, checked at serialization:
    groups of whole blocks) asks for int8 activations on every CPU; a rank's columns of a
    per-channel weight that are not whole blocks (a small MLP's or head_dim's split) stay exact."""
    path = K.linear_q8_path()
    faster = path == "vnni" or (path == "avx2" and wtype == "u4")
    return wtype + "q" if (faster or activate_quant) and group % 32 == 0 else wtype
