"""What the machine allows a workload: the bound each engine figure is printed against.

A decode step of B rows streams every linear weight once (bytes at the read bandwidth) and does
2 flops per weight per row (at the bf16 peak): the step lasts at least the longer of the two,
so decode tok/s <= B / max(bytes / bw, B * flops / peak). Prefill is compute-bound:
tok/s <= peak / flops per token, and requests arriving together get their first tokens no sooner
than shortest first at that rate. Attention and the elementwise kernels are left out (a few %
at these context lengths): the bound is optimistic, a fraction is honest.
"""
from dashinfer_server import kernels as K
from dashinfer_server.weights import head_bits, head_group, quantized_wtype

K.load()  # which packed type a weight gets (quantized_wtype) depends on the CPU; a bench runs where started

LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def weight_bytes_per_token(model) -> int:
    """Bytes of linear weights and of the lm_head one decode step reads, from the serialized
    model's tensors as they are packed in memory (dashinfer_server/weights.py; the packed layout
    adds only padding to 16 columns): codes, and per group a scale and a scale*zero, fp16 pairs
    on the int8-activation path (i8q/u4q), fp32 pairs elsewhere."""
    names = set(model.tensor_names())
    bases = [f"model.layers.{i}.{'self_attn' if p[1:] == '_proj' else 'mlp'}.{p}.weight"
             for i in range(model.config.num_hidden_layers) for p in LINEARS]
    head = "lm_head.weight" if any(n.startswith("lm_head.weight") for n in names) else "model.embed_tokens.weight"
    quant = model.quantization or {}
    wtype = {"int8": "i8", "uint4": "u4"}.get(quant.get("weight_format"))
    act = quant.get("compute_method") == "activate_quant"

    def scale_bytes(t, k, group):  # of one row's groups
        return k // group * (4 if quantized_wtype(t, group, act).endswith("q") else 8)

    total = 0
    for base in bases + [head]:
        if base in names and not (base == head and wtype):
            total += model.tensor(base).nbytes
        elif base in names:  # a float head of a quantized model is quantized at load
            n, k = model.tensor(head).shape
            group = head_group(quant["group_size"], k)
            bits = head_bits(wtype, group)
            total += n * (k * bits // 8 + scale_bytes("i8" if bits == 8 else "u4", k, group))
        else:
            q, ngroups = model.tensor(base + ".qweight"), model.tensor(base + ".scales").shape[1]
            k = q.shape[1] * (2 if wtype == "u4" else 1)
            total += q.nbytes + q.shape[0] * scale_bytes(wtype, k, k // ngroups)
    return total


def flops_per_token(config) -> float:
    """2 flops per weight of every linear and of the lm_head."""
    h, d = config.hidden_size, config.head_dim
    q, kv = config.num_attention_heads * d, config.num_key_value_heads * d
    per_layer = h * q + 2 * h * kv + q * h + 3 * h * config.intermediate_size
    return 2.0 * (config.num_hidden_layers * per_layer + config.vocab_size * h)


def decode_bound(rows: int, nbytes: float, flops: float, bw_gbs: float, peak_gflops: float) -> tuple:
    """(tok/s bound of a decode step of `rows` rows, "bw" or "bf16 peak": which limit binds)."""
    t_bw, t_flops = nbytes / (bw_gbs * 1e9), rows * flops / (peak_gflops * 1e9)
    return rows / max(t_bw, t_flops), "bw" if t_bw >= t_flops else "bf16 peak"


def prefill_bound(flops: float, peak_gflops: float) -> float:
    return peak_gflops * 1e9 / flops


def ttft_bound_ms(prompt_lens, flops: float, peak_gflops: float) -> float:
    """Median time to first token of requests arriving together whose prompts run shortest first
    at the bf16 peak, nothing else in the steps: no order of the same work has a lower median
    (a request's first token needs its prompt and every prompt before it computed)."""
    import statistics
    done, firsts = 0, []
    for n in sorted(prompt_lens):
        done += n
        firsts.append(done * flops / (peak_gflops * 1e9) * 1e3)
    return statistics.median(firsts)
