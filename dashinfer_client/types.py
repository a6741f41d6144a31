"""The API types of DashInfer: enums, GeneratedElements, RequestStatInfo and ResultQueue.

Names and integer values follow DashInfer (allspark), so code written for it keeps working and
the values can cross the gRPC wire as plain ints.
"""
import enum
import numbers
import threading
import time
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
    """Life of a request: Init -> ContextFinished -> Generating -> GenerateFinished or
    GenerateInterrupted (or InternalError). The last three are final."""
    Init = 0
    ContextFinished = 1
    Generating = 2
    GenerateFinished = 3
    GenerateInterrupted = 4
    InternalError = 5


# The longest wait Condition.wait accepts, in milliseconds (about 292 years).
_MAX_TIMEOUT_MS = threading.TIMEOUT_MAX * 1000.0
_FINAL = frozenset({GenerateRequestStatus.GenerateFinished, GenerateRequestStatus.GenerateInterrupted,
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
_IMPLIED_REASON = {GenerateRequestStatus.GenerateFinished: FinishReason.STOPPED,
                   GenerateRequestStatus.GenerateInterrupted: FinishReason.INTERRUPTED,
                   GenerateRequestStatus.InternalError: FinishReason.INTERRUPTED}


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
    tensors_from_model_inference: named outputs of a model-inference request; always empty here
    (this runtime only generates).
    prefix_cache_len: prompt tokens served from the prefix cache (prefix_len_cpu + prefix_len_gpu).
    On this CPU runtime every cached token is in main memory, so prefix_len_gpu is 0.
    """
    ids_from_generate: list = field(default_factory=list)
    log_probs_list: list = field(default_factory=list)
    token_logprobs_list: list = field(default_factory=list)
    tensors_from_model_inference: dict = field(default_factory=dict)
    prefix_cache_len: int = 0
    prefix_len_gpu: int = 0
    prefix_len_cpu: int = 0


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

    KEYS = tuple(k.value for k in Key)
    COUNT_KEYS = ("context_token_length", "context_cached_length", "generated_token_length")
    TEXT_KEYS = ("finish_reason",)

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


def _check_stat(key, value):
    """The value to store for statistic `key` (a FinishReason as its plain str)."""
    if key not in RequestStatInfo.KEYS:
        raise ValueError(f"unknown statistic {key!r}; known: {', '.join(RequestStatInfo.KEYS)}")
    if key in RequestStatInfo.TEXT_KEYS:
        try:
            return FinishReason(value).value if value != "" else ""
        except ValueError:
            raise ValueError(f"statistic {key} must be one of {', '.join(r.value for r in FinishReason)}"
                             f" or '', got {value!r}") from None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"statistic {key} must be a number, got {value!r}")
    return value


class ResultQueue:
    """The output of one request, filled by a producer thread and drained by the user.

    Consumer API (DashInfer's):
      GenerateStatus()      current GenerateRequestStatus.
      GeneratedLength()     tokens generated so far, delivered or not.
      RequestStatInfo()     a RequestStatInfo snapshot.
      Get()                 blocks until new tokens exist or the request has ended; returns one
                            GeneratedElements holding everything produced since the previous Get
                            (several tokens if the consumer fell behind), or None once the request
                            has ended and all of it was delivered.
      GetWithTimeout(ms)    as Get, but None after ms milliseconds without news.
      GetNoWait()           the new elements, or None if there are none.
      error                 why the request was interrupted (a message), else None.
    Tokens produced before an interruption are still delivered before Get returns None.

    Producer API (for the Engine's scheduler thread and the ClientEngine's stream reader; not for
    users): push(), set_status(), update_stats(), listen(). Every method is thread-safe; one
    Condition guards the state, and each push or status change wakes the waiting consumers at once.
    """

    def __init__(self, request_id: str = ""):
        self.request_id = request_id
        self._cond = threading.Condition(threading.Lock())
        self._status = GenerateRequestStatus.Init
        self._error = None
        # Produced but not yet delivered; handed over whole to the next Get.
        self._ids = []
        self._log_probs = []
        self._token_logprobs = []
        self._prefix = (0, 0, 0)  # prefix_cache_len, prefix_len_gpu, prefix_len_cpu
        self._generated = 0
        self._with_logprobs = None  # fixed by the first push: every push must agree
        # Monotonic clock for durations; timestamps are reported on the wall clock.
        self._t0 = time.monotonic()
        self._wall0_ms = time.time() * 1000.0
        self._t_first = self._t_last = self._t_end = None
        self._given_stats = {}
        self._listener = None

    # ---- consumer -------------------------------------------------------------------------------

    def GenerateStatus(self) -> GenerateRequestStatus:
        with self._cond:
            return self._status

    def GeneratedLength(self) -> int:
        with self._cond:
            return self._generated

    @property
    def error(self):
        with self._cond:
            return self._error

    def Get(self):
        with self._cond:
            self._cond.wait_for(self._has_news)
            return self._take()

    def GetWithTimeout(self, timeout_ms):
        # `not 0 <= t <= MAX` also refuses nan; Condition.wait overflows on inf and 1e308.
        if (isinstance(timeout_ms, bool) or not isinstance(timeout_ms, (int, float))
                or not 0 <= timeout_ms <= _MAX_TIMEOUT_MS):
            raise ValueError(f"GetWithTimeout: timeout_ms must be a number in [0, {_MAX_TIMEOUT_MS}], "
                             f"got {timeout_ms!r}")
        with self._cond:
            self._cond.wait_for(self._has_news, timeout_ms / 1000.0)
            return self._take()

    def GetNoWait(self):
        with self._cond:
            return self._take()

    def wait_finished(self, timeout=None) -> bool:
        """Block until the request has ended (what sync_request waits for); False on timeout."""
        with self._cond:
            return self._cond.wait_for(lambda: self._status in _FINAL, timeout)

    @property
    def finished(self) -> bool:
        with self._cond:
            return self._status in _FINAL

    def RequestStatInfo(self) -> RequestStatInfo:
        with self._cond:
            return self._stats()

    # ---- producer -------------------------------------------------------------------------------

    def push(self, ids, log_probs=None, token_logprobs=None, prefix_cache_len=None,
             prefix_len_gpu=None, prefix_len_cpu=None) -> bool:
        """Append newly generated tokens and wake the consumers.

        ids: one token id or a sequence of them. log_probs (per token, a list of (id, logprob)
        pairs) and token_logprobs (per token, a float) must be given together, as long as ids,
        and by every push of a request or by none. prefix_cache_len: the prompt tokens reused from
        the prefix cache (prefix_len_cpu defaults to it, prefix_len_gpu to 0). The first tokens
        come out of the prompt's step: their push moves Init to ContextFinished; any later push
        moves the request on to Generating (so a consumer can tell the two phases apart, as in
        DashInfer). Returns False, dropping the data, if the request has already ended (a stop
        can race with the scheduler); raises ValueError on malformed arguments.
        """
        ids = [int(ids)] if isinstance(ids, numbers.Integral) else [int(i) for i in ids]
        if (log_probs is None) != (token_logprobs is None):
            raise ValueError("push: log_probs and token_logprobs go together")
        with_logprobs = log_probs is not None
        if with_logprobs:
            log_probs = [[(int(i), float(p)) for i, p in tok] for tok in log_probs]
            token_logprobs = [float(p) for p in token_logprobs]
            if len(log_probs) != len(ids) or len(token_logprobs) != len(ids):
                raise ValueError(f"push: {len(ids)} ids but {len(log_probs)} log_probs entries and "
                                 f"{len(token_logprobs)} token_logprobs")
        with self._cond:
            if self._status in _FINAL:
                return False
            if ids:
                if self._with_logprobs is None:
                    self._with_logprobs = with_logprobs
                elif self._with_logprobs != with_logprobs:
                    raise ValueError("push: logprobs given on some pushes of a request and not others")
            now = time.monotonic()
            first = self._generated == 0
            if ids:
                if self._t_first is None:
                    self._t_first = now
                self._t_last = now
                self._ids += ids
                self._generated += len(ids)
                if with_logprobs:
                    self._log_probs += log_probs
                    self._token_logprobs += token_logprobs
            if prefix_cache_len is not None:
                total = int(prefix_cache_len)
                gpu = 0 if prefix_len_gpu is None else int(prefix_len_gpu)
                cpu = total - gpu if prefix_len_cpu is None else int(prefix_len_cpu)
                self._prefix = (total, gpu, cpu)
            if ids and self._status < GenerateRequestStatus.Generating:
                self._status = GenerateRequestStatus.ContextFinished if first else GenerateRequestStatus.Generating
            self._changed()
            return True

    def set_status(self, status, error=None, finish_reason=None) -> bool:
        """Move the request to `status` (a GenerateRequestStatus) and wake the consumers.

        A final status (GenerateFinished, GenerateInterrupted, InternalError) is kept once set:
        later calls return False and change nothing, so the first of a stop and a natural finish
        wins. Going back (Generating -> ContextFinished) is a producer bug: ValueError.
        error: a message for the consumer (ResultQueue.error), e.g. why it was interrupted.
        finish_reason: with a final status, a FinishReason for the statistics; when neither it nor
        update_stats gave one, GenerateFinished means STOPPED and the others INTERRUPTED.
        """
        status = GenerateRequestStatus(status)
        if finish_reason is not None:
            finish_reason = _check_stat("finish_reason", finish_reason)
        with self._cond:
            if self._status in _FINAL:
                return False
            if status < self._status:
                raise ValueError(f"set_status: {self._status.name} -> {status.name} goes backwards")
            self._status = status
            if error is not None:
                self._error = str(error)
            if status in _FINAL:
                self._t_end = time.monotonic()
                if finish_reason or not self._given_stats.get("finish_reason"):
                    self._given_stats["finish_reason"] = finish_reason or _IMPLIED_REASON[status].value
            self._changed()
            return True

    def update_stats(self, stats=None, **kw) -> None:
        """Set RequestStatInfo entries the queue cannot see itself (context_token_length,
        time_in_queue, ...), or override what it derives. The queue derives on its own:
        arrival_time (its creation), first/last_token_time (pushes), time_to_first_token,
        prefill_time, decode_time, finished_time, context_cached_length (push's
        prefix_cache_len), context_tps and generate_tps. generated_token_length always counts the
        pushed tokens, whatever is given here. Unknown keys or non-numbers (finish_reason: not a
        FinishReason): ValueError."""
        stats = {k: _check_stat(k, v) for k, v in dict(stats or {}, **kw).items()}
        with self._cond:
            self._given_stats.update(stats)

    def listen(self, listener) -> None:
        """Call listener() after every push and status change from now on (and once now), with
        the queue's lock held: it must be quick and must not call the queue. For a producer
        that forwards many queues at once (the gRPC service's session stream)."""
        with self._cond:
            self._listener = listener
            listener()

    # ---- internals (called with the lock held) --------------------------------------------------

    def _changed(self):
        self._cond.notify_all()
        if self._listener is not None:
            self._listener()

    def _has_news(self):
        return bool(self._ids) or self._status in _FINAL

    def _take(self):
        if not self._ids:
            return None
        total, gpu, cpu = self._prefix
        ele = GeneratedElements(self._ids, self._log_probs, self._token_logprobs, {},
                                total, gpu, cpu)
        self._ids, self._log_probs, self._token_logprobs = [], [], []
        return ele

    def _wall_ms(self, t):
        return 0.0 if t is None else self._wall0_ms + (t - self._t0) * 1000.0

    def _stats(self) -> RequestStatInfo:
        info = RequestStatInfo(arrival_time=self._wall0_ms,
                               first_token_time=self._wall_ms(self._t_first),
                               last_token_time=self._wall_ms(self._t_last),
                               context_cached_length=self._prefix[0])
        given = self._given_stats
        info.update(given)

        def given_or(key, derived):  # a value the producer gave wins over the derived one
            return given.get(key, derived)

        first, last, end = info["first_token_time"], info["last_token_time"], self._t_end
        ttft = given_or("time_to_first_token", first - info["arrival_time"] if first else 0.0)
        prefill = given_or("prefill_time", max(ttft - info["time_in_queue"], 0.0) if first else 0.0)
        decode = given_or("decode_time", last - first if first else 0.0)
        computed = info["context_token_length"] - info["context_cached_length"]
        after_first = self._generated - 1
        info.update(
            time_to_first_token=ttft, prefill_time=prefill, decode_time=decode,
            finished_time=given_or("finished_time", (end - self._t0) * 1000.0 if end else 0.0),
            generated_token_length=self._generated,
            context_tps=given_or("context_tps", computed * 1000.0 / prefill if prefill > 0 else 0.0),
            generate_tps=given_or("generate_tps",
                                  after_first * 1000.0 / decode if decode > 0 and after_first else 0.0))
        return info

    def __repr__(self):
        with self._cond:
            return (f"ResultQueue({self.request_id!r}, status={self._status.name}, "
                    f"generated={self._generated}, undelivered={len(self._ids)})")
