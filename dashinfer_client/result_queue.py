"""ResultQueue: the output of one request, filled by a producer thread (the engine's model loop,
or a ClientEngine's session reader) and drained by the user with DashInfer's Get calls."""
import numbers
import threading
import time

from .types import (FINAL_STATUSES, IMPLIED_REASON, GeneratedElements, GenerateRequestStatus, RequestStatInfo,
                    check_stat)

_MAX_TIMEOUT_MS = threading.TIMEOUT_MAX * 1000.0


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
        self._prompt = ([], [], [])  # prompt logprobs not yet delivered: token logprobs, tops, ranks
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
        # numbers.Real: numpy's integers and floats too (a count read from an array); not numpy's bool
        if (isinstance(timeout_ms, bool) or not isinstance(timeout_ms, numbers.Real)
                or not 0 <= timeout_ms <= _MAX_TIMEOUT_MS):
            raise ValueError(f"GetWithTimeout: timeout_ms must be a number in [0, {_MAX_TIMEOUT_MS}], "
                             f"got {timeout_ms!r}")
        with self._cond:
            self._cond.wait_for(self._has_news, float(timeout_ms) / 1000.0)
            return self._take()

    def GetNoWait(self):
        with self._cond:
            return self._take()

    def wait_finished(self, timeout=None) -> bool:
        """Block until the request has ended (what sync_request waits for); False on timeout."""
        with self._cond:
            return self._cond.wait_for(lambda: self._status in FINAL_STATUSES, timeout)

    @property
    def finished(self) -> bool:
        with self._cond:
            return self._status in FINAL_STATUSES

    def ended_in_listener(self) -> bool:
        """finished, for a listener (see listen): it runs with the queue's lock held, so this
        reads the status without taking it."""
        return self._status in FINAL_STATUSES

    def RequestStatInfo(self) -> RequestStatInfo:
        with self._cond:
            return self._stats()

    # ---- producer -------------------------------------------------------------------------------

    def push(self, ids, log_probs=None, token_logprobs=None, prefix_cache_len=None,
             prefix_len_gpu=None, prefix_len_cpu=None, prompt_logprobs=None) -> bool:
        """Append newly generated tokens and wake the consumers.

        ids: one token id or a sequence of them. log_probs (per token, a list of (id, logprob)
        pairs) and token_logprobs (per token, a float) must be given together, as long as ids,
        and by every push of a request or by none. prefix_cache_len: the prompt tokens reused from
        the prefix cache (prefix_len_cpu defaults to it, prefix_len_gpu to 0). The first push
        with tokens moves Init to Generating: as in DashInfer, a queue never shows
        ContextFinished (its engine sets that status on its internal request between the prompt
        and the first decode step, and its queues go from Init to Generating with the first
        token; DashInfer's own polling loops stop on any status but Init, Generating and the
        final ones). prompt_logprobs: the request's prompt logprobs, (token logprobs, top (id,
        logprob) pairs, ranks) per prompt token after the first, pushed once, with the first token.
        Returns False, dropping the data, if the request has already ended (a stop can race with the
        scheduler); raises ValueError on malformed arguments.
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
        if prompt_logprobs is not None:
            prompt_logprobs = _checked_prompt_logprobs(*prompt_logprobs)
        with self._cond:
            if self._status in FINAL_STATUSES:
                return False
            if prompt_logprobs is not None:
                self._prompt = prompt_logprobs
            if ids:
                if self._with_logprobs is None:
                    self._with_logprobs = with_logprobs
                elif self._with_logprobs != with_logprobs:
                    raise ValueError("push: logprobs given on some pushes of a request and not others")
            now = time.monotonic()
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
                self._status = GenerateRequestStatus.Generating
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
            finish_reason = check_stat("finish_reason", finish_reason)
        with self._cond:
            if self._status in FINAL_STATUSES:
                return False
            if status < self._status:
                raise ValueError(f"set_status: {self._status.name} -> {status.name} goes backwards")
            self._status = status
            if error is not None:
                self._error = str(error)
            if status in FINAL_STATUSES:
                self._t_end = time.monotonic()
                if finish_reason or not self._given_stats.get("finish_reason"):
                    self._given_stats["finish_reason"] = finish_reason or IMPLIED_REASON[status].value
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
        stats = {k: check_stat(k, v) for k, v in dict(stats or {}, **kw).items()}
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
        return bool(self._ids) or self._status in FINAL_STATUSES

    def _take(self):
        if not self._ids:
            return None
        total, gpu, cpu = self._prefix
        ele = GeneratedElements(self._ids, self._log_probs, self._token_logprobs, [],
                                total, gpu, cpu, *self._prompt)
        self._ids, self._log_probs, self._token_logprobs = [], [], []
        self._prompt = ([], [], [])
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


def _checked_prompt_logprobs(token_logprobs, top, ranks) -> tuple:
    """push's prompt_logprobs as plain lists of one length (ValueError otherwise)."""
    token_logprobs = [float(p) for p in token_logprobs]
    top = [[(int(i), float(p)) for i, p in pairs] for pairs in top]
    ranks = [int(r) for r in ranks]
    if not len(token_logprobs) == len(top) == len(ranks):
        raise ValueError(f"push: prompt logprobs of {len(token_logprobs)} tokens, {len(top)} top lists and "
                         f"{len(ranks)} ranks")
    return token_logprobs, top, ranks
