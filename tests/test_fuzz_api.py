"""Property-based fuzzing of the public API of both engines (hypothesis): the in-process Engine and
a ClientEngine over a spawned group get the same random calls, most of them bad (wrong types,
huge / negative / NaN numbers, surrogates, NULs, huge strings, broken configs, unknown handles,
calls in the wrong order), and must answer each alike.

What a call may do (DOCUMENTED below), everything else is a failure:
- an engine method (install/start/stop/release_model, start_request_ids/_text, stop/release/
  sync_request, call_with_reason) returns its AsStatus: "nothing a caller passes raises"
  (dashinfer_client/api.py); a refusal leaves its reason in last_error;
- get_model_state returns a ModelState, get_stats a dict (the same models in the same states);
- ResultQueue.GetWithTimeout raises ValueError for a timeout that is not a number of ms in
  [0, threading.TIMEOUT_MAX s] (result_queue.py);
- a config builder's setter raises ValueError for a bad value (checks.py), before any engine
  sees it;
- a call with the wrong number of arguments raises TypeError, as any Python function does.
Each call gets CALL_TIMEOUT_S (a hang fails the test), both engines must give the same outcome,
and every CHECK_EVERY cases a valid greedy request must still give the reference ids, computed once.
"""
import logging
import math
import threading

import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, example, given, settings
from hypothesis import strategies as st

import dashinfer_client as allspark
from dashinfer_client import ASGenerationConfigBuilder, AsStatus
from dashinfer_client.api import ModelState
from dashinfer_client.generation_config import OPTIONS
from tests.engine_helpers import API_CONTEXT, collect, greedy

MAIN, SPARE = "tiny-fuzz", "fz"  # MAIN serves throughout; SPARE's lifecycle is fuzzed
CASES = 1000          # calls per run, at least (each call runs on both engines)
CHECK_EVERY = 50      # cases between two checks that a valid request is served correctly
CALL_TIMEOUT_S = 30.0  # a generous bound on a busy 2-core machine: far longer means a hang
PROMPT, NEW = [5, 17, 101, 33, 7, 250], 12
OK = AsStatus.ALLSPARK_SUCCESS
ENGINE_METHODS = ("install_model", "start_model", "stop_model", "release_model", "start_request_ids",
                  "start_request_text", "stop_request", "release_request", "sync_request")


class _Handle:
    """Stands for the handle of the valid request an example started on each engine (its queue
    is what the ResultQueue calls use)."""
    def __repr__(self):
        return "<this example's handle>"


HANDLE = _Handle()


class _RaisingBuilder(ASGenerationConfigBuilder):
    def build(self):
        raise RuntimeError("a builder that fails on purpose")


class _Deferred:
    """A config setter called with a bad value: ValueError (documented), else the builder it returns."""
    def __init__(self, setter, value):
        self.setter, self.value = setter, value

    def __repr__(self):
        return f"<{self.setter.__name__}({self.value!r:.60})>"


class _Weird:
    """An object no check expects: unhashable; len, iteration and int() raise."""
    def __len__(self):
        raise RuntimeError("len fails on purpose")

    def __iter__(self):
        raise RuntimeError("iteration fails on purpose")

    __hash__ = None  # unhashable

    def __int__(self):
        raise RuntimeError("int() fails on purpose")


# ---- strategies ------------------------------------------------------------------------------------

def huge(make):
    """A huge value made per example (st.just would keep it in the strategy's repr)."""
    return st.builds(make)


numbers_ = st.one_of(st.integers(-2**70, 2**70), st.sampled_from([-1, 0, 2**31, 2**63, -2**63 - 1, 10**30]),
                     st.floats(allow_nan=True, allow_infinity=True), st.booleans())
texts = st.one_of(st.text(max_size=12), st.sampled_from(["", "\x00", "tiny\x00fuzz", "\ud800", "a\udc80b",
                                                         " " * 10, "../../etc/passwd"]),
                  huge(lambda: "x" * 50_000))
junk = st.one_of(st.none(), numbers_, texts, st.binary(max_size=8), st.just(_Weird()), st.just(object()),
                 st.lists(st.integers(-3, 300), max_size=4), st.dictionaries(texts, numbers_, max_size=2),
                 st.just(float("nan")), st.just(np.array([1.5, np.nan])), st.just({1, 2}), st.just((5, 6)))


@st.composite
def mostly(draw, good, bad, share_bad=0.3):
    """`good` most of the time, `bad` (a strategy) with probability share_bad: often the right
    value, so that the checks behind the first one are reached too (st.one_of would flatten bad's
    many branches and give good a small share)."""
    return draw(bad) if draw(st.floats(0, 1)) < share_bad else draw(good)


model_names = mostly(st.just(MAIN), st.one_of(junk, st.sampled_from([SPARE, "nope", MAIN + "\x00", MAIN.encode(),
                                                                     "\udcff", np.str_(MAIN)])))
lifecycle_names = mostly(st.just(SPARE), st.one_of(  # never MAIN, which serves throughout
    junk, st.sampled_from(["nope", SPARE.encode(), "\ud800"])))
handles = mostly(st.just(HANDLE), st.one_of(st.integers(-2**70, 2**70), junk))
input_ids = mostly(st.just(PROMPT), st.one_of(
    junk, st.lists(st.integers(-2**65, 2**65), max_size=6), st.lists(st.integers(0, 271), min_size=1, max_size=6),
    st.lists(st.floats(), min_size=1, max_size=3), st.just([[5, 6], [7, 8]]), st.just([[[5]]]), st.just([]),
    st.just([5] * 600), huge(lambda: [5] * 100_000), st.just(np.array([5, 6], dtype=np.uint64)),
    st.just(np.array([[5, 6, 7]])), st.just(np.array([2**63], dtype=np.uint64)), st.just(np.zeros((0, 3))),
    st.just(np.array(["5"])), st.just([5, "6"]), st.just([5, None]), st.just([5, True]),
    st.just((5, 6)), st.just([np.int64(5), np.uint8(6)]), st.just(np.array([5.0, 6.0])), st.just(iter([5, 6]))))
GEN_KEYS = ["do_sample", "temperature", "top_k", "top_p", "max_length", "min_length", "early_stopping",
            "stop_words_ids", "bad_words_ids", "eos_token_id", "no_repeat_ngram_size", "repetition_penalty",
            "length_penalty", "presence_penalty", "seed", "logprobs", "top_logprobs", "lora_name", "mm_info",
            "response_format", "num_beams", "frequency_penalty", "logit_bias", "min_p", "not_an_option"]
# values of the right kind in an odd form (each took a different path over gRPC once), or junk
ODD_VALUES = [[[5, 6]], [[]], [[2**64]], [[-1]], {"type": "json_object"}, [999], b"x", [{5, 6}], ((5, 6),),
              np.int64(3), np.float32(0.5), np.array([5, 6]), [np.int32(5)], "adapter", 0.5, 1, 0, True, None,
              [[5, 6.0]], {"5": -100}, {5: 101}, {99999: 1}]
gen_values = mostly(st.sampled_from(ODD_VALUES), junk, share_bad=0.4)


@st.composite
def generation_configs(draw):
    kind = draw(st.sampled_from([0, 1, 1, 1, 2, 2, 3, 4, 4, 5]))
    if kind == 0:
        return draw(junk)
    if kind == 1:  # a dict as built, then changed: the engine checks it again
        cfg = greedy(len(PROMPT) + 4).build()
        for key in draw(st.lists(st.sampled_from(GEN_KEYS), max_size=2)):
            cfg[key] = draw(gen_values)
        return cfg
    if kind == 2:  # a plain dict of raw options
        return draw(st.dictionaries(st.one_of(st.sampled_from(GEN_KEYS), st.none(), numbers_, texts, st.binary()),
                                    gen_values, max_size=3))
    if kind == 3:
        return _RaisingBuilder(seed=1)
    if kind == 4:  # a builder's setter with an odd value: ValueError, or the builder it returns
        setter = getattr(greedy(len(PROMPT) + 4), draw(st.sampled_from(list(OPTIONS))))
        return _Deferred(setter, draw(gen_values))
    return greedy(draw(st.sampled_from([len(PROMPT), len(PROMPT) + 3, 513, 10**9])))


@st.composite
def runtime_configs(draw, loader):
    kind = draw(st.integers(0, 4))
    if kind == 0:
        return draw(junk)
    builder = (loader.create_reference_runtime_config_builder(SPARE, allspark.TargetDevice.CPU, [0], max_batch=2)
               .max_length(64).kv_cache_span_size(16))
    if kind == 1:
        return builder  # valid: installs SPARE (the fuzzed lifecycle)
    if kind == 2:  # a setter with a bad value raises ValueError before any engine is called
        setter = draw(st.sampled_from(["max_length", "max_batch", "thread_num", "kv_cache_span_size",
                                       "kv_cache_memory_mb", "model_name", "prefix_cache_ttl"]))
        return _Deferred(getattr(builder, setter), draw(mostly(st.sampled_from([10**6, 2**40, 2**62]), junk)))
    cfg = builder.build()
    if kind == 3:  # a built config changed afterwards: the engines must check it again
        field = draw(st.sampled_from(["model_name", "model_dir", "model_prefix", "max_length", "max_batch",
                                      "thread_num", "kv_cache_span_size", "kv_cache_mode", "device_ids",
                                      "prefill_cache", "kv_cache_memory_mb", "device_type"]))
        setattr(cfg, field, draw(junk))
        return cfg
    cfg.model_name = draw(st.sampled_from([MAIN, "other"]))  # already installed, or files elsewhere
    cfg.model_dir = draw(st.sampled_from([cfg.model_dir, "/nonexistent", "/dev", "/proc/self", ""]))
    cfg.max_length = draw(st.sampled_from([64, API_CONTEXT + 1]))
    return cfg


def calls(loader):
    """One call: (method, args); args may hold HANDLE (each engine's own)."""
    model = st.one_of(st.none(), st.just(loader), junk)
    queue_timeouts = st.one_of(junk, st.sampled_from([0, 1, 1e308, math.inf, -math.inf, math.nan, -0.0]))
    return st.one_of(
        st.tuples(st.just("install_model"), st.tuples(runtime_configs(loader))),
        st.tuples(st.sampled_from(["start_model", "stop_model", "release_model", "get_model_state"]),
                  st.tuples(lifecycle_names)),
        st.tuples(st.just("start_request_ids"), st.tuples(model_names, model, input_ids, generation_configs())),
        st.tuples(st.just("start_request_text"),
                  st.tuples(model_names, model, st.one_of(texts, junk, st.lists(texts, max_size=3)),
                            generation_configs())),
        st.tuples(st.sampled_from(["stop_request", "release_request", "sync_request"]),
                  st.tuples(model_names, handles)),
        st.tuples(st.just("call_with_reason"), st.tuples(st.sampled_from(ENGINE_METHODS[1:4]), lifecycle_names)),
        st.tuples(st.just("call_with_reason"), st.tuples(st.sampled_from(ENGINE_METHODS[6:]), model_names, handles)),
        st.tuples(st.sampled_from(["GetWithTimeout"]), st.tuples(queue_timeouts)),
        st.tuples(st.sampled_from(["GetNoWait", "GenerateStatus", "GeneratedLength", "RequestStatInfo"]),
                  st.just(())),
        st.tuples(st.just("get_stats"), st.just(())),
        st.tuples(st.just("arity"), st.tuples(  # the wrong number of arguments
            st.sampled_from(ENGINE_METHODS + ("get_model_state",)),
            st.lists(junk, max_size=5).filter(lambda a: len(a) not in (1, 2, 4)).map(tuple))),
    )


# ---- running a call on both engines -----------------------------------------------------------------

def timed(fn, what):
    """fn() in a thread; a call still running after CALL_TIMEOUT_S fails the test as a hang."""
    box = {}

    def run():
        try:
            box["value"] = fn()
        except BaseException as e:  # noqa: B036 - handed back to the test's thread
            box["error"] = e
    thread = threading.Thread(target=run, daemon=True, name="fuzz-call")
    thread.start()
    thread.join(CALL_TIMEOUT_S)
    assert not thread.is_alive(), f"{what} did not return within {CALL_TIMEOUT_S} s"
    if "error" in box:
        raise box["error"]
    return box["value"]


class Side:
    """One engine during one example: the handle and queue of its valid request, the requests
    an example started by chance (released afterwards)."""

    def __init__(self, engine):
        self.engine = engine
        self.handle = self.queue = None
        self.started = []  # (model name, handle) to release

    def begin(self):
        status, self.handle, self.queue = self.engine.start_request_ids(MAIN, None, PROMPT, greedy(len(PROMPT) + 4))
        assert status == OK, self.engine.last_error
        self.started.append((MAIN, self.handle))

    def resolve(self, arg):
        if isinstance(arg, _Deferred):
            return arg.setter(arg.value)
        return self.handle if arg is HANDLE else arg

    def end(self):
        for name, handle in self.started:
            self.engine.release_request(name, handle)
        self.started.clear()


def outcome(side, method, args):
    """What the call did, comparable between the engines; raises on what is not DOCUMENTED."""
    engine = side.engine
    try:
        args = tuple(side.resolve(a) for a in args)
    except ValueError:
        return "the config setter raised ValueError"  # documented; no engine call
    what = f"{type(engine).__name__}.{method}{args!r:.300}"
    if method == "arity":
        with pytest.raises(TypeError):
            timed(lambda: getattr(engine, args[0])(*args[1]), what)
        return "TypeError"
    if method in ("GetWithTimeout", "GetNoWait", "GenerateStatus", "GeneratedLength", "RequestStatInfo"):
        try:
            timed(lambda: getattr(side.queue, method)(*args), what)
        except ValueError:
            assert method == "GetWithTimeout", what
            return "ValueError"
        return "ok"
    engine.last_error = None
    result = timed(lambda: getattr(engine, method)(*args), what)
    if method == "get_model_state":
        assert isinstance(result, ModelState), what
        return result
    if method == "get_stats":  # the models and their states (the counts move with timing)
        return engine.world_size, sorted((name, m["state"]) for name, m in result["models"].items())
    if method == "call_with_reason":
        result, reason = result
        assert isinstance(reason, str) and bool(reason) == (result != OK), (what, reason)
    if method.startswith("start_request"):
        status, handle, queue = result
        # valid by chance (a list of texts: some of them): served, then released with the example
        side.started += [(args[0], h) for h in (handle if isinstance(handle, list) else [handle]) if h is not None]
        if status != OK and not isinstance(handle, list):
            assert handle is None and queue is None, what
        result = status
    assert isinstance(result, AsStatus), (what, result)
    assert result == OK or engine.last_error, (what, "refused without a reason")
    return result


def still_correct(sides, reference):
    for side in sides:
        status, handle, queue = side.engine.start_request_ids(MAIN, None, PROMPT, greedy(len(PROMPT) + NEW))
        assert status == OK, side.engine.last_error
        assert collect(queue, 60)[0] == reference, f"{type(side.engine).__name__} no longer serves correctly"
        assert side.engine.release_request(MAIN, handle) == OK


# ---- the test -------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def engines(serialized_tiny):
    from dashinfer_server.engine import Engine
    loader = serialized_tiny("llama", max_position_embeddings=API_CONTEXT)
    local, remote = Engine(), allspark.ClientEngine(startup_timeout=120)
    cfg = (loader.create_reference_runtime_config_builder(MAIN, allspark.TargetDevice.CPU, [0], max_batch=8)
           .max_length(512).kv_cache_span_size(16))
    for engine in (local, remote):
        assert engine.install_model(cfg) == OK and engine.start_model(MAIN) == OK, engine.last_error
    yield local, remote, loader
    local.close()
    remote.close()


@pytest.fixture
def quiet():
    """Thousands of refusals, each logged at ERROR: keep them out of the test's output."""
    loggers = [logging.getLogger(n) for n in ("dashinfer_client", "dashinfer_server")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.CRITICAL)
    yield
    for lg, level in zip(loggers, levels):
        lg.setLevel(level)


def test_random_bad_calls_get_the_same_status_on_both_engines(engines, quiet):
    local, remote, loader = engines
    sides = [Side(local), Side(remote)]
    status, handle, queue = local.start_request_ids(MAIN, None, PROMPT, greedy(len(PROMPT) + NEW))
    reference = collect(queue, 60)[0]  # computed once
    assert status == OK and len(reference) == NEW and local.release_request(MAIN, handle) == OK
    still_correct(sides, reference)
    done = {"calls": 0}

    @settings(max_examples=CASES * 2 // 5, deadline=None, database=None, phases=[Phase.explicit, Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(st.lists(calls(loader), min_size=2, max_size=4))
    @example([("install_model", (_changed(loader, "max_length", True),)),  # each of these once differed
              ("install_model", (_changed(loader, "model_dir", 6059),)),
              ("install_model", (_changed(loader, "max_batch", 10**6),))])  # took minutes to start
    @example([("start_request_ids", (MAIN, None, PROMPT, {**greedy(9).build(), key: value}))
              for key, value in (("lora_name", b"x"), ("stop_words_ids", [{5, 6}]), ("temperature", np.float32(0.5)),
                                 ("top_k", np.int64(3)), ("eos_token_id", np.array([5, 6])), (1, 0), (None, 0))])
    def fuzz(program):
        for side in sides:
            side.begin()
        try:
            for method, args in program:
                live = {h for side in sides for _, h in side.started}
                if any(type(a) is int and a in live for a in args):
                    continue  # a random handle that one engine happens to have given out
                got = [outcome(side, method, args) for side in sides]
                assert got[0] == got[1], f"{method}{args!r:.300}: Engine {got[0]!r}, ClientEngine {got[1]!r}"
                done["calls"] += 1
                if done["calls"] % CHECK_EVERY == 0:
                    still_correct(sides, reference)
        finally:
            for side in sides:
                side.end()

    while done["calls"] < CASES:
        fuzz()
    still_correct(sides, reference)


def _changed(loader, field, value):
    """A valid config of SPARE, one field set to `value` after build()."""
    cfg = loader.create_reference_runtime_config_builder(SPARE, allspark.TargetDevice.CPU, [0]).max_length(64).build()
    setattr(cfg, field, value)
    return cfg
