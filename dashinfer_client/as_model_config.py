"""AsModelConfig: DashInfer's runtime config struct, filled by attribute or by keyword.

    cfg = AsModelConfig()                      # DashInfer v2: default, then attributes
    cfg.model_name = "qwen"; cfg.model_path = ".../qwen.asgraph"; cfg.weights_path = ".../qwen.asparam"
    cfg = AsModelConfig(model_name="qwen", model_path=..., weights_path=..., compute_unit="CPU:0",
                        engine_max_length=2048, engine_max_batch=8, num_threads=0)   # DashInfer v1

Nothing is checked while it is filled, as in DashInfer; build() turns it into the validated
AsModelRuntimeConfig the engines install (so engine.install_model(cfg) takes it as a builder), and
a value this runtime cannot honour is refused there with the reason.
"""
from .options import AsEvictionStrategy, AsMHAPrefill, AsSchedulingStrategy
from .types import AsCacheMode

# DashInfer's matmul_precision values. On this runtime precision follows the serialized model's
# dtype (weights bf16/fp32/int8, activations and accumulation fp32), so every level is honoured.
MATMUL_PRECISIONS = ("highest", "high", "medium")
# DashInfer 1.3 on CPU ran its flash prefill whatever it was given (AsPrefillFlashV2 on AVX-512);
# this runtime has one chunked causal prefill, exact attention, which both names select.
CPU_PREFILL_MODES = (AsMHAPrefill.AsPrefillDefault, AsMHAPrefill.AsPrefillFlashV2)


class AsModelConfig:
    """DashInfer's AsModelConfig; keyword names and order are DashInfer's, defaults those of its
    default constructor (engine_max_length 2048, engine_max_batch 32; 0, its keyword constructor's
    default, also means these). compute_unit: "CPU:0" or "CPU:0,1" (a tensor-parallel rank per NUMA
    node)."""

    def __init__(self, model_name="", model_path="", weights_path="", compute_unit="CPU:0",
                 engine_max_length=2048, engine_max_batch=32, engine_max_prefill_length=0,
                 swap_threshold=-1, text_graph=False, num_threads=0, matmul_precision="highest",
                 lora_names=None, cache_span_size=32, cache_span_num_init=0, cache_span_num_grow=0,
                 enable_prefix_cache=True, prefix_cache_ttl=300,
                 prefill_mode=AsMHAPrefill.AsPrefillDefault, cache_mode=AsCacheMode.AsCacheDefault,
                 eviction_strategy=AsEvictionStrategy.MaxLength,
                 scheduling_strategy=AsSchedulingStrategy.ContextPriority,
                 enable_sparsity_matmul=False, lora_max_rank=64, lora_max_num=5):
        self.model_name = model_name
        self.model_path = model_path
        self.weights_path = weights_path
        self.compute_unit = compute_unit
        self.engine_max_length = engine_max_length
        self.engine_max_batch = engine_max_batch
        self.engine_max_prefill_length = engine_max_prefill_length
        self.swap_threshold = swap_threshold
        self.text_graph = text_graph
        self.num_threads = num_threads
        self.matmul_precision = matmul_precision
        self.lora_names = list(lora_names or [])
        self.cache_span_size = cache_span_size
        self.cache_span_num_init = cache_span_num_init
        self.cache_span_num_grow = cache_span_num_grow
        self.enable_prefix_cache = enable_prefix_cache
        self.prefix_cache_ttl = prefix_cache_ttl
        self.prefill_mode = prefill_mode
        self.cache_mode = cache_mode
        self.eviction_strategy = eviction_strategy
        self.scheduling_strategy = scheduling_strategy
        self.enable_sparsity_matmul = enable_sparsity_matmul
        self.lora_max_rank = lora_max_rank
        self.lora_max_num = lora_max_num

    def build(self):
        """The validated AsModelRuntimeConfig; ValueError names the first attribute it cannot honour."""
        from .runtime_config import AsModelRuntimeConfigBuilder  # that module re-exports this class
        self._refuse_unsupported()
        b = (AsModelRuntimeConfigBuilder().model_name(self.model_name)
             .model_file_path(self.model_path, self.weights_path)
             .set_compute_unit_from_str(self.compute_unit)
             .thread_num(self.num_threads)
             .max_prefill_length(self.engine_max_prefill_length)
             .kv_cache_span_size(self.cache_span_size).set_span_init_size(self.cache_span_num_init)
             .prefill_cache(self.enable_prefix_cache).prefix_cache_ttl(self.prefix_cache_ttl)
             .kv_cache_mode(self.cache_mode).eviction_strategy(self.eviction_strategy)
             .scheduling_strategy(self.scheduling_strategy)
             .enable_sparsity_matmul(self.enable_sparsity_matmul)
             .lora_max_rank(self.lora_max_rank).lora_max_num(self.lora_max_num))
        if self.engine_max_length:
            b.max_length(self.engine_max_length)
        if self.engine_max_batch:
            b.max_batch(self.engine_max_batch)
        return b.build()

    def _refuse_unsupported(self):
        if self.matmul_precision not in MATMUL_PRECISIONS:
            raise ValueError(f"matmul_precision must be one of {', '.join(MATMUL_PRECISIONS)}, "
                             f"got {self.matmul_precision!r}")
        if self.swap_threshold != -1:
            raise ValueError(f"swap_threshold={self.swap_threshold!r}: weights are never swapped out "
                             f"here (they are memory-mapped); only -1")
        if self.text_graph:
            raise ValueError("text_graph=True: the serialized graph here is always JSON text already; "
                             "only False")
        if self.lora_names:
            raise ValueError(f"lora_names={self.lora_names!r}: this runtime loads no LoRA adapters")
        if self.cache_span_num_grow:
            raise ValueError("cache_span_num_grow must be 0: the KV pool is allocated whole at install")
        if self.prefill_mode not in CPU_PREFILL_MODES:
            raise ValueError(f"prefill_mode={self.prefill_mode!r}: the xformers kernel is a CUDA one; "
                             f"AsPrefillDefault or AsPrefillFlashV2 (the same prefill here)")

    def __repr__(self):  # str() too: equal configs print alike, as DashInfer's tests compare them
        items = ", ".join(f"{k}={v!r}" for k, v in vars(self).items())
        return f"AsModelConfig({items})"

    def __eq__(self, other):
        return isinstance(other, AsModelConfig) and vars(self) == vars(other)
