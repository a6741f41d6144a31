"""The `dashinfer` command line: expected failures are one line and a non-zero exit; chat answers
as the in-process Engine does, served here, at a launched gRPC group (--address) or at a
`dashinfer serve` (--url); serving imports no torch."""
import os
import re
import signal
import subprocess
import sys

import openai
import pytest

from tests.helpers import build_tiny_model, waiting_for_input
from tests.http_server import MAX_MODEL_LEN, TWO_NODES, Server, cli_env, free_port, http_status, wait_for

HELLO = "Hello there"


def dashinfer(*args, env=None, input=None, timeout=300):
    return subprocess.run([sys.executable, "-m", "dashinfer", *args], capture_output=True, text=True,
                          env=cli_env(**(env or {})), input=input, timeout=timeout)


def one_line_error(done, code, *words):
    assert done.returncode == code, (done.returncode, done.stderr)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert all(w in lines[0] for w in words), lines[0]


def answer(tiny_reference, messages, max_tokens=8) -> str:
    return tiny_reference.text(tiny_reference.generate(tiny_reference.chat_ids(messages), max_tokens)[0])


def test_help_lists_the_subcommands():
    done = dashinfer("--help")
    assert done.returncode == 0 and all(c in done.stdout for c in ("serve", "chat", "convert", "launch"))


@pytest.mark.parametrize("args, code, words", [
    (("serve", "/no/such/model"), 78, ["does not exist"]),
    (("serve", "--tp", "8", "/no/such/model"), 78, ["--tp 8", "NUMA node"]),
    (("chat", "/no/such/model", "hi"), 78, ["does not exist"]),
    (("convert", "/no/such/dir", "/tmp/out"), 78, ["does not exist"]),
], ids=["serve-missing-model", "serve-too-many-ranks", "chat-missing-model", "convert-missing-source"])
def test_expected_failures_are_one_line(args, code, words):
    one_line_error(dashinfer(*args, env=TWO_NODES), code, *words)


def test_the_summary_of_a_prefill_too_short_to_time_gives_no_rate():
    """The queue's wait can hold the whole time to first token: no "0 tok/s" then (the chat printed
    one for a tiny model), the rate where there is one."""
    from dashinfer_server.cli.chat import summary
    stats = dict(context_token_length=24, context_cached_length=0, generated_token_length=8,
                 time_to_first_token=1.0, context_tps=0.0, generate_tps=165.4)
    assert summary(stats) == "[8 tokens; time to first token 1 ms (24 prompt tokens); decode 165.4 tok/s]"
    stats.update(context_cached_length=16, context_tps=1307.2)
    assert "(24 prompt tokens, 16 cached, 1307 tok/s)" in summary(stats)


def test_a_model_the_engine_refuses_exits_78_with_its_reason(tiny_model):
    done = dashinfer("serve", tiny_model, "--port", str(free_port()), "--max-model-len", "999999")
    assert done.returncode == 78 and "Traceback" not in done.stderr, done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("dashinfer serve: cannot serve") and "999999" in last and "context" in last, last
    one_line_error(dashinfer("chat", tiny_model, "hi", "--tp", "1", "--threads", "-3"), 78, "thread_num")


def test_no_server_there_is_one_line():
    one_line_error(dashinfer("chat", "--url", f"http://127.0.0.1:{free_port()}", "hi"), 1, "no server at")
    one_line_error(dashinfer("chat", "--address", f"unix:///tmp/dashinfer-none-{os.getpid()}.sock", "hi"), 1,
                   "no dashinfer server answered")


def test_chat_in_process_one_answer_and_multi_turn(tiny_model, tiny_reference):
    done = dashinfer("chat", tiny_model, HELLO, "--max-new-tokens", "8")
    assert done.returncode == 0, done.stderr
    assert done.stdout == answer(tiny_reference, [{"role": "user", "content": HELLO}]) + "\n"
    assert "time to first token" in done.stderr
    done = dashinfer("chat", tiny_model, "--max-new-tokens", "8", input=f"{HELLO}\nAnd then?\n")
    assert done.returncode == 0, done.stderr
    first = answer(tiny_reference, [{"role": "user", "content": HELLO}])
    second = answer(tiny_reference, [{"role": "user", "content": HELLO}, {"role": "assistant", "content": first},
                          {"role": "user", "content": "And then?"}])
    assert done.stdout == f"> {first}\n> {second}\n> \n"


def test_chat_at_a_launched_group(tiny_model, tiny_reference, tmp_path):
    address = f"unix://{tmp_path}/group.sock"
    group = subprocess.Popen([sys.executable, "-m", "dashinfer", "launch", "--nodes", "2", "--address", address,
                              "--model-dir", tiny_model, "--model-prefix", "tiny", "--model-name", "tiny"],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=cli_env(**TWO_NODES),
                             text=True, start_new_session=True)
    try:
        for line in group.stdout:
            if "ready on" in line:
                break
        else:
            pytest.fail("the group did not start")
        done = dashinfer("chat", "--address", address, HELLO, "--max-new-tokens", "8")
        assert done.returncode == 0, done.stderr
        assert done.stdout == answer(tiny_reference, [{"role": "user", "content": HELLO}]) + "\n"
    finally:
        os.killpg(group.pid, signal.SIGTERM)
        group.wait(60)


def test_chat_at_a_server_and_serving_imports_no_torch(tiny_model, tiny_reference, tmp_path):
    server = Server(tiny_model, str(tmp_path / "serve.log"), tp=1, python_flags=["-X", "importtime"])
    try:
        server.wait_serving()
        done = dashinfer("chat", "--url", server.url, HELLO, "--max-new-tokens", "8")
        assert done.returncode == 0, done.stderr
        assert done.stdout == answer(tiny_reference, [{"role": "user", "content": HELLO}]) + "\n"
    finally:
        assert server.stop() == 0
    log = server.output()
    # a self time can be negative: another thread's imports overlap this one's (seen under load)
    imported = re.findall(r"import time:\s+-?\d+ \|\s+-?\d+ \|\s*(\S+)", log)
    assert "dashinfer_server.http.app" in imported and "dashinfer_server.model_loop" in imported, log[-4000:]  # it served
    assert not [m for m in imported if m.split(".")[0] in ("torch", "transformers")]


def test_ctrl_c_while_serving_is_one_line(tiny_model, tmp_path):
    server = Server(tiny_model, str(tmp_path / "serve.log"), tp=1)
    assert wait_for(lambda: "listening on" in server.output(), 60), server.output()
    server.proc.send_signal(signal.SIGINT)
    assert server.proc.wait(60) == 130
    server.stop()
    out = server.output()
    assert "Traceback" not in out and out.strip().splitlines()[-1] == "dashinfer serve: interrupted"


def test_sigterm_drains_while_still_listening(tiny_model, tmp_path):
    """During the drain the socket still answers, as docs/http.md's "Service life" says: /health and
    a new request 503 (a load balancer reads that, not a refused connection) while a streaming
    request runs to its end; then the process exits 0."""
    context = 4 * MAX_MODEL_LEN  # tiny_model's whole context: the answer outlasts the probes by seconds
    server = Server(tiny_model, str(tmp_path / "serve.log"), "--max-model-len", str(context), tp=1)
    try:
        server.wait_serving()
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)
        prompt = [5, 17, 101]
        length = context - len(prompt)  # the longest answer the server allows, eos banned
        stream = client.completions.create(model="tiny", prompt=prompt, max_tokens=length, temperature=0,
                                           stream=True, stream_options={"include_usage": True},
                                           extra_body={"min_tokens": length})
        chunks = [next(stream)]  # the request runs
        server.proc.send_signal(signal.SIGTERM)
        assert wait_for(lambda: "shutting down: draining" in server.output(), 60), server.output()
        assert http_status(server.url + "/health") == 503
        with pytest.raises(openai.APIStatusError) as refused:
            client.completions.create(model="tiny", prompt=prompt, max_tokens=2)
        assert refused.value.status_code == 503 and "shutting down" in refused.value.message
        chunks += list(stream)
        assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
        assert chunks[-1].usage.completion_tokens == length
        assert server.proc.wait(60) == 0
    finally:
        server.stop()
    assert "Traceback" not in server.output()


def test_convert_then_serve_the_output(tmp_path, tiny_reference):
    hf = build_tiny_model(str(tmp_path / "hf"))
    done = dashinfer("convert", hf, str(tmp_path / "out"), "--dtype", "float32", "--name", "mine")
    assert done.returncode == 0, done.stderr
    assert all(os.path.exists(tmp_path / "out" / f"mine{ext}") for ext in (".asgraph", ".asparam", ".tokenizer"))
    done = dashinfer("chat", str(tmp_path / "out"), HELLO, "--max-new-tokens", "8")
    assert done.returncode == 0, done.stderr
    assert done.stdout == answer(tiny_reference, [{"role": "user", "content": HELLO}]) + "\n"  # the same random model


def test_ctrl_c_twice_at_the_prompt_leaves_with_one_line(tiny_model):
    # SIGINT as a terminal delivers it (a test run may have left it ignored, which a child inherits)
    chat = subprocess.Popen([sys.executable, "-m", "dashinfer", "chat", tiny_model], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=cli_env(),
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        assert chat.stdout.read(2) == b"> "  # the model serves and waits for a question
        assert wait_for(lambda: waiting_for_input(chat.pid))
        chat.send_signal(signal.SIGINT)  # at the prompt: says how to leave, and asks again
        assert chat.stdout.read(2) == b"> "
        assert wait_for(lambda: waiting_for_input(chat.pid))
        chat.send_signal(signal.SIGINT)  # a second one in a row leaves
        assert chat.wait(60) == 130
        lines = [line for line in chat.stderr.read().decode().splitlines() if line]
        assert lines[1:] == ["(Ctrl-C again, /exit or Ctrl-D to leave)", "dashinfer chat: interrupted"]
        assert lines[0].startswith("dashinfer chat: ")  # the banner
    finally:
        chat.kill()
        chat.wait()


PARIS = "What is the capital of France?"


def test_convert_default_quantizes_as_serve_does(tmp_path):
    """`dashinfer convert default OUT --quant uint4` takes the groups `--quant uint4` serves with
    (32, not DashInfer's per-channel default), says what it wrote, and answers as the model that
    serve / chat --quant uint4 convert (cli/common.resolve): Paris, ending by itself (per channel,
    it looped: "Parisislouvre..."; with a 4-bit head, fp32 activations named another city)."""
    out = tmp_path / "out"
    done = dashinfer("convert", "default", str(out), "--quant", "uint4")
    assert done.returncode == 0, done.stderr
    assert "linear layers uint4 in groups of 32, the rest bfloat16" in done.stdout
    converted = dashinfer("chat", str(out), PARIS, "--max-new-tokens", "48")
    served = dashinfer("chat", "default", PARIS, "--quant", "uint4", "--max-new-tokens", "48")
    assert converted.returncode == 0 and served.returncode == 0, (converted.stderr, served.stderr)
    assert converted.stdout == served.stdout and "Paris" in converted.stdout
    generated = int(re.search(r"\[(\d+) tokens", converted.stderr).group(1))
    assert generated < 48, converted.stdout  # it ended by itself: no loop


def test_convert_help_and_group_size(tmp_path):
    from dashinfer_server.cli import convert
    done = dashinfer("convert", "--help")
    assert done.returncode == 0
    whole = " ".join(convert.__doc__.split("\n\n")[0].split())
    assert whole.endswith("--quant none gives floats.") and whole in " ".join(done.stdout.split())
    one_line_error(dashinfer("convert", "default", str(tmp_path / "o"), "--group-size", "64"), 78,
                   "--group-size needs --quant")
    hf = build_tiny_model(str(tmp_path / "hf"))
    done = dashinfer("convert", hf, str(tmp_path / "g"), "--quant", "int8", "--group-size", "-1", "--name", "t")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().endswith("linear layers int8 per channel, the rest bfloat16")
