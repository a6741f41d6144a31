"""Helpers of the API tests that run against both engines (test_engine_api, test_engine_sampling):
prompts, a request run alone as the reference, another model installed from the same files."""
import contextlib
import logging
import time

import numpy as np

from dashinfer_client import AsStatus, GenerateRequestStatus, TargetDevice
from tests.engine_helpers import collect, greedy

OK = AsStatus.ALLSPARK_SUCCESS
Finished, Interrupted = GenerateRequestStatus.GenerateFinished, GenerateRequestStatus.GenerateInterrupted
VOCAB = 272


def prompt_of(length, seed):
    return [int(t) for t in np.random.default_rng(seed).integers(3, VOCAB, length)]


_alone = {}


def alone(api, prompt, new, **options):
    """The ids a greedy request generates with nothing else running (computed once per setup)."""
    engine, name, loader = api
    key = (id(engine), tuple(prompt), new, tuple(sorted(options.items())))
    if key not in _alone:
        status, handle, queue = engine.start_request_ids(name, loader, prompt,
                                                         greedy(len(prompt) + new, **options))
        assert status == OK
        _alone[key] = collect(queue)[0]
        assert engine.release_request(name, handle) == OK
    return _alone[key]


def run(api, prompt, gen, model=None):
    """Start one request and drain it -> (ids, elements, queue, handle)."""
    engine, name, loader = api
    status, handle, queue = engine.start_request_ids(model or name, loader, prompt, gen)
    assert status == OK, engine_error(engine)
    ids, elements = collect(queue)
    return ids, elements, queue, handle


def engine_error(engine):
    return getattr(engine, "last_error", None)


@contextlib.contextmanager
def still_serving(api, new=160):
    """A greedy request runs across the block; it must end with its alone ids."""
    engine, name, loader = api
    prompt = prompt_of(17, 99)
    expected = alone(api, prompt, new)
    status, handle, queue = engine.start_request_ids(name, loader, prompt, greedy(len(prompt) + new))
    assert status == OK
    yield
    ids, _ = collect(queue)
    assert queue.GenerateStatus() == Finished and ids == expected
    assert engine.release_request(name, handle) == OK


def logged(caplog, *words, level=logging.WARNING, wait_s=2.0):
    """A record of this process at `level` or above names every word. A ClientEngine's spawned
    server logs through its output, read by a thread: its records get wait_s to come through."""
    deadline = time.monotonic() + wait_s
    while not any(r.levelno >= level and all(w in r.getMessage() for w in words) for r in caplog.records):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def install(api, model_name, **settings):
    """Install (and start unless start=False) another model from the same files."""
    engine, _, loader = api
    start = settings.pop("start", True)
    builder = loader.create_reference_runtime_config_builder(model_name, TargetDevice.CPU, [0],
                                                             max_batch=settings.pop("max_batch", 8))
    builder.max_length(settings.pop("max_length", 512)).kv_cache_span_size(16)
    for key, value in settings.items():
        getattr(builder, key)(value)
    assert engine.install_model(builder.build()) == OK
    if start:
        assert engine.start_model(model_name) == OK
    return model_name
