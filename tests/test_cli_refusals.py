"""What the `dashinfer` command refuses, and how: bad flags exit 78 (a configuration error: the systemd
units do not restart on it) with argparse's one line, before any model loads; a question the model
cannot take (over the length limit, bytes that are not UTF-8) is refused with one line, and an
interactive chat goes on without it while a one-shot question exits 1."""
import subprocess
import sys

import pytest

from tests.http_server import MAX_MODEL_LEN, TWO_NODES, Server, cli_env
from tests.test_cli import HELLO, answer, dashinfer, one_line_error

NOT_UTF8 = b"caf\xe9 \xff\xfe hello"
CHAT_LIMIT = 2048  # the chat's default length limit: min(context, 2048), tiny_model's context 4096


BAD_FLAGS = [
    (["serve", "--max-model-len", "abc"], ["--max-model-len", "'abc'"]),
    (["serve", "--tp", ""], ["--tp"]),  # an empty DASHINFER_TP in the unit's ExecStart
    (["serve", "--port", "99999"], ["--port", "0 to 65535"]),
    (["serve", "--port", "-1"], ["--port", "0 to 65535"]),
    (["serve", "--max-model-len", "0"], ["--max-model-len", ">= 1"]),
    (["serve", "--grace-period", "-1"], ["--grace-period", ">= 0"]),
    (["chat", "--url", "notaurl", "hi"], ["--url", "http://HOST:PORT"]),
    (["chat", "--address", "127.0.0.1:99999", "hi"], ["--address", "0 to 65535"]),
    (["chat", "MODEL", "hi", "more"], ["at most MODEL and PROMPT"]),
    (["launch", "--address", "127.0.0.1:99999", "--dry-run"], ["--address", "0 to 65535"]),
    (["launch", "--log-format", "yaml", "--dry-run"], ["--log-format", "'yaml'"]),
    (["launch", "--log-level", "LOUD", "--dry-run"], ["--log-level", "'LOUD'"]),
    ([], ["required"]),
]


@pytest.mark.parametrize("args, words", BAD_FLAGS, ids=[" ".join(a) or "no-command" for a, _ in BAD_FLAGS])
def test_bad_flags_exit_78_with_one_line(args, words):
    # a flag taken as valid would serve the default model until the subprocess's timeout
    one_line_error(dashinfer(*args, env=TWO_NODES, timeout=120), 78, *words)


@pytest.mark.parametrize("command, bad", [("serve", ["--bogus"]), ("chat", ["--bogus"]), ("convert", ["--bogus"]),
                                          ("launch", ["--log-format", "yaml", "--dry-run"])])
def test_help_exits_0_and_a_bad_flag_78(command, bad):
    done = dashinfer(command, "--help")
    assert done.returncode == 0 and "usage:" in done.stdout, done.stderr
    one_line_error(dashinfer(command, *bad, timeout=120), 78, "error: ")


def test_chat_options_are_checked_before_the_model_loads(tiny_model):
    # the engine refused them after loading, its log line and the CLI's both printed
    one_line_error(dashinfer("chat", tiny_model, "hi", "--max-new-tokens", "0"), 78, "--max-new-tokens", ">= 1")
    one_line_error(dashinfer("chat", tiny_model, "hi", "--temperature", "-1"), 78, "--temperature", ">= 0")
    # the spawned launcher's refusal came back as "exited with code 78; its last output:" and exit 1
    one_line_error(dashinfer("chat", tiny_model, "hi", "--tp", "2", "--threads", "5", env=TWO_NODES), 78,
                   "--threads 5", "do not fit the 1 cpu(s) of node 0")


def long_question(reference, tokens):
    """A question whose chat prompt holds more than `tokens` tokens (and less than 1.5 times as many)."""
    words = 64
    while len(reference.chat_ids([{"role": "user", "content": "lorem ipsum " * words}])) <= tokens:
        words = int(words * 1.25) + 1
    question = "lorem ipsum " * words
    assert len(reference.chat_ids([{"role": "user", "content": question}])) < 1.5 * tokens
    return question


def chat_bytes(*args, stdin=b"", env=None):
    """`dashinfer chat` with arguments and stdin as bytes (not UTF-8, as a terminal may send), with
    stdin decoded strictly, as Python does outside the C locales."""
    return subprocess.run([sys.executable, "-m", "dashinfer", "chat", *args], input=stdin, capture_output=True,
                          env=cli_env(PYTHONIOENCODING="utf-8:strict", **(env or {})), timeout=300)


def refusals(stderr: bytes) -> list:
    return [line for line in stderr.decode().splitlines() if line.startswith("(refused: ")]


def test_a_question_the_model_cannot_take_is_refused_and_the_chat_goes_on(tiny_model, tiny_reference):
    question = long_question(tiny_reference, CHAT_LIMIT)
    first = answer(tiny_reference, [{"role": "user", "content": HELLO}])
    done = chat_bytes(tiny_model, "--max-new-tokens", "8",
                      stdin=question.encode() + b"\n" + NOT_UTF8 + b"\n" + HELLO.encode() + b"\n")
    assert done.returncode == 0, done.stderr
    assert done.stdout.decode() == f"> > > {first}\n> \n"  # HELLO answered as the first question: the others not kept
    lines = refusals(done.stderr)
    assert len(lines) == 2 and "Traceback" not in done.stderr.decode(), done.stderr
    assert f"max_length {CHAT_LIMIT}" in lines[0] and "not valid Unicode" in lines[1], lines
    # one-shot: one line, exit 1
    one_line_error(dashinfer("chat", tiny_model, question), 1, f"max_length {CHAT_LIMIT}")
    done = chat_bytes(tiny_model, NOT_UTF8, "--max-new-tokens", "4")
    one_line_error(subprocess.CompletedProcess(done.args, done.returncode, stderr=done.stderr.decode()), 1,
                   "not valid Unicode")
    # --max-model-len: the limit the model allows (its context), not the chat's default
    done = dashinfer("chat", tiny_model, question, "--max-new-tokens", "4", "--max-model-len", str(4 * MAX_MODEL_LEN))
    assert done.returncode == 0 and "[4 tokens" in done.stderr, done.stderr


def test_a_question_the_server_refuses_is_refused_and_the_chat_goes_on(tiny_model, tiny_reference, tmp_path):
    question = long_question(tiny_reference, MAX_MODEL_LEN)  # the server's --max-model-len
    first = answer(tiny_reference, [{"role": "user", "content": HELLO}])
    server = Server(tiny_model, str(tmp_path / "serve.log"), tp=1)
    try:
        server.wait_serving()
        done = chat_bytes("--url", server.url, "--max-new-tokens", "8",
                          stdin=question.encode() + b"\n" + NOT_UTF8 + b"\n" + HELLO.encode() + b"\n")
        assert done.returncode == 0, done.stderr
        assert done.stdout.decode() == f"> > > {first}\n> \n"
        lines = refusals(done.stderr)
        assert len(lines) == 2 and all(": 400 " in line for line in lines), done.stderr
        one_line_error(dashinfer("chat", "--url", server.url, question), 1, ": 400 ")
    finally:
        assert server.stop() == 0
