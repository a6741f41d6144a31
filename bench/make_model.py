"""Write a random-weight Hugging Face model of a real shape, for benchmarks at scale.

    PYTHONPATH=. python -m bench.make_model qwen2-1.5b /tmp/qwen2-1.5b-random
    PYTHONPATH=. python -m bench.make_model llama3-8b /tmp/llama3-8b-random   # memory, start-up
    PYTHONPATH=. python -m bench.make_model qwen3-30b-a3b /tmp/q3moe-4l --layers 4
    PYTHONPATH=. python -m bench.make_model gpt-oss-20b /tmp/gpt-oss-4l --layers 4
    (also qwen3-1.7b and gemma3-1b: SHAPES)

transformers gives the config, and the model's family (weight_shapes) every tensor's name and shape
as a checkpoint stores them (experts one by one); the weights are drawn one tensor at a time in
bf16 (normal, std 0.02 as transformers initializes them; norms 1) and written in safetensors
shards of ~1 GB, so resident memory stays near one shard whatever the model's size. --layers
writes the first N layers only: Qwen3-30B-A3B's 48 are 61 GB in bf16, more than this machine's
disk and memory allow; its layers are alike, so a few give a layer's figures. gpt-oss-20b is
written as the released checkpoint is: its experts fused per layer in MXFP4 (random e2m1 codes,
scales of 2^-8: weights within +-0.023) and the rest bf16: 0.48 GB a layer (0.42 of it experts),
13.7 GB for its 24 layers with the embedding and head (2.3 GB); --layers 4 gives 4.2 GB. No
tokenizer: the benchmarks send token ids.
"""
import argparse
import json
import os

SHAPES = {
    # Qwen2-1.5B: 3.09 GB of bf16 weights, tied embeddings
    "qwen2-1.5b": dict(model_type="qwen2", hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
                       num_attention_heads=12, num_key_value_heads=2, vocab_size=151936,
                       max_position_embeddings=32768, rope_theta=1e6, rms_norm_eps=1e-6,
                       tie_word_embeddings=True),
    # Qwen3-1.7B: 4.06 GB of bf16 weights, tied embeddings, q/k norms, head_dim 128
    "qwen3-1.7b": dict(model_type="qwen3", hidden_size=2048, intermediate_size=6144, num_hidden_layers=28,
                       num_attention_heads=16, num_key_value_heads=8, head_dim=128, vocab_size=151936,
                       max_position_embeddings=40960, rope_theta=1e6, rms_norm_eps=1e-6,
                       tie_word_embeddings=True),
    # Gemma-3-1B (text): 2.0 GB of bf16 weights, tied, 5 sliding (512) layers to 1 global, head_dim 256
    "gemma3-1b": dict(model_type="gemma3_text", hidden_size=1152, intermediate_size=6912, num_hidden_layers=26,
                      num_attention_heads=4, num_key_value_heads=1, head_dim=256, vocab_size=262144,
                      max_position_embeddings=32768, rope_theta=1e6, rope_local_base_freq=10000.0,
                      sliding_window=512, query_pre_attn_scalar=256, rms_norm_eps=1e-6,
                      tie_word_embeddings=True),
    # Qwen3-30B-A3B: 128 experts of 768 rows, 8 a token (3.3B of 30.5B parameters active); 61 GB of
    # bf16 weights, 1.25 GB a layer
    "qwen3-30b-a3b": dict(model_type="qwen3_moe", hidden_size=2048, intermediate_size=6144, num_hidden_layers=48,
                          moe_intermediate_size=768, num_experts=128, num_experts_per_tok=8, norm_topk_prob=True,
                          num_attention_heads=32, num_key_value_heads=4, head_dim=128, vocab_size=151936,
                          max_position_embeddings=40960, rope_theta=1e6, rms_norm_eps=1e-6,
                          tie_word_embeddings=False),
    # gpt-oss-20b: 32 experts of 2880 rows, 4 a token, MXFP4 experts (4.25 bits a weight), attention
    # sinks, sliding window 128 on alternate layers, YaRN
    "gpt-oss-20b": dict(model_type="gpt_oss", hidden_size=2880, intermediate_size=2880, num_hidden_layers=24,
                        num_local_experts=32, num_experts_per_tok=4, num_attention_heads=64, num_key_value_heads=8,
                        head_dim=64, vocab_size=201088, max_position_embeddings=131072, sliding_window=128,
                        rms_norm_eps=1e-5, tie_word_embeddings=False,
                        quantization_config={"quant_method": "mxfp4", "modules_to_not_convert": [
                            "model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens",
                            "lm_head"]}),
    # LLaMA-3-8B: 16 GB of bf16 weights
    "llama3-8b": dict(model_type="llama", hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                      num_attention_heads=32, num_key_value_heads=8, vocab_size=128256,
                      max_position_embeddings=8192, rope_theta=5e5, rms_norm_eps=1e-5,
                      tie_word_embeddings=False),
}
SHARD_BYTES = 1 << 30


def write_random_model(shape: str, out_dir: str, seed: int = 0, layers: int | None = None) -> str:
    """Write the model of SHAPES[shape] (its first `layers` layers) into out_dir (created); returns out_dir."""
    import torch
    from safetensors.torch import save_file
    from transformers import AutoConfig
    from dashinfer_client.model.arch import normalize_hf_config
    from dashinfer_client.model.serialized import weight_shapes

    spec = dict(SHAPES[shape])
    if layers:
        spec["num_hidden_layers"] = layers
    config = AutoConfig.for_model(spec.pop("model_type"), torch_dtype="bfloat16", bos_token_id=1,
                                  eos_token_id=2, **spec)
    architecture, cfg = normalize_hf_config(config.to_dict())
    names = checkpoint_tensors(cfg, weight_shapes(cfg, architecture))
    os.makedirs(out_dir, exist_ok=True)
    config.save_pretrained(out_dir)
    gen = torch.Generator().manual_seed(seed)
    index, shard, shard_bytes, files = {}, {}, 0, []

    def flush():
        nonlocal shard, shard_bytes
        if shard:
            name = f"model-{len(files) + 1:05d}.safetensors"
            save_file(shard, os.path.join(out_dir, name), metadata={"format": "pt"})
            files.append(name)
            index.update({n: name for n in shard})
            shard, shard_bytes = {}, 0

    for name, dims in names.items():
        if name.endswith("_blocks"):  # random e2m1 codes
            t = torch.randint(0, 256, dims, dtype=torch.uint8, generator=gen)
        elif name.endswith("_scales"):
            t = torch.full(dims, MXFP4_SCALE, dtype=torch.uint8)
        elif len(dims) == 1 or name.endswith("_bias"):  # norms weigh 1, biases 0
            t = torch.ones(dims) if name.endswith("norm.weight") else torch.zeros(dims)
        else:  # drawn in fp32 blocks of rows: the fp32 temporary stays small
            t = torch.empty(dims, dtype=torch.bfloat16)
            rows = max(1, (64 << 20) // (4 * dims[1]))
            for r in range(0, dims[0], rows):
                t[r:r + rows] = torch.empty(min(rows, dims[0] - r), dims[1]).normal_(0.0, 0.02, generator=gen)
        shard[name] = t if t.dtype == torch.uint8 else t.to(torch.bfloat16)
        shard_bytes += shard[name].nbytes
        if shard_bytes >= SHARD_BYTES:
            flush()
    flush()
    with open(os.path.join(out_dir, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": sum((1 if n.endswith(("_blocks", "_scales")) else 2) * _numel(d)
                                                  for n, d in names.items())},
                   "weight_map": index}, f, indent=1)
    return out_dir


MXFP4_SCALE = 127 - 8  # e8m0 of 2^-8


def checkpoint_tensors(cfg, shapes):
    """{name: shape} as the checkpoint stores weight_shapes' tensors: one tensor per expert, or
    (MXFP4 experts, gpt-oss) each layer's experts fused into blocks, scales and biases."""
    if not cfg.mxfp4_experts:
        return shapes
    out = {}
    E, H, I = cfg.num_experts, cfg.hidden_size, cfg.moe_intermediate_size
    for name, dims in shapes.items():
        if ".experts." not in name:
            out[name] = dims
        elif name.endswith(".experts.0.gate_proj.weight"):  # the layer's first expert tensor: all of them
            layer = name[:name.index("experts.")] + "experts."
            for proj, rows, k in (("gate_up_proj", 2 * I, H), ("down_proj", H, I)):
                out[f"{layer}{proj}_blocks"] = (E, rows, k // 32, 16)
                out[f"{layer}{proj}_scales"] = (E, rows, k // 32)
                out[f"{layer}{proj}_bias"] = (E, rows)
    return out


def _numel(dims):
    n = 1
    for d in dims:
        n *= d
    return n


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("shape", choices=sorted(SHAPES))
    parser.add_argument("out_dir")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--layers", type=int, default=None, help="write only the first N layers")
    args = parser.parse_args()
    print(write_random_model(args.shape, args.out_dir, args.seed, args.layers))


if __name__ == "__main__":
    main()
