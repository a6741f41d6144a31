"""The API types of DashInfer: enums, GeneratedElements, RequestStatInfo (ResultQueue: result_queue.py).

Names and integer values follow DashInfer (allspark), so code written for it keeps working and
the values can cross the gRPC wire as plain ints.
"""
import enum
from dataclasses import dataclass, field


class TargetDevice(enum.Enum):
    """Where a model runs. CPU: one process on this machine's cores; CPU_NUMA: one tensor-parallel
    rank per NUMA node listed in the runtime config's device_ids. (DashInfer's CUDA has no meaning here.)"""
    CPU = "CPU"
    CPU_NUMA = "CPU_NUMA"


class PrintedEnum(enum.IntEnum):
    """An IntEnum that prints as DashInfer's (pybind11) enums do: str() and f-strings give
    "GenerateRequestStatus.Generating", not the number; comparisons and int() stay numeric."""

    def __str__(self):
        return f"{type(self).__name__}.{self.name}"

    def __format__(self, spec):
        return format(str(self), spec)


class AsCacheMode(PrintedEnum):
    """KV cache storage: bf16, int8 or uint4 per-token quantized."""
    AsCacheDefault = 0
    AsCacheQuantI8 = 1
    AsCacheQuantU4 = 2


class AsStatus(PrintedEnum):
    """Status codes every API call returns (DashInfer's values)."""
    ALLSPARK_SUCCESS = 0
    ALLSPARK_UNKNOWN_ERROR = 1        # anything no other code describes
    ALLSPARK_PARAM_ERROR = 2          # a bad argument value
    ALLSPARK_IO_ERROR = 3             # a file could not be read or written
    ALLSPARK_MEMORY_ERROR = 4         # out of memory or out of bounds
    ALLSPARK_RUNTIME_ERROR = 5        # a failure while running the model
    ALLSPARK_EXCEED_LIMIT_ERROR = 7   # an argument or input over a configured limit
    ALLSPARK_INVALID_CALL_ERROR = 8   # the call is not valid in the current state
    ALLSPARK_EMPTY_REQUEST = 9        # a request without input
    ALLSPARK_ILLEGAL_REQUEST_ID = 10  # unknown or released request handle
    ALLSPARK_CACHE_MEMORY_OUT = 11    # the KV cache is full
    ALLSPARK_REQUEST_DENIED = 12      # the model is stopping or stopped
    ALLSPARK_LORA_NOT_LOADED = 13     # the requested LoRA adapter is not loaded
    ALLSPARK_CHUNK_PREFILL = 14       # a long prompt is being prefilled in chunks
    ALLSPARK_DEPRECATED = 20          # a deprecated API was called
    ALLSPARK_LORA_NUM_EXCEED_LIMIT_ERROR = 21   # DashInfer's LoRA codes: this runtime loads no
    ALLSPARK_LORA_RANK_EXCEED_LIMIT_ERROR = 22  # LoRA adapters, so only ALLSPARK_LORA_NOT_LOADED
    ALLSPARK_LORA_NOT_FOUND = 23                # (a request naming one) is ever returned; the
    ALLSPARK_LORA_ALREADY_LOADED = 24           # others exist so that code comparing against
    ALLSPARK_LORA_IN_USE = 25                   # them runs
    ALLSPARK_STREAMING = 200          # results are being streamed
    # DashInfer's Python binding spells code 8 this way too; both names are the same member.
    ALLSPARK_ALLSPARK_INVALID_CALL_ERROR = 8


class GenerateRequestStatus(PrintedEnum):
    """Life of a request as its ResultQueue shows it: Init -> Generating (with the first token)
    -> GenerateFinished or GenerateInterrupted (or InternalError); the last three are final.
    ContextFinished is DashInfer's status of its engine's internal request between the prompt
    and the first decode step; as there, no queue ever shows it (the value exists for code that
    names it)."""
    Init = 0
    ContextFinished = 1
    Generating = 2
    GenerateFinished = 3
    GenerateInterrupted = 4
    InternalError = 5


# The longest wait Condition.wait accepts, in milliseconds (about 292 years).
FINAL_STATUSES = frozenset({GenerateRequestStatus.GenerateFinished, GenerateRequestStatus.GenerateInterrupted,
                    GenerateRequestStatus.InternalError})


class FinishReason(str, enum.Enum):
    """Why a request ended: RequestStatInfo's finish_reason (a plain str, "" while it runs).

    EOS          an eos_token_id was generated (with early_stopping on)
    STOP_WORDS   the output ended with one of stop_words_ids
    LENGTH       prompt + generated tokens reached max_length
    STOPPED      stop_request or release_request ended it
    INTERRUPTED  the engine could not go on: KV cache exhausted, a failure, a shutdown
    """
    EOS = "eos"
    STOP_WORDS = "stop_words"
    LENGTH = "length"
    STOPPED = "stopped"
    INTERRUPTED = "interrupted"


# The reason a final status implies when its producer names none.
IMPLIED_REASON = {GenerateRequestStatus.GenerateFinished: FinishReason.STOPPED,
                   GenerateRequestStatus.GenerateInterrupted: FinishReason.INTERRUPTED,
                   GenerateRequestStatus.InternalError: FinishReason.INTERRUPTED}


class ModelState(str, enum.Enum):
    """Initial (installed) -> Running (start_model) -> Stopped (stop_model) -> Released. A str, so
    it compares equal to its name."""
    Initial = "Initial"
    Running = "Running"
    Stopped = "Stopped"
    Released = "Released"


class RoPEScaleMethod(enum.Enum):
    """RoPE scaling. NO_SCALE, YaRN and NTK carry DashInfer's values; LINEAR and LLAMA3 are the
    scalings this runtime implements (named in Hugging Face configs as "linear" and "llama3")."""
    NO_SCALE = 0
    LINEAR = 1
    YaRN = 3
    NTK = 4
    LLAMA3 = 5


@dataclass
class GeneratedElements:
    """What one Get() returns: everything produced since the previous Get().

    ids_from_generate: the new token ids, oldest first.
    log_probs_list: per new token, the top_logprobs (token id, logprob) pairs, most likely first.
    token_logprobs_list: per new token, the logprob of the token chosen.
    Both logprob lists are empty unless the request asked for logprobs, else as long as the ids.
    tensors_from_model_inference: DashInfer's list of dicts (tensor name -> tensor) of hidden
    states, filled when a request sets enable_tensors_from_model_inference; always empty here
    (the engine refuses that option).
    prefix_cache_len: prompt tokens served from the prefix cache (prefix_len_cpu + prefix_len_gpu).
    On this CPU runtime every cached token is in main memory, so prefix_len_gpu is 0.
    prompt_token_logprobs_list, prompt_log_probs_list, prompt_token_ranks_list: with the generation
    option prompt_logprobs, in the element that carries the first generated token (empty in every
    other): per prompt token after the first (the first has no context), its logprob under the
    model (log_softmax of the raw logits, before any penalty or temperature), the prompt_logprobs
    most likely (id, logprob) pairs at its position, and its rank there (1 = the most likely).
    """
    ids_from_generate: list = field(default_factory=list)
    log_probs_list: list = field(default_factory=list)
    token_logprobs_list: list = field(default_factory=list)
    tensors_from_model_inference: list = field(default_factory=list)
    prefix_cache_len: int = 0
    prefix_len_gpu: int = 0
    prefix_len_cpu: int = 0
    prompt_token_logprobs_list: list = field(default_factory=list)
    prompt_log_probs_list: list = field(default_factory=list)
    prompt_token_ranks_list: list = field(default_factory=list)


class RequestStatInfo(dict):
    """Statistics of one request: a dict keyed by DashInfer's names (RequestStatInfo.Key), whose
    entries also read as attributes (info.time_to_first_token). Times are in milliseconds (floats):
    arrival_time, first_token_time and last_token_time are timestamps since the Unix epoch, the
    other times are durations. A value not known yet is 0.

    arrival_time          when the request was started
    first_token_time      when its first token was produced
    last_token_time       when its latest token was produced
    time_to_first_token   first_token_time - arrival_time
    time_in_queue         waiting before its prefill began
    prefill_time          computing the prompt: time_to_first_token - time_in_queue
    decode_time           from the first token to the latest one
    finished_time         from arrival to the end of the request (0 while it runs)
    context_token_length  prompt tokens
    context_cached_length prompt tokens served from the prefix cache
    generated_token_length tokens generated so far
    context_tps           prompt tokens computed per second of prefill
    generate_tps          tokens per second after the first
    finish_reason         why it ended, a FinishReason value ("eos", "length", ...); "" while it
                          runs (not one of DashInfer's keys: it has no such statistic)
    uuid                  the caller's request id, the generation config's uuid ("" when none
                          was given); DashInfer keeps it as its request id
    """

    class Key(enum.Enum):
        KEY_REQUEST_TIME_TS = "arrival_time"
        KEY_FIRST_TOKEN_TIME_TS = "first_token_time"
        KEY_LAST_TOKEN_TIME_TS = "last_token_time"
        KEY_TTFT_MS = "time_to_first_token"
        KEY_SCHEDULE_TIME_MS = "time_in_queue"
        KEY_PREFILL_TIME_MS = "prefill_time"
        KEY_DECODE_TIME_MS = "decode_time"
        KEY_TOTAL_TIME_MS = "finished_time"
        KEY_INPUT_LEN = "context_token_length"
        KEY_INPUT_CACHE_LEN = "context_cached_length"
        KEY_OUTPUT_LEN = "generated_token_length"
        KEY_CONTEXT_TPS = "context_tps"
        KEY_GENERATE_TPS = "generate_tps"
        KEY_FINISH_REASON = "finish_reason"
        KEY_UUID = "uuid"

    KEYS = tuple(k.value for k in Key)
    COUNT_KEYS = ("context_token_length", "context_cached_length", "generated_token_length")
    TEXT_KEYS = ("finish_reason", "uuid")

    def __init__(self, info=None, **kw):
        super().__init__({k: (0 if k in self.COUNT_KEYS else "" if k in self.TEXT_KEYS else 0.0)
                          for k in self.KEYS})
        self.update(info or {}, **kw)

    def __getattr__(self, name):
        if name == "finish_time":  # DashInfer's attribute for the finished_time key
            name = "finished_time"
        try:
            return self[name]
        except KeyError:
            raise AttributeError(f"RequestStatInfo has no entry {name!r}") from None

    def to_dict(self) -> dict:
        return dict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "RequestStatInfo":
        return cls(d)


def check_stat(key, value):
    """The value to store for statistic `key` (a FinishReason as its plain str)."""
    if key not in RequestStatInfo.KEYS:
        raise ValueError(f"unknown statistic {key!r}; known: {', '.join(RequestStatInfo.KEYS)}")
    if key == "uuid":
        if not isinstance(value, str):
            raise ValueError(f"statistic uuid must be a str, got {value!r}")
        return value
    if key in RequestStatInfo.TEXT_KEYS:
        try:
            return FinishReason(value).value if value != "" else ""
        except ValueError:
            raise ValueError(f"statistic {key} must be one of {', '.join(r.value for r in FinishReason)}"
                             f" or '', got {value!r}") from None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"statistic {key} must be a number, got {value!r}")
    return value


from .result_queue import ResultQueue  # noqa: E402,F401 (defined in its own module, named here too)
