"""Backend configs of pipeline(): LMDeploy's TurbomindEngineConfig and PytorchEngineConfig under their
own names and defaults (so LMDeploy scripts run unchanged), and CpuEngineConfig for what is CPU-only.

Each turns into one EngineSettings, the runtime of this CPU engine:
  tp                     tensor-parallel ranks, one per NUMA node: 1 = the in-process Engine,
                         > 1 = a ClientEngine over that many server ranks
  session_len            max_length of a request (prompt + generated); None = the model's context,
                         at most 4096
  max_batch_size         requests running at once (None = 32)
  cache_max_entry_count  the KV cache gets at most this fraction of the free memory (dashinfer_client.memory)
  quant_policy           KV cache: 0 the model's precision, 4 uint4, 8 int8
  block_size / cache_block_seq_len   tokens per KV cache block (16, 32, 64, 128)
  enable_prefix_caching  reuse the KV cache of shared prompt prefixes
  max_prefill_token_num  prompt tokens per scheduler step; 0 = the engine chooses (512)
  model_format           None (guess), 'hf', 'gguf' or 'dashinfer' (a serialized model)
  dtype                  'auto' (bfloat16 when converting; as stored for a serialized model),
                         'bfloat16', 'float16', 'float32'
CpuEngineConfig adds weight_quant (None, 'int8', 'uint4': InstantQuant at conversion) and
threads_per_rank (None = every core of the rank's node). A GPU-only field set to anything but its
neutral value is refused: nothing is silently ignored.
"""
import dataclasses
from dataclasses import dataclass
from typing import Optional

from ..model_cache import QUANT_FORMATS
from ..types import AsCacheMode

KV_MODES = {0: AsCacheMode.AsCacheDefault, 4: AsCacheMode.AsCacheQuantU4, 8: AsCacheMode.AsCacheQuantI8}
DTYPES = ("auto", "bfloat16", "float16", "float32")
MODEL_FORMATS = (None, "hf", "gguf", "dashinfer")
BLOCK_SIZES = (16, 32, 64, 128)
DEFAULT_MAX_BATCH = 32


@dataclass(frozen=True)
class EngineSettings:
    tp: int = 1
    session_len: Optional[int] = None
    max_batch_size: int = DEFAULT_MAX_BATCH
    cache_max_entry_count: float = 0.8
    kv_cache_mode: AsCacheMode = AsCacheMode.AsCacheDefault
    block_size: int = 64
    enable_prefix_caching: bool = True
    max_prefill_token_num: int = 0
    model_format: Optional[str] = None
    dtype: Optional[str] = None  # None: as stored / bfloat16 when converting
    weight_quant: Optional[str] = None
    threads_per_rank: Optional[int] = None


def _int(owner, name, value, lo, none_ok=False):
    if value is None and none_ok:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < lo:
        raise ValueError(f"{owner}.{name} must be an int >= {lo}{' or None' if none_ok else ''}, got {value!r}")


def _choice(owner, name, value, allowed):
    if value not in allowed:
        raise ValueError(f"{owner}.{name} must be one of {', '.join(map(repr, allowed))}, got {value!r}")


class _BackendConfig:
    """Checks shared by the three configs. NEUTRAL: GPU-only field -> (the only accepted value, why)."""
    NEUTRAL = {}
    BLOCK_FIELD = "block_size"

    def __post_init__(self):
        owner = type(self).__name__
        for name, (neutral, why) in self.NEUTRAL.items():
            if getattr(self, name) != neutral:
                raise ValueError(f"{owner}.{name}={getattr(self, name)!r} is not supported on this CPU "
                                 f"engine ({why}); leave it at {neutral!r}")
        _int(owner, "tp", self.tp, 1)
        _int(owner, "session_len", self.session_len, 1, none_ok=True)
        _int(owner, "max_batch_size", self.max_batch_size, 1, none_ok=True)
        c = self.cache_max_entry_count
        if isinstance(c, bool) or not isinstance(c, (int, float)) or not 0 < c < 1:
            raise ValueError(f"{owner}.cache_max_entry_count must be in (0, 1), got {c!r}")
        _choice(owner, "quant_policy", self.quant_policy, tuple(KV_MODES))
        _choice(owner, self.BLOCK_FIELD, getattr(self, self.BLOCK_FIELD), BLOCK_SIZES)
        _int(owner, "max_prefill_token_num", self.max_prefill_token_num, 0)
        _choice(owner, "dtype", self.dtype, DTYPES)
        _choice(owner, "model_format", self.model_format, MODEL_FORMATS)
        if not isinstance(self.enable_prefix_caching, bool):
            raise ValueError(f"{owner}.enable_prefix_caching must be a bool, got {self.enable_prefix_caching!r}")

    def settings(self) -> EngineSettings:
        return EngineSettings(
            tp=self.tp, session_len=self.session_len,
            max_batch_size=self.max_batch_size or DEFAULT_MAX_BATCH,
            cache_max_entry_count=float(self.cache_max_entry_count),
            kv_cache_mode=KV_MODES[self.quant_policy], block_size=getattr(self, self.BLOCK_FIELD),
            enable_prefix_caching=self.enable_prefix_caching, max_prefill_token_num=self.max_prefill_token_num,
            model_format=self.model_format, dtype=None if self.dtype == "auto" else self.dtype,
            weight_quant=getattr(self, "weight_quant", None),
            threads_per_rank=getattr(self, "threads_per_rank", None))


@dataclass
class TurbomindEngineConfig(_BackendConfig):
    """LMDeploy's TurboMind config; see the module docstring for what each field means here."""
    dtype: str = "auto"
    model_format: Optional[str] = None
    tp: int = 1
    session_len: Optional[int] = None
    max_batch_size: Optional[int] = None
    cache_max_entry_count: float = 0.8
    cache_chunk_size: int = -1
    cache_block_seq_len: int = 64
    enable_prefix_caching: bool = False
    quant_policy: int = 0
    rope_scaling_factor: float = 0.0
    use_logn_attn: bool = False
    download_dir: Optional[str] = None
    revision: Optional[str] = None
    max_prefill_token_num: int = 0
    num_tokens_per_iter: int = 0
    max_prefill_iters: int = 1
    communicator: str = "nccl"
    model_name: Optional[str] = None  # deprecated in LMDeploy; the chat template is ChatTemplateConfig's

    BLOCK_FIELD = "cache_block_seq_len"
    NEUTRAL = {
        "cache_chunk_size": (-1, "the KV cache is one pool sized at start"),
        "rope_scaling_factor": (0.0, "RoPE scaling comes from the model's config"),
        "use_logn_attn": (False, "log-n attention is not implemented"),
        "download_dir": (None, "this machine cannot download models"),
        "revision": (None, "this machine cannot download models"),
        "num_tokens_per_iter": (0, "use max_prefill_token_num"),
        "max_prefill_iters": (1, "use max_prefill_token_num"),
        "communicator": ("nccl", "ranks talk over MPI and shared memory; nothing to choose"),
    }


@dataclass
class PytorchEngineConfig(_BackendConfig):
    """LMDeploy's PyTorch-engine config; see the module docstring for what each field means here."""
    dtype: str = "auto"
    tp: int = 1
    dp: int = 1
    ep: int = 1
    dp_rank: int = 0
    session_len: Optional[int] = None
    max_batch_size: Optional[int] = None
    cache_max_entry_count: float = 0.8
    prefill_interval: int = 16
    block_size: int = 64
    num_cpu_blocks: int = 0
    num_gpu_blocks: int = 0
    adapters: Optional[dict] = None
    max_prefill_token_num: int = 0
    thread_safe: bool = False
    enable_prefix_caching: bool = False
    device_type: str = "cuda"
    eager_mode: bool = False
    custom_module_map: Optional[dict] = None
    download_dir: Optional[str] = None
    revision: Optional[str] = None
    quant_policy: int = 0
    distributed_executor_backend: Optional[str] = None
    should_execute_dummy_batch: bool = False
    model_format: Optional[str] = None

    NEUTRAL = {
        "dp": (1, "one data-parallel replica"), "ep": (1, "no expert parallelism"),
        "dp_rank": (0, "one data-parallel replica"),
        "prefill_interval": (16, "prefill is chunked into every step"),
        "num_cpu_blocks": (0, "the KV cache is sized by cache_max_entry_count"),
        "num_gpu_blocks": (0, "there is no GPU"), "adapters": (None, "LoRA adapters are not supported"),
        "custom_module_map": (None, "the model code is fixed"),
        "download_dir": (None, "this machine cannot download models"),
        "revision": (None, "this machine cannot download models"),
        "distributed_executor_backend": (None, "ranks are MPI processes"),
        "should_execute_dummy_batch": (False, "one data-parallel replica"),
    }

    def __post_init__(self):
        if self.device_type not in ("cuda", "cpu"):
            raise ValueError(f"PytorchEngineConfig.device_type={self.device_type!r} is not supported on this "
                             "CPU engine; leave it at 'cuda' (the default) or say 'cpu'")
        super().__post_init__()


@dataclass
class CpuEngineConfig(_BackendConfig):
    """This engine's own config: LMDeploy's common fields plus weight_quant and threads_per_rank."""
    tp: int = 1
    session_len: Optional[int] = None
    max_batch_size: Optional[int] = DEFAULT_MAX_BATCH
    cache_max_entry_count: float = 0.8
    quant_policy: int = 0
    block_size: int = 32
    enable_prefix_caching: bool = True
    max_prefill_token_num: int = 0
    model_format: Optional[str] = None
    dtype: str = "auto"
    weight_quant: Optional[str] = None
    threads_per_rank: Optional[int] = None

    def __post_init__(self):
        _choice("CpuEngineConfig", "weight_quant", self.weight_quant, (None,) + QUANT_FORMATS)
        _int("CpuEngineConfig", "threads_per_rank", self.threads_per_rank, 1, none_ok=True)
        super().__post_init__()


BACKEND_CONFIGS = (TurbomindEngineConfig, PytorchEngineConfig, CpuEngineConfig)


def engine_settings(backend_config, overrides=None) -> EngineSettings:
    """The settings of backend_config (None: CpuEngineConfig()) with pipeline(**kwargs) fields set
    (an unknown field raises TypeError)."""
    if backend_config is None:
        backend_config = CpuEngineConfig()
    if not isinstance(backend_config, BACKEND_CONFIGS):
        raise TypeError(f"backend_config must be a TurbomindEngineConfig, PytorchEngineConfig or "
                        f"CpuEngineConfig (or None), got {type(backend_config).__name__}")
    if overrides:
        unknown = sorted(set(overrides) - {f.name for f in dataclasses.fields(backend_config)})
        if unknown:
            raise TypeError(f"pipeline() got unknown keyword argument(s) {', '.join(unknown)}: neither a "
                            f"pipeline() parameter nor a field of {type(backend_config).__name__}")
        backend_config = dataclasses.replace(backend_config, **overrides)
    return backend_config.settings()
