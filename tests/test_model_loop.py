"""The model loop stepped in the test's thread: a request's tokens, its end, and the engine-level
log lines (one per finished request, throughput, the scheduler's decisions at DEBUG)."""
import logging

import pytest

from dashinfer_client import AsModelRuntimeConfigBuilder, GenerateRequestStatus
from dashinfer_client.model import DashInferModel
from dashinfer_server import model_loop
from dashinfer_server.model_loop import ModelLoop
from dashinfer_server.request import ModelLimits, new_request


@pytest.fixture(scope="module")
def loop(serialized_tiny):
    """A loaded loop (no thread) of one request at a time."""
    loader = serialized_tiny("llama")
    model = DashInferModel(loader.model_output_dir, loader.serialize_model_name)
    cfg = (AsModelRuntimeConfigBuilder().model_name("tiny").model_dir(model.model_dir, model.prefix)
           .max_batch(1).max_length(64).kv_cache_span_size(16).build())
    loop = ModelLoop(model, cfg)
    loop.load()
    return loop


def start(loop, prompt, new, **options):
    limits = ModelLimits(loop.model.cfg.vocab_size, loop.cfg.max_length, loop.block_capacity)
    seq = new_request(prompt, {"max_length": len(prompt) + new, "do_sample": False,
                               "early_stopping": False, **options}, limits)
    loop.scheduler.add(seq)
    return seq


def test_requests_run_to_their_end_and_each_logs_one_line(loop, caplog, monkeypatch):
    monkeypatch.setattr(model_loop, "THROUGHPUT_LOG_S", 1e9)  # counted here, reported below
    caplog.set_level(logging.DEBUG, logger="dashinfer_server")
    loop.throughput.restart()
    a, b = start(loop, [5] * 10, 4), start(loop, [7] * 12, 3)
    while loop.scheduler.has_work():
        loop.step()
    for seq, new in ((a, 4), (b, 3)):
        assert seq.num_generated == new and seq.queue.GeneratedLength() == new
        assert seq.queue.GenerateStatus() == GenerateRequestStatus.GenerateFinished
    # max_batch 1: b waits until a has finished
    assert (loop.throughput.prompt, loop.throughput.generated) == (22, 7)
    messages = [r.getMessage() for r in caplog.records]
    assert f"admit request {a.handle}: 10 prompt tokens (0 cached), 1 running, 1 waiting, " \
           f"{len(loop.pool.blocks) - 1} KV blocks free" in messages
    assert any(m.startswith(f"admit request {b.handle}: 12 prompt tokens (0 cached), 1 running, "
                            "0 waiting") for m in messages)
    done = [m for m in messages if m.startswith(f"request {a.handle} length: ")]
    assert len(done) == 1 and "prompt 10 tokens (0 cached), generated 4, TTFT" in done[0]
    assert not any(m.startswith("throughput") for m in messages)
    monkeypatch.setattr(model_loop, "THROUGHPUT_LOG_S", 0.0)
    loop.throughput.report(0, 0)
    line = caplog.records[-1].getMessage()
    assert line.startswith("throughput: prefill ") and line.endswith("tok/s; 0 running, 0 waiting")
    assert loop.throughput.prompt == loop.throughput.generated == 0  # a new window
