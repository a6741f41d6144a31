"""ClientEngine against the in-process Engine on a tiny model: same tokens, logprobs, statuses and
messages; streaming; disconnects, a killed server, SIGTERM, and nothing left behind.

One spawned server is shared by the module; the fault tests spawn their own.
"""
import glob
import os
import signal

import numpy as np
import pytest

import dashinfer_client as allspark
from dashinfer_client import AsStatus, GenerateRequestStatus as S
from dashinfer_client.client_engine import Unavailable
from tests.group_helpers import our_files
from tests.helpers import build_tiny_model, eventually

MAX_LENGTH = 4096  # a request of this length runs for seconds: long enough to be caught running
PROMPT = [5, 17, 101, 33, 7, 250, 64, 12, 9, 44, 3, 77]


def _runtime(tiny_model, name="tiny", max_batch=8):
    return (allspark.AsModelRuntimeConfigBuilder().model_name(name).model_dir(tiny_model, "tiny")
            .max_length(MAX_LENGTH).max_batch(max_batch).build())


def _gen(max_length=60, **kw):
    options = {"top_k": 1, "max_length": max_length, "early_stopping": False, "seed": 7, **kw}
    return allspark.ASGenerationConfigBuilder().update(options)


def _drain(queue):
    """Every element Get delivers until the end: (ids, log_probs, token_logprobs, number of Gets)."""
    ids, top, tok, gets = [], [], [], 0
    while (ele := queue.Get()) is not None:
        gets += 1
        ids += ele.ids_from_generate
        top += ele.log_probs_list
        tok += ele.token_logprobs_list
    return ids, top, tok, gets


@pytest.fixture(scope="module")
def local(tiny_model):
    from dashinfer_server.engine import Engine
    engine = Engine()
    assert engine.install_model(_runtime(tiny_model)) == AsStatus.ALLSPARK_SUCCESS
    assert engine.start_model("tiny") == AsStatus.ALLSPARK_SUCCESS
    yield engine
    engine.release_model("tiny")


@pytest.fixture(scope="module")
def remote(tiny_model):
    before = our_files()
    engine = allspark.ClientEngine(startup_timeout=60)
    assert engine.install_model(_runtime(tiny_model)) == AsStatus.ALLSPARK_SUCCESS
    assert engine.start_model("tiny") == AsStatus.ALLSPARK_SUCCESS
    yield engine
    engine.close()
    assert our_files() <= before, "the spawned server left files behind"


def _server_pid(engine):
    return engine.server.proc.pid


# ---- same results as in-process ------------------------------------------------------------------

@pytest.mark.parametrize("options", [
    {"logprobs": True, "top_logprobs": 3},
    {"top_k": 20, "temperature": 0.8, "seed": 1234, "logprobs": True, "top_logprobs": 0},
    {"repetition_penalty": 1.3, "stop_words_ids": [[260, 261]], "eos_token_id": [271], "presence_penalty": 0.5},
], ids=["greedy-logprobs", "sampled", "penalty"])
def test_same_tokens_logprobs_and_stats_as_in_process(local, remote, options):
    gen = _gen(80, **options)
    out = {}
    for name, engine in (("local", local), ("remote", remote)):
        status, handle, queue = engine.start_request_ids("tiny", None, PROMPT, gen)
        assert status == AsStatus.ALLSPARK_SUCCESS and queue is not None
        assert engine.sync_request("tiny", handle) == AsStatus.ALLSPARK_SUCCESS
        out[name] = (*_drain(queue)[:3], queue.GenerateStatus(), queue.GeneratedLength(), queue.RequestStatInfo())
        assert engine.release_request("tiny", handle) == AsStatus.ALLSPARK_SUCCESS
    (ids, top, tok, status, n, stats), (r_ids, r_top, r_tok, r_status, r_n, r_stats) = out["local"], out["remote"]
    assert r_ids == ids and len(ids) == 80 - len(PROMPT)
    assert r_top == top and r_tok == tok
    if options.get("logprobs"):
        assert len(tok) == len(ids) and all(len(t) == options["top_logprobs"] for t in top)
    assert r_status == status == S.GenerateFinished and r_n == n == len(ids)
    assert r_stats.generated_token_length == len(ids) and r_stats.context_token_length == len(PROMPT)
    assert r_stats.finished_time > 0 and r_stats.time_to_first_token > 0
    assert set(r_stats) == set(stats)


def test_results_are_streamed_as_produced(remote):
    # 600 tokens: long enough that, however late this thread runs, more than one piece arrives
    status, handle, queue = remote.start_request_ids("tiny", None, PROMPT, _gen(600))
    assert status == AsStatus.ALLSPARK_SUCCESS
    assert queue.RequestStatInfo().context_token_length == len(PROMPT)  # known from the start
    first = queue.Get()
    assert first is not None and first.ids_from_generate
    assert queue.GenerateStatus() in (S.Generating, S.GenerateFinished)
    ids, _, _, gets = _drain(queue)
    assert gets >= 2, "every token arrived in one piece: not streamed"
    assert len(first.ids_from_generate) + len(ids) == 600 - len(PROMPT) == queue.GeneratedLength()
    assert queue.GetNoWait() is None and queue.GetWithTimeout(10) is None
    assert remote.release_request("tiny", handle) == AsStatus.ALLSPARK_SUCCESS


def test_stop_request_ends_a_running_request(remote):
    status, handle, queue = remote.start_request_ids("tiny", None, PROMPT, _gen(MAX_LENGTH - 1))
    assert queue.Get() is not None
    assert remote.stop_request("tiny", handle) == AsStatus.ALLSPARK_SUCCESS
    assert queue.wait_finished(10)
    assert queue.GeneratedLength() < MAX_LENGTH - 1 - len(PROMPT)
    assert remote.sync_request("tiny", handle) == AsStatus.ALLSPARK_SUCCESS
    assert remote.release_request("tiny", handle) == AsStatus.ALLSPARK_SUCCESS
    assert remote.release_request("tiny", handle) == AsStatus.ALLSPARK_ILLEGAL_REQUEST_ID


def test_sync_all_requests_and_text_requests(remote, tiny_model):
    status, handles, queues = remote.start_request_text("tiny", None, ["hello", "the capital of France"], _gen(40))
    assert status == AsStatus.ALLSPARK_SUCCESS and len(handles) == 2
    assert remote.sync_request("tiny") == AsStatus.ALLSPARK_SUCCESS
    assert all(q.GenerateStatus() == S.GenerateFinished for q in queues)
    loader = allspark.DashInferModel(tiny_model, "tiny")
    expected = len(loader.get_tokenizer()("hello")["input_ids"])
    assert queues[0].RequestStatInfo().context_token_length == expected
    status, handle, queue = remote.start_request_text("tiny", loader, "hello", _gen(40))
    assert remote.sync_request("tiny", handle) == AsStatus.ALLSPARK_SUCCESS
    assert _drain(queue)[0] == _drain(queues[0])[0] or queue.GeneratedLength() == queues[0].GeneratedLength()
    for h in handles + [handle]:
        assert remote.release_request("tiny", h) == AsStatus.ALLSPARK_SUCCESS


# ---- every refusal crosses the wire with its status and reason -----------------------------------

BAD_CALLS = {
    "unknown model": lambda e, s: e.start_model("nope"),
    "start twice": lambda e, s: e.start_model("tiny"),
    "install twice": lambda e, s: e.install_model(_runtime(s)),
    "bad config type": lambda e, s: e.install_model({"model_name": "x"}),
    "missing files": lambda e, s: e.install_model(_runtime("/nonexistent/dir", name="ghost")),
    "stop unknown handle": lambda e, s: e.stop_request("tiny", 10**9),
    "release foreign handle": lambda e, s: e.release_request("tiny", "abc"),
    "sync unknown model": lambda e, s: e.sync_request("nope", None),
    "empty prompt": lambda e, s: e.start_request_ids("tiny", None, [], _gen())[0],
    "id out of vocab": lambda e, s: e.start_request_ids("tiny", None, [1, 5000], _gen())[0],
    "negative id": lambda e, s: e.start_request_ids("tiny", None, [1, -3], _gen())[0],
    "2-d prompt": lambda e, s: e.start_request_ids("tiny", None, [[1, 2], [3, 4]], _gen())[0],
    "float prompt": lambda e, s: e.start_request_ids("tiny", None, [1.5, 2.0], _gen())[0],
    "ragged prompt": lambda e, s: e.start_request_ids("tiny", None, [[1, 2], [3]], _gen())[0],
    "numpy scalar prompt": lambda e, s: e.start_request_ids("tiny", None, np.int64(5), _gen())[0],
    "prompt too long": lambda e, s: e.start_request_ids("tiny", None, [1] * MAX_LENGTH, _gen())[0],
    "gen over limit": lambda e, s: e.start_request_ids("tiny", None, [1, 2], _gen(MAX_LENGTH + 1))[0],
    "lora": lambda e, s: e.start_request_ids("tiny", None, [1, 2], _gen(lora_name="x"))[0],
    "gen dict bad key": lambda e, s: e.start_request_ids("tiny", None, [1, 2], {"top_kk": 1})[0],
    "gen wrong type": lambda e, s: e.start_request_ids("tiny", None, [1, 2], 42)[0],
    "text not str": lambda e, s: e.start_request_text("tiny", None, 42, _gen())[0],
    "bytes model name": lambda e, s: e.start_model(b"tiny"),
    "lone surrogate name": lambda e, s: e.start_request_ids("tiny\udc80", None, [1, 2], _gen())[0],
    "bool handle": lambda e, s: e.stop_request("tiny", True),
    "unknown handle, unknown model": lambda e, s: e.release_request("nope", 10**9),
    "gen type": lambda e, s: e.start_request_ids("tiny", None, [1, 2], [1, 2])[0],
    "gen bytes key": lambda e, s: e.start_request_ids("tiny", None, [1, 2], {b"top_k": 1})[0],
    "gen int key": lambda e, s: e.start_request_ids("tiny", None, [1, 2], {1: 1, "top_k": 1})[0],
    "int model name": lambda e, s: e.release_model(3),
    "list model name": lambda e, s: e.release_model(["tiny"]),
    "bytes model name, release": lambda e, s: e.release_model(b"tiny"),
    "lone surrogate, stop": lambda e, s: e.stop_model("tiny\udc80"),
}


@pytest.mark.parametrize("case", list(BAD_CALLS))
def test_refusals_match_in_process(local, remote, tiny_model, case):
    call = BAD_CALLS[case]
    expected = call(local, tiny_model)
    got = call(remote, tiny_model)
    assert expected != AsStatus.ALLSPARK_SUCCESS
    assert got == expected
    assert remote.last_error == local.last_error


# ---- one client's oversized request hurts no other ---------------------------------------------

def test_an_oversized_request_is_refused_and_hurts_no_other_request(remote, local, monkeypatch):
    """3M ids (6 MB on the wire, over gRPC's default 4 MiB) get the Engine's answer, not a lost
    connection that restarts the group under another client's request; a request over the
    message limit is refused before it is sent."""
    from dashinfer_client.proto import wire
    pid = _server_pid(remote)
    other = allspark.ClientEngine(remote.address)
    try:
        status, _, running = other.start_request_ids("tiny", None, PROMPT, _gen(MAX_LENGTH - 1))
        first = running.Get()
        assert status == AsStatus.ALLSPARK_SUCCESS and first is not None
        huge = np.full(3_000_000, 250, dtype=np.int64)
        expected = local.start_request_ids("tiny", None, huge, _gen())[0]
        assert expected == AsStatus.ALLSPARK_EXCEED_LIMIT_ERROR
        assert remote.start_request_ids("tiny", None, huge, _gen())[0] == expected
        assert remote.last_error == local.last_error
        monkeypatch.setattr(wire, "MAX_MESSAGE_BYTES", 1000)
        status = remote.start_request_ids("tiny", None, [250] * 1000, _gen())[0]
        assert status == AsStatus.ALLSPARK_EXCEED_LIMIT_ERROR and "on the wire" in remote.last_error
        monkeypatch.undo()
        assert remote.get_stats()["models"]["tiny"]["state"] == allspark.ModelState.Running
        assert _server_pid(remote) == pid, "the group was restarted"
        ids = first.ids_from_generate + _drain(running)[0]
        assert running.GenerateStatus() == S.GenerateFinished and len(ids) == MAX_LENGTH - 1 - len(PROMPT)
    finally:
        other.close()


# ---- requests freed when their client goes -------------------------------------------------------

def test_client_disconnect_frees_its_requests(remote):
    def held():
        return remote.get_stats()["models"]["tiny"]["requests"]

    base = held()
    other = allspark.ClientEngine(remote.address)
    status, _, running = other.start_request_ids("tiny", None, PROMPT, _gen(MAX_LENGTH - 1))
    status2, _, finished = other.start_request_ids("tiny", None, PROMPT, _gen(20))
    assert status == status2 == AsStatus.ALLSPARK_SUCCESS
    assert running.Get() is not None and finished.wait_finished(10)
    assert held() == base + 2
    other.close()  # one request mid-stream, one finished but never released
    assert running.GenerateStatus() == S.GenerateInterrupted and "closed" in running.error
    assert eventually(lambda: held() == base), "the server kept the requests of a client that left"
    stats = remote.get_stats()
    assert stats["models"]["tiny"]["running"] == 0 and stats["sessions"] == 1


def test_cancelled_stream_frees_its_request(remote):
    """A bare gRPC client (no session) that cancels mid-stream: the server stops and releases it."""
    import grpc
    from dashinfer_client.proto.wire import encode_generation, pb, pb_grpc
    base = remote.get_stats()["models"]["tiny"]["requests"]
    with grpc.insecure_channel(remote.address) as channel:
        call = pb_grpc.DashInferStub(channel).StartRequest(pb.StartRequestRequest(
            model_name="tiny", input_ids=PROMPT, input_shape=[len(PROMPT)],
            generation_config_json=encode_generation(_gen(MAX_LENGTH - 1).build())))
        assert next(call).started.status == 0 and next(call).ids
        call.cancel()
    assert eventually(lambda: remote.get_stats()["models"]["tiny"]["requests"] == base)
    assert remote.get_stats()["models"]["tiny"]["running"] == 0


# ---- faults: the server killed, SIGTERM ----------------------------------------------------------

def test_killed_server_interrupts_requests_and_the_next_call_respawns(tiny_model, local):
    before = our_files()
    engine = allspark.ClientEngine(startup_timeout=60)
    watcher = allspark.ClientEngine(engine.address, reconnect_timeout=0.5)  # connected by address
    try:
        assert engine.install_model(_runtime(tiny_model)) == AsStatus.ALLSPARK_SUCCESS
        assert engine.start_model("tiny") == AsStatus.ALLSPARK_SUCCESS
        status, handle, queue = engine.start_request_ids("tiny", None, PROMPT, _gen(MAX_LENGTH - 1))
        assert queue.Get() is not None
        old_pid = _server_pid(engine)
        os.kill(old_pid, signal.SIGKILL)
        assert queue.wait_finished(10), "the queue of a request on a dead server never ended"
        assert queue.GenerateStatus() == S.GenerateInterrupted
        assert "lost the connection to the dashinfer server" in queue.error
        # A client connected by address has nothing to respawn: its calls fail with the reason
        # (the broken connection, or nobody answering when it tries again).
        assert watcher.stop_model("tiny") == AsStatus.ALLSPARK_RUNTIME_ERROR
        assert "lost the connection" in watcher.last_error or "no dashinfer server answered" in watcher.last_error
        # The spawning client's next call starts a new server and installs and starts the model again.
        status, handle2, queue2 = engine.start_request_ids("tiny", None, PROMPT, _gen(60))
        assert status == AsStatus.ALLSPARK_SUCCESS, engine.last_error
        assert _server_pid(engine) != old_pid
        assert engine.sync_request("tiny", handle2) == AsStatus.ALLSPARK_SUCCESS
        _, _, ref = local.start_request_ids("tiny", None, PROMPT, _gen(60))
        assert _drain(queue2)[0] == _drain(ref)[0]
        # The old handle names the request of the dead server (which has ended), never the new
        # server's request that may carry the same server-side number.
        assert handle2 != handle
        assert engine.stop_request("tiny", handle) == AsStatus.ALLSPARK_SUCCESS
        assert engine.sync_request("tiny", handle) == AsStatus.ALLSPARK_SUCCESS
        assert engine.release_request("tiny", handle) == AsStatus.ALLSPARK_SUCCESS
        assert engine.release_request("tiny", handle) == AsStatus.ALLSPARK_ILLEGAL_REQUEST_ID
        assert engine.release_request("tiny", handle2) == AsStatus.ALLSPARK_SUCCESS
        # The server is back at the same address: the other client reconnects to it.
        assert watcher.get_stats()["models"]["tiny"]["state"] == "Running"
    finally:
        watcher.close()
        engine.close()
    assert our_files() <= before


def _rank_pid(address, rank):
    """The pid of `rank` of the group serving `address` (by its command line and MPI environment)."""
    for proc in glob.glob("/proc/[0-9]*"):
        try:
            with open(f"{proc}/cmdline", "rb") as f:
                cmdline = f.read().decode(errors="replace")
            with open(f"{proc}/environ", "rb") as f:
                env = f.read().decode(errors="replace").split("\0")
        except OSError:
            continue
        if address in cmdline and "dashinfer_server\0" in cmdline and f"PMI_RANK={rank}" in env:
            return int(proc.rsplit("/", 1)[1])
    return None


def test_two_ranks_same_tokens_and_a_killed_rank_interrupts_then_respawns(tiny_model, local):
    """2 ranks on simulated NUMA nodes (one core each) through the launcher."""
    before = our_files() | set(glob.glob("/dev/shm/mpich_sh*"))
    engine = allspark.ClientEngine(nodes=2, env={"DASHINFER_NUMA_NODES": "0:0;1:1"}, startup_timeout=60)
    try:
        assert engine.install_model(_runtime(tiny_model)) == AsStatus.ALLSPARK_SUCCESS, engine.last_error
        assert engine.start_model("tiny") == AsStatus.ALLSPARK_SUCCESS
        _, handle, queue = engine.start_request_ids("tiny", None, PROMPT, _gen(60))
        _, _, ref = local.start_request_ids("tiny", None, PROMPT, _gen(60))
        assert engine.sync_request("tiny", handle) == AsStatus.ALLSPARK_SUCCESS
        assert _drain(queue)[0] == _drain(ref)[0]
        status, handle, queue = engine.start_request_ids("tiny", None, PROMPT, _gen(MAX_LENGTH - 1))
        assert queue.Get() is not None
        rank1 = _rank_pid(engine.address, 1)
        assert rank1 is not None
        os.kill(rank1, signal.SIGKILL)
        assert queue.wait_finished(15), "killing rank 1 left the request hanging"
        assert queue.GenerateStatus() == S.GenerateInterrupted and queue.error
        status, handle, queue = engine.start_request_ids("tiny", None, PROMPT, _gen(60))
        assert status == AsStatus.ALLSPARK_SUCCESS, engine.last_error
        assert engine.sync_request("tiny", handle) == AsStatus.ALLSPARK_SUCCESS
        assert queue.GenerateStatus() == S.GenerateFinished
    finally:
        engine.close()
    assert our_files() | set(glob.glob("/dev/shm/mpich_sh*")) <= before, "the groups left files behind"


def test_nothing_at_the_address_is_a_clear_error():
    with pytest.raises(Unavailable, match="no dashinfer server answered at unix:///nonexistent/x.sock .*"
                                          "No such file or directory"):
        allspark.ClientEngine("unix:///nonexistent/x.sock", startup_timeout=0.3)


def test_garbage_collected_client_stops_its_server():
    import gc
    engine = allspark.ClientEngine(startup_timeout=60)
    proc, socket_path = engine.server.proc, engine.server.socket
    del engine
    gc.collect()
    assert proc.poll() is not None and not os.path.exists(socket_path)


def test_sigterm_drains_running_requests_and_exits_zero(tiny_model):
    engine = allspark.ClientEngine(startup_timeout=60)
    try:
        assert engine.install_model(_runtime(tiny_model)) == AsStatus.ALLSPARK_SUCCESS
        assert engine.start_model("tiny") == AsStatus.ALLSPARK_SUCCESS
        queues = [engine.start_request_ids("tiny", None, PROMPT, _gen(800))[2] for _ in range(3)]
        assert all(q.Get() is not None for q in queues)
        server = engine.server
        server.proc.send_signal(signal.SIGTERM)
        assert server.proc.wait(30) == 0
        assert "draining: waiting up to 30 s" in server.describe_exit(), "nothing was running at SIGTERM"
        for queue in queues:
            assert queue.wait_finished(5)
            assert queue.GenerateStatus() == S.GenerateFinished, queue.error
            assert queue.GeneratedLength() == 800 - len(PROMPT)
        assert not os.path.exists(server.socket)
    finally:
        engine.close()


def test_serialize_to_memory_through_a_client_engine(remote, local, tmp_path):
    hf = build_tiny_model(str(tmp_path / "hf"), seed=3)
    loader = allspark.HuggingFaceModel(hf, "mem", user_set_data_type="float32", in_memory_serialize=True)
    loader.load_model().read_model_config().serialize_to_memory(remote).free_model()
    rt = loader.create_reference_runtime_config_builder("mem", allspark.TargetDevice.CPU, [0], max_batch=2)
    rt = rt.max_length(128).build()
    try:
        assert remote.install_model(rt) == AsStatus.ALLSPARK_SUCCESS, remote.last_error
        assert remote.start_model("mem") == AsStatus.ALLSPARK_SUCCESS
        status, handle, queue = remote.start_request_text("mem", loader, "hi there", _gen(30))
        assert status == AsStatus.ALLSPARK_SUCCESS and remote.sync_request("mem", handle) == 0
        assert queue.GeneratedLength() == 30 - queue.RequestStatInfo().context_token_length
    finally:
        remote.release_model("mem")
        loader.free_memory_serialize_file()

