"""What the machine allows a workload: the bound each engine figure is printed against.

A decode step of B rows streams every linear weight once (bytes at the read bandwidth) and does
2 flops per weight per row (at the bf16 peak): the step lasts at least the longer of the two,
so decode tok/s <= B / max(bytes / bw, B * flops / peak). Prefill is compute-bound:
tok/s <= peak / flops per token, and requests arriving together get their first tokens no sooner
than shortest first at that rate. Attention and the elementwise kernels are left out (a few %
at these context lengths): the bound is optimistic, a fraction is honest.
"""
from dashinfer_server.weights import head_group

LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def weight_bytes_per_token(model) -> int:
    """Bytes of linear weights (codes, scales and zeros when quantized) and of the lm_head one
    decode step reads, from the serialized model's tensors (the packed layout adds only
    padding to 16 columns)."""
    names = set(model.tensor_names())
    bases = [f"model.layers.{i}.{'self_attn' if p[1:] == '_proj' else 'mlp'}.{p}.weight"
             for i in range(model.config.num_hidden_layers) for p in LINEARS]
    head = "lm_head.weight" if any(n.startswith("lm_head.weight") for n in names) else "model.embed_tokens.weight"
    total = 0
    for base in bases:
        parts = [base] if base in names else [base + s for s in (".qweight", ".scales", ".zeros")]
        total += sum(model.tensor(p).nbytes for p in parts)
    if head in names and model.quantization:  # a float head of a quantized model is int8 in memory
        n, k = model.tensor(head).shape      # (dashinfer_server/weights.py): codes + scale, zero
        group = head_group(model.quantization["group_size"], k)
        return total + n * k + 8 * n * (k // group)
    parts = [head] if head in names else [head + s for s in (".qweight", ".scales", ".zeros")]
    return total + sum(model.tensor(p).nbytes for p in parts)


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


def attention_flops(config, context: float) -> float:
    """Flops of one token's attention over `context` cached tokens, every layer: q.k and the
    weighted v, 2 flops per value each."""
    return 4.0 * config.num_hidden_layers * config.num_attention_heads * config.head_dim * context


def kv_bytes_per_token(config, kv_format: str) -> int:
    """Bytes of K and V (codes and scales) one decode step reads per cached token, every layer."""
    from dashinfer_server.kv_cache import bytes_per_block
    return bytes_per_block(kv_format, config.num_hidden_layers, config.num_key_value_heads, 1,
                           config.head_dim)
