"""What the machine allows a workload: the bound each engine figure is printed against.

A decode step of B rows streams every linear weight once (bytes at the read bandwidth) and does
2 flops per weight per row (at the bf16 peak): the step lasts at least the longer of the two,
so decode tok/s <= B / max(bytes / bw, B * flops / peak). Prefill is compute-bound:
tok/s <= peak / flops per prompt token (the layers, causal attention, logits of the last token
only), and requests arriving together get their first tokens no sooner
than shortest first at that rate. Attention and the elementwise kernels are left out (a few %
at these context lengths): the bound is optimistic, a fraction is honest.
"""
from dashinfer_client.model.families import family
from dashinfer_client.model.serialized import weight_shapes
from dashinfer_server import kernels as K
from dashinfer_server import weights
from dashinfer_server.weights import head_group, quantized_wtype

K.load()  # which packed type a weight gets (quantized_wtype) depends on the CPU; a bench runs where started


def active_experts(config, rows: int) -> float:
    """The share of a sparse layer's experts a step of `rows` rows reads: each row chooses top_k of
    E, so with uniform routing 1 - (1 - top_k/E)^rows of them on average (top_k/E for one row). A
    random model's router is near uniform; a trained one's is not, which only lowers the share."""
    return 1.0 - (1.0 - config.num_experts_per_tok / config.num_experts) ** rows if config.num_experts else 1.0


def weight_bytes_per_token(model, rows: int = 1) -> float:
    """Bytes of linear weights and of the lm_head one decode step of `rows` rows reads, from the
    serialized model's tensors as they are packed in memory (dashinfer_server/weights.py; the
    packed layout adds only padding to 16 columns): codes, and per group int8's scale and
    scale*zero (fp16 pairs on the int8-activation path, i8q; fp32 pairs elsewhere) or uint4's
    two code bytes and per row its float32 scale (4.5 + 32/K bits a weight in groups of 32,
    native/linear.h); MXFP4 experts their blocks and e8m0 scales (4.25 bits a weight). Of a
    sparse layer's experts only the chosen ones count (active_experts); its router is packed fp32."""
    names = set(model.tensor_names())
    cfg = model.config
    bases = [n for n, shape in weight_shapes(cfg, model.architecture).items()
             if n.startswith("model.layers.") and len(shape) == 2]
    layout = family(model.architecture).experts
    routers = {layout.router_name(f"model.layers.{i}.") + ".weight" for i in range(cfg.num_hidden_layers)
               if cfg.is_moe_layer(i)}
    expert_share = active_experts(cfg, rows)
    head = "lm_head.weight" if any(n.startswith("lm_head.weight") for n in names) else "model.embed_tokens.weight"
    quant = model.quantization or {}
    wtype = {"int8": "i8", "uint4": "u4"}.get(quant.get("weight_format"))
    act = quant.get("compute_method") == "activate_quant"

    def param_bytes(t, k, group):  # of one row's groups, and u4's row scale
        if t == "u4":
            return k // group * 2 + 4
        return k // group * (4 if quantized_wtype(t, group, act).endswith("q") else 8)

    total = 0
    for base in bases + [head]:
        share = expert_share if ".experts." in base else 1.0
        if base in routers:
            total += model.tensor(base).size * 4
        elif base in names and not (base == head and wtype):
            total += model.tensor(base).nbytes * share
        elif base in names:  # a float head of a quantized model is quantized at load
            n, k = model.tensor(head).shape
            group = head_group(quant["group_size"], k)
            bits = weights.HEAD_BITS
            total += n * (k * bits // 8 + param_bytes("i8" if bits == 8 else "u4", k, group))
        elif base + ".mxfp4_blocks" in names:  # 4.25 bits a weight: 16 code bytes and a scale per 32
            total += (model.tensor(base + ".mxfp4_blocks").nbytes + model.tensor(base + ".mxfp4_scales").nbytes) * share
        else:
            q, ngroups = model.tensor(base + ".qweight"), model.tensor(base + ".scales").shape[1]
            k = q.shape[1] * (2 if wtype == "u4" else 1)
            total += (q.nbytes + q.shape[0] * param_bytes(wtype, k, k // ngroups)) * share
    return total


def flops_per_token(config) -> float:
    """2 flops per weight of every linear and of the lm_head: a decode token."""
    return layer_flops_per_token(config) + head_flops(config)


def layer_flops_per_token(config) -> float:
    """2 flops per weight of every linear of the layers: a prompt token, whose logits (but the
    last's) no one computes."""
    h, d = config.hidden_size, config.head_dim
    q, kv = config.num_attention_heads * d, config.num_key_value_heads * d
    attention = h * q + 2 * h * kv + q * h
    # a sparse layer: the router, a token's top_k experts and the shared expert
    sparse = h * config.num_experts + 3 * h * ((config.moe_intermediate_size or 0) * config.num_experts_per_tok
                                               + config.shared_expert_intermediate_size)
    return 2.0 * sum(attention + (sparse if config.is_moe_layer(i) else 3 * h * config.intermediate_size)
                     for i in range(config.num_hidden_layers))


def head_flops(config) -> float:
    """2 flops per weight of the lm_head: a prompt runs it for its last token only."""
    return 2.0 * config.vocab_size * config.hidden_size


def prompt_flops(config, n: int) -> float:
    """Flops of prefilling one prompt of n tokens: the layers' linears for every token, causal
    attention (q.k and p.v over the i tokens before token i, every query head) and the head once."""
    attention = 4.0 * config.num_attention_heads * config.head_dim * n * (n + 1) / 2
    return n * layer_flops_per_token(config) + config.num_hidden_layers * attention + head_flops(config)


def decode_bound(rows: int, nbytes: float, flops: float, bw_gbs: float, peak_gflops: float) -> tuple:
    """(tok/s bound of a decode step of `rows` rows, "bw" or "bf16 peak": which limit binds)."""
    t_bw, t_flops = nbytes / (bw_gbs * 1e9), rows * flops / (peak_gflops * 1e9)
    return rows / max(t_bw, t_flops), "bw" if t_bw >= t_flops else "bf16 peak"


def decode_window_bound(decode_tokens: int, steps: int, prompt_tokens: int, before_s: float,
                        nbytes: float, config, bw_gbs: float, peak_gflops: float) -> tuple:
    """(tok/s bound of decode measured from the first request's first token to the last token,
    which limit binds). That window also computes every prompt not yet prefilled when it opens:
    at most `before_s` (submission -> first token) at the bf16 peak of them were, so the rest,
    with the `decode_tokens`, is the window's compute; its `steps` (at least the longest
    request's decode steps) each read the weights once. When prompts arrive together and
    prefill first (batch8) this is decode_bound; when they are spread over the decodes (serve32)
    the window's prefill takes more of it than its decodes do."""
    peak, bw = peak_gflops * 1e9, bw_gbs * 1e9
    layers = layer_flops_per_token(config)  # a prompt token's flops, attention left out
    late_prompt = max(0.0, prompt_tokens - before_s * peak / layers)
    t_flops = (decode_tokens * flops_per_token(config) + late_prompt * layers) / peak
    t_bw = steps * nbytes / bw
    return decode_tokens / max(t_flops, t_bw), "bw" if t_bw >= t_flops else "bf16 peak"


def total_bound(prompt_tokens: int, new_tokens: int, requests: int, steps: int, nbytes: float,
                config, bw_gbs: float, peak_gflops: float) -> float:
    """new tok/s bound of a whole workload: its prompts (their layers, and the head once per
    request) and its decode tokens (every new token but each request's first) computed at the
    bf16 peak, and at least `steps` steps (the longest request's) each reading the weights once."""
    work = (prompt_tokens * layer_flops_per_token(config) + requests * head_flops(config)
            + (new_tokens - requests) * flops_per_token(config))
    return new_tokens / max(work / (peak_gflops * 1e9), steps * nbytes / (bw_gbs * 1e9))


def prefill_bound(config, n: int, peak_gflops: float) -> float:
    """Prompt tok/s of one n-token prompt at the bf16 peak (prompt_flops)."""
    return n * peak_gflops * 1e9 / prompt_flops(config, n)


def ttft_bound_ms(prompt_lens, flops: float, peak_gflops: float, head: float = 0.0) -> float:
    """Median time to first token of requests arriving together whose prompts run shortest first
    at the bf16 peak, nothing else in the steps: no order of the same work has a lower median
    (a request's first token needs its prompt and every prompt before it computed). `head`: the
    part of `flops` a prompt spends once, not per token."""
    import statistics
    done, firsts = 0.0, []
    for n in sorted(prompt_lens):
        done += n * (flops - head) + head
        firsts.append(done / (peak_gflops * 1e9) * 1e3)
    return statistics.median(firsts)


def kv_bytes_per_token(config, kv_format: str) -> int:
    """Bytes of K and V (codes and scales) one decode step reads per cached token, every layer."""
    from dashinfer_server.kv_cache import bytes_per_block
    return bytes_per_block(kv_format, config.num_hidden_layers, config.num_key_value_heads, 1,
                           config.head_dim)
