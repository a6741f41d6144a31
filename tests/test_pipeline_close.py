"""Closing a pipeline while its requests run, at tp=1 (the in-process Engine) and tp=2 (a ClientEngine
over two simulated NUMA nodes): the requests end as stopped ('abort'), a stream goes on to that end,
later calls are refused as on any closed pipeline, and no rank, socket or shared memory is left."""
import os
import threading

import pytest

from dashinfer_client import GenerationConfig, TurbomindEngineConfig, pipeline
from tests.group_helpers import our_files, process_tree

LONG = GenerationConfig(max_new_tokens=4000, ignore_eos=True)  # far longer than the test lasts
PROMPTS = ["Tell me a story", "Shanghai is"]


@pytest.fixture(scope="module")
def model(serialized_tiny):
    loader = serialized_tiny("llama", max_position_embeddings=8192)
    return os.path.join(loader.model_output_dir, loader.serialize_model_name)


@pytest.fixture(params=[1, 2], ids=["tp1", "tp2"])
def open_pipe(request, model, monkeypatch):
    """A pipeline at tp=1 or 2 (session_len 4096); afterwards no rank runs and no file of ours is left."""
    monkeypatch.setenv("DASHINFER_NUMA_NODES", "0:0;1:1")
    before = our_files()
    pipe = pipeline(model, backend_config=TurbomindEngineConfig(tp=request.param, session_len=4096))
    server = getattr(pipe.engine, "server", None)
    yield pipe
    pipe.close()
    assert our_files() <= before, "the ranks left files behind"
    if server is not None:
        assert not process_tree(server.proc.pid), "a rank group is still running"


def test_closing_under_an_open_stream_ends_it_as_stopped(open_pipe):
    stream = open_pipe.stream_infer(PROMPTS, LONG)
    first = next(stream)
    open_pipe.close()
    rest = list(stream)
    for i in range(len(PROMPTS)):
        pieces = [p for p in [first] + rest if p.session_id == i]
        assert pieces[-1].finish_reason == "abort" and pieces[-1].generate_token_len < LONG.max_new_tokens
        assert all(p.finish_reason is None for p in pieces[:-1])
    with pytest.raises(RuntimeError, match="this pipeline is closed"):
        open_pipe("abc")


def test_closing_from_another_thread_ends_a_running_call_as_stopped(open_pipe):
    requests = open_pipe._requests
    wait, closers = requests.wait, []

    def close_then_wait(handle):  # the requests run: the call waits for them when close() comes
        if not closers:
            closers.append(threading.Thread(target=open_pipe.close))
            closers[0].start()
        wait(handle)
    requests.wait = close_then_wait
    responses = open_pipe(PROMPTS, LONG)
    closers[0].join()
    assert [r.finish_reason for r in responses] == ["abort", "abort"]
    assert all(r.generate_token_len < LONG.max_new_tokens for r in responses)
    with pytest.raises(RuntimeError, match="this pipeline is closed"):
        open_pipe(PROMPTS)
