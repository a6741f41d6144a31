"""ResultQueue: Get / GetWithTimeout / GetNoWait, statuses, statistics and finish reasons, with
producer and consumer threads."""
import threading
import time

import numpy as np
import pytest

from dashinfer_client import GenerateRequestStatus, RequestStatInfo, ResultQueue
from dashinfer_client.types import FinishReason

S = GenerateRequestStatus
JOIN_S = 10  # generous bound for a thread that must finish; never a timing assert


def in_thread(fn):
    """Run fn in a thread; return (thread, result list) so a test can check it did or did not return."""
    out = []
    t = threading.Thread(target=lambda: out.append(fn()), daemon=True)
    t.start()
    return t, out

# ---- ResultQueue: the consumer API ---------------------------------------------------------------

def test_fresh_queue():
    q = ResultQueue("r1")
    assert q.GenerateStatus() == S.Init and q.GeneratedLength() == 0 and q.error is None
    assert q.GetNoWait() is None
    assert q.GetWithTimeout(5) is None
    assert q.RequestStatInfo().generated_token_length == 0


def test_get_aggregates_everything_since_last_get():
    q = ResultQueue()
    q.push([1, 2], [[(1, -0.5)], [(2, -0.25)]], [-0.5, -0.25], prefix_cache_len=32)
    q.push(3, [[(3, -1.0)]], [-1.0], prefix_cache_len=32)
    q.push(np.array([4, 5]), [[(4, -0.1)], [(np.int64(5), np.float32(-0.125))]], np.array([-0.1, -0.125]))
    assert q.GeneratedLength() == 5
    ele = q.Get()
    assert ele.ids_from_generate == [1, 2, 3, 4, 5]
    assert ele.log_probs_list == [[(1, -0.5)], [(2, -0.25)], [(3, -1.0)], [(4, -0.1)], [(5, -0.125)]]
    assert ele.token_logprobs_list == pytest.approx([-0.5, -0.25, -1.0, -0.1, -0.125])
    assert all(type(i) is int for i in ele.ids_from_generate)
    assert (ele.prefix_cache_len, ele.prefix_len_gpu, ele.prefix_len_cpu) == (32, 0, 32)
    assert q.GetNoWait() is None  # everything was delivered
    q.push(np.int64(6), [[]], [-0.5])
    assert q.GetNoWait().ids_from_generate == [6] and q.GeneratedLength() == 6


def test_elements_without_logprobs_have_empty_lists():
    q = ResultQueue()
    q.push([7, 8])
    ele = q.GetWithTimeout(1000)
    assert ele.ids_from_generate == [7, 8] and ele.log_probs_list == [] and ele.token_logprobs_list == []


def test_get_blocks_until_a_push_then_wakes():
    q = ResultQueue()
    t, out = in_thread(q.Get)
    time.sleep(0.05)
    assert t.is_alive()  # nothing pushed: Get waits
    q.push(42)
    t.join(JOIN_S)
    assert not t.is_alive() and out[0].ids_from_generate == [42]


def test_get_wakes_with_none_when_the_request_ends_without_tokens():
    q = ResultQueue()
    t, out = in_thread(q.Get)
    time.sleep(0.05)
    assert t.is_alive()
    q.set_status(S.GenerateInterrupted, error="KV cache full")
    t.join(JOIN_S)
    assert not t.is_alive() and out == [None]
    assert q.error == "KV cache full"


def test_none_after_the_end_and_all_delivered():
    q = ResultQueue()
    q.push([1, 2])
    q.set_status(S.GenerateFinished)
    assert q.Get().ids_from_generate == [1, 2]  # still delivered after the end
    for get in (q.Get, lambda: q.GetWithTimeout(10_000), q.GetNoWait):
        t, out = in_thread(get)
        t.join(JOIN_S)
        assert not t.is_alive() and out == [None]  # returns at once, never blocks


def test_interrupted_request_delivers_its_tokens_then_none():
    q = ResultQueue()
    q.push([3, 4])
    assert q.set_status(S.GenerateInterrupted, error="out of KV blocks")
    assert q.GenerateStatus() == S.GenerateInterrupted and q.error == "out of KV blocks"
    assert q.Get().ids_from_generate == [3, 4]
    assert q.Get() is None


def test_get_with_timeout_refuses_bad_timeouts():
    q = ResultQueue()
    for bad in (-1, "10", None, True, np.bool_(True), float("inf"), 1e308, -float("inf"), np.int64(-1)):
        with pytest.raises(ValueError, match="timeout_ms"):
            q.GetWithTimeout(bad)


def test_get_with_timeout_takes_numpy_numbers():
    """A count read from an array is a number of ms like any other (DashInfer's binding takes it)."""
    q = ResultQueue()
    for ms in (np.int64(1), np.int32(1), np.uint8(1), np.float32(1.5), np.float64(0)):
        assert q.GetWithTimeout(ms) is None


def test_get_with_timeout_refuses_nan_without_waiting():
    """nan compares false with everything: it must be refused, not taken for "wait forever"."""
    def call():
        try:
            ResultQueue().GetWithTimeout(float("nan"))
        except ValueError as e:
            return e
    t, out = in_thread(call)
    t.join(JOIN_S)
    assert not t.is_alive() and isinstance(out[0], ValueError)


def _producer(q, n, with_logprobs, sleep_s=0.002):
    for i in range(n):
        time.sleep(sleep_s)
        if with_logprobs:
            q.push([i], [[(i, -float(i)), (i + 1, -float(i) - 1)]], [-float(i)])
        else:
            q.push([i])
    q.set_status(S.GenerateFinished)


@pytest.mark.parametrize("mode", ["Get", "GetWithTimeout", "GetNoWait"])
def test_threaded_producer_consumer(mode):
    n = 60
    q = ResultQueue()
    producer = threading.Thread(target=_producer, args=(q, n, True))
    producer.start()
    got, lp, tlp = [], [], []
    seen_generating = False
    deadline = time.monotonic() + JOIN_S
    while time.monotonic() < deadline:
        ended = q.GenerateStatus() == S.GenerateFinished  # read before the get: nothing comes after
        if mode == "Get":
            ele = q.Get()
        elif mode == "GetWithTimeout":
            ele = q.GetWithTimeout(3)
        else:
            ele = q.GetNoWait()
        if ele is None:
            if ended or mode == "Get":
                break
            if mode == "GetNoWait":
                time.sleep(0.001)
            continue
        assert len(ele.ids_from_generate) == len(ele.log_probs_list) == len(ele.token_logprobs_list)
        got += ele.ids_from_generate
        lp += ele.log_probs_list
        tlp += ele.token_logprobs_list
        # everything delivered was generated: the count never lags behind what the consumer holds
        assert q.GeneratedLength() >= len(got)
        seen_generating |= q.GenerateStatus() == S.Generating
    producer.join(JOIN_S)
    assert got == list(range(n))
    assert lp == [[(i, -float(i)), (i + 1, -float(i) - 1)] for i in range(n)]
    assert tlp == [-float(i) for i in range(n)]
    assert q.GeneratedLength() == n and q.GenerateStatus() == S.GenerateFinished
    assert q.RequestStatInfo().generated_token_length == n
    assert seen_generating or mode != "Get"


def test_generated_length_is_right_at_every_moment():
    q = ResultQueue()
    pushed = []
    stop = threading.Event()
    bad = []

    def watch():  # GeneratedLength is read while pushes happen: never beyond what was pushed
        while not stop.is_set():
            n = q.GeneratedLength()
            if n > len(pushed):
                bad.append((n, len(pushed)))

    watcher = threading.Thread(target=watch)
    watcher.start()
    for i in range(300):
        pushed.append(i)  # appended before the push: GeneratedLength may lag, never lead
        q.push(i)
        assert q.GeneratedLength() == i + 1
    stop.set()
    watcher.join(JOIN_S)
    assert not bad


def test_two_consumers_share_the_tokens_without_duplicates():
    q = ResultQueue()
    results = [[], []]

    def consume(k):
        while (ele := q.Get()) is not None:
            results[k] += ele.ids_from_generate

    consumers = [threading.Thread(target=consume, args=(k,)) for k in range(2)]
    for c in consumers:
        c.start()
    _producer(q, 200, False, sleep_s=0.0002)
    for c in consumers:
        c.join(JOIN_S)
    assert not any(c.is_alive() for c in consumers)
    assert sorted(results[0] + results[1]) == list(range(200))


# ---- ResultQueue: the producer API ---------------------------------------------------------------

def test_status_sequence_and_push_promotes_to_generating():
    """As DashInfer's queues: Init until the first token, then Generating; ContextFinished (its
    engine's internal status between prompt and first decode) is never shown."""
    q = ResultQueue()
    seen = []
    q.listen(lambda: seen.append(q._status))
    q.push([])  # nothing new: no promotion
    assert q.GenerateStatus() == S.Init and q.GetNoWait() is None
    q.push(1)  # the prompt's token
    assert q.GenerateStatus() == S.Generating
    q.push([2, 3])
    assert q.set_status(S.Generating)  # repeating the current status is harmless
    assert q.set_status(S.GenerateFinished)
    assert q.GenerateStatus() == S.GenerateFinished
    assert S.ContextFinished not in seen and seen[0] == S.Init and seen[-1] == S.GenerateFinished


def test_status_cannot_go_back():
    q = ResultQueue()
    q.set_status(S.Generating)
    with pytest.raises(ValueError, match="Generating -> ContextFinished"):
        q.set_status(S.ContextFinished)
    with pytest.raises(ValueError):
        q.set_status(17)


def test_final_status_is_kept_first_one_wins():
    q = ResultQueue()
    q.push(1)
    assert q.set_status(S.GenerateInterrupted, error="stopped")
    assert not q.set_status(S.GenerateFinished)
    assert not q.set_status(S.Generating)
    assert q.GenerateStatus() == S.GenerateInterrupted and q.error == "stopped"
    assert q.push(2) is False  # a push racing with the stop is dropped
    assert q.GeneratedLength() == 1
    assert q.Get().ids_from_generate == [1] and q.Get() is None


@pytest.mark.parametrize("kwargs,match", [
    (dict(ids=[1, 2], log_probs=[[(1, -1.0)]], token_logprobs=[-1.0]), "2 ids"),
    (dict(ids=[1], log_probs=[[(1, -1.0)]], token_logprobs=[-1.0, -2.0]), "token_logprobs"),
    (dict(ids=[1], log_probs=[[(1, -1.0)]]), "together"),
    (dict(ids=[1], token_logprobs=[-1.0]), "together"),
])
def test_push_refuses_misaligned_logprobs(kwargs, match):
    q = ResultQueue()
    with pytest.raises(ValueError, match=match):
        q.push(**kwargs)
    assert q.GeneratedLength() == 0


def test_push_refuses_mixing_logprobs_and_none():
    q = ResultQueue()
    q.push([1], [[(1, -1.0)]], [-1.0])
    with pytest.raises(ValueError, match="some pushes"):
        q.push([2])
    q2 = ResultQueue()
    q2.push([1])
    with pytest.raises(ValueError, match="some pushes"):
        q2.push([2], [[(2, -1.0)]], [-1.0])


def test_push_prefix_lengths():
    q = ResultQueue()
    q.push([1], prefix_cache_len=64, prefix_len_gpu=16)
    ele = q.Get()
    assert (ele.prefix_cache_len, ele.prefix_len_gpu, ele.prefix_len_cpu) == (64, 16, 48)
    assert ele.tensors_from_model_inference == []  # DashInfer's list of dicts; none produced here
    q.push([2])
    assert q.GetNoWait().prefix_cache_len == 64  # the latest known values ride along


def test_stats_derived_by_the_queue():
    q = ResultQueue()
    q.update_stats(context_token_length=100, time_in_queue=1.0)
    running = q.RequestStatInfo()
    assert running.first_token_time == 0 and running.time_to_first_token == 0 and running.finished_time == 0
    time.sleep(0.01)
    q.push([1], prefix_cache_len=60)
    time.sleep(0.01)
    q.push([2, 3])
    q.set_status(S.GenerateFinished)
    info = q.RequestStatInfo()
    assert isinstance(info, RequestStatInfo)
    assert info.arrival_time > 1.6e12  # epoch milliseconds
    assert info.arrival_time < info.first_token_time < info.last_token_time
    assert info.time_to_first_token == pytest.approx(info.first_token_time - info.arrival_time)
    assert info.prefill_time == pytest.approx(info.time_to_first_token - 1.0)
    assert info.decode_time == pytest.approx(info.last_token_time - info.first_token_time)
    assert info.finished_time >= info.time_to_first_token + info.decode_time - 1e-6
    assert (info.context_token_length, info.context_cached_length, info.generated_token_length) == (100, 60, 3)
    assert info.context_tps == pytest.approx(40 * 1000.0 / info.prefill_time)
    assert info.generate_tps == pytest.approx(2 * 1000.0 / info.decode_time)


def test_stats_given_by_the_producer_win():
    q = ResultQueue()
    q.push([1, 2])
    q.update_stats({"time_to_first_token": 5.0, "prefill_time": 4.0}, context_tps=123.0,
                   generated_token_length=99)
    info = q.RequestStatInfo()
    assert (info.time_to_first_token, info.prefill_time, info.context_tps) == (5.0, 4.0, 123.0)
    assert info.generated_token_length == 2  # always the pushed count
    for bad, match in (({"ttft": 1}, "ttft"), ({"prefill_time": "5"}, "prefill_time"),
                       ({"context_token_length": True}, "context_token_length")):
        with pytest.raises(ValueError, match=match):
            q.update_stats(bad)


def test_finish_reason_is_empty_while_running_then_kept_from_the_first_final_status():
    q = ResultQueue()
    assert q.RequestStatInfo().finish_reason == ""
    q.push([1])
    assert q.RequestStatInfo()["finish_reason"] == ""
    assert q.set_status(S.GenerateFinished, finish_reason=FinishReason.EOS)
    assert not q.set_status(S.GenerateInterrupted, "late", FinishReason.INTERRUPTED)
    info = q.RequestStatInfo()
    assert info.finish_reason == "eos" and type(info.finish_reason) is str
    # a final status without a reason: the one update_stats gave, else what the status implies
    given = ResultQueue()
    given.update_stats(finish_reason="stop_words")
    given.set_status(S.GenerateFinished)
    assert given.RequestStatInfo().finish_reason == "stop_words"
    for status, implied in ((S.GenerateFinished, "stopped"), (S.GenerateInterrupted, "interrupted"),
                            (S.InternalError, "interrupted")):
        q = ResultQueue()
        q.set_status(status)
        assert q.RequestStatInfo().finish_reason == implied
    with pytest.raises(ValueError, match="finish_reason"):
        ResultQueue().update_stats(finish_reason="tired")
    with pytest.raises(ValueError, match="finish_reason"):
        ResultQueue().set_status(S.GenerateFinished, finish_reason=3)



def test_listen_is_called_now_and_after_every_push_and_status_change():
    q = ResultQueue()
    calls = []
    q.push(4)
    q.listen(lambda: calls.append(q._status))  # under the lock: the state it sees is current
    assert calls == [S.Generating]
    q.update_stats(context_token_length=3)  # statistics alone wake nobody
    q.push([5, 6])
    q.set_status(S.GenerateFinished)
    assert calls == [S.Generating, S.Generating, S.GenerateFinished]
    assert not q.push(7) and not q.set_status(S.GenerateInterrupted)  # refused: no call
    assert len(calls) == 3
