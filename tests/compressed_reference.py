"""compressed-tensors as the reference for checkpoints quantized as released (its FP8 and packed int
formats, AutoAWQ's through its converter): the weights its decompression gives, as transformers
runs it loading the directory, and transformers' model over them."""


def decompressed(ct_dir, src):
    """({weight: its dequantized tensor} of the linear weights of the compressed-tensors checkpoint
    in ct_dir, transformers' float32 model of src (the float checkpoint it was made from) holding
    every weight of ct_dir's, the quantized ones dequantized)."""
    import torch
    from transformers import AutoModelForCausalLM, CompressedTensorsConfig

    from tests.helpers import load_hf_model
    loaded = AutoModelForCausalLM.from_pretrained(ct_dir, dtype=torch.float32, quantization_config=(
        CompressedTensorsConfig(dequantize=True))).state_dict()
    dequantized = {n: t.detach().clone() for n, t in loaded.items() if n.endswith("_proj.weight")}
    hf = load_hf_model(src)
    with torch.no_grad():
        for name, param in hf.named_parameters():
            param.copy_(loaded[name].float())
    hf.config._attn_implementation = "eager"
    return dequantized, hf
