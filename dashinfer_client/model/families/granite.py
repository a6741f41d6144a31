"""IBM Granite (3.x dense): LLaMA with four scalars: the embeddings times embedding_multiplier, each
attention and MLP output times residual_multiplier before the residual add, attention scores
scaled by attention_multiplier (not head_dim ** -0.5), and the logits divided by logits_scaling."""
from .base import Family
from .llama import llama_fields


def _granite(hf, r):
    return dict(llama_fields(r), embedding_multiplier=float(r.need("embedding_multiplier")),
                residual_multiplier=float(r.need("residual_multiplier")),
                attention_scale=float(r.need("attention_multiplier")),
                logits_multiplier=1.0 / float(r.need("logits_scaling")))


GRANITE = Family("granite", ("GraniteForCausalLM",), ("granite",), _granite, gguf_arch="granite")
