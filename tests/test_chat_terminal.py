"""`dashinfer chat` as a person at a terminal sees it, through a pseudo-terminal (pexpect): the
banner and the loading indicator, /help, /clear and /exit answered locally, Ctrl-C stopping an
answer and keeping the chat (also when its parent ignored SIGINT, as a shell's background job
does), two Ctrl-C at the prompt leaving, readline's history between chats. Answers are compared with the same model served in this process (tests/http_server.Reference)."""
import os
import signal
import sys

import pexpect
import pytest

from tests.helpers import waiting_for_input, yield_to_the_test
from tests.http_server import MAX_MODEL_LEN, cli_env, wait_for

HELLO = "Hello there"
QUESTIONS = ["Hello there", "Tell me a story", "What is it?", "Go on", "Why?"]
UP_ARROW = "\x1b[A"


def spawn_chat(tiny_model, cache, *args, sigint=signal.SIG_DFL):
    """sigint: the disposition the chat inherits (a shell's background job ignores SIGINT)."""
    env = cli_env(DASHINFER_CACHE=str(cache), TERM="xterm")
    return pexpect.spawn(sys.executable, ["-m", "dashinfer", "chat", tiny_model, *args], env=env,
                         encoding="utf-8", timeout=180, dimensions=(40, 400),
                         preexec_fn=lambda: signal.signal(signal.SIGINT, sigint))


def answer(reference, messages, max_tokens):
    ids, _, _, reason = reference.generate(reference.chat_ids(messages), max_tokens)
    return reference.text(ids), reason


def on_terminal(text):
    return text.replace("\n", "\r\n")  # the terminal's output translation (onlcr)


def ask(chat, question, expected):
    chat.expect_exact("> ")
    chat.sendline(question)
    chat.expect_exact(question)  # the terminal's echo
    chat.expect_exact(on_terminal(expected))


def test_banner_commands_and_history(tiny_model, tiny_reference, tmp_path):
    first, _ = answer(tiny_reference, [{"role": "user", "content": HELLO}], 8)
    label = os.path.basename(tiny_model)  # the model directory's name
    chat = spawn_chat(tiny_model, tmp_path, "--max-new-tokens", "8")
    chat.expect_exact(f"loading {label}")  # the indicator, before the banner
    chat.expect_exact(f"dashinfer chat: {label}. /help for commands, /exit or Ctrl-D to leave.")
    chat.expect_exact("> ")
    chat.sendline("/help")
    chat.expect_exact("/clear   forget the conversation")
    ask(chat, HELLO, first)
    # the same question after /clear gets the first answer again: the conversation is gone
    chat.expect_exact("> ")
    chat.sendline("/clear")
    chat.expect_exact("(conversation cleared)")
    ask(chat, HELLO, first)
    chat.expect_exact("> ")
    chat.sendline("/exit")
    chat.expect(pexpect.EOF)
    chat.close()
    assert chat.exitstatus == 0
    with open(os.path.join(tmp_path, "chat_history"), encoding="utf-8") as f:
        assert f.read().splitlines()[-3:] == ["/clear", HELLO, "/exit"]
    # a new chat recalls the lines of the last one with the up arrow (readline's history, kept in
    # the cache): /exit, then the question before it
    chat = spawn_chat(tiny_model, tmp_path, "--max-new-tokens", "8")
    chat.expect_exact("> ")
    chat.send(UP_ARROW)
    chat.expect_exact("/exit")
    chat.send(UP_ARROW)
    chat.expect_exact(HELLO)
    chat.send("\r")
    chat.expect_exact(on_terminal(first))
    chat.expect_exact("> ")
    chat.sendeof()
    chat.expect(pexpect.EOF)
    chat.close()
    assert chat.exitstatus == 0


@pytest.mark.parametrize("sigint", [signal.SIG_DFL, signal.SIG_IGN], ids=["default", "ignored-by-the-parent"])
def test_ctrl_c_stops_the_answer_and_twice_at_the_prompt_leaves(tiny_model, tiny_reference, tmp_path, sigint):
    long_tokens = MAX_MODEL_LEN - 64  # the reference's context holds the prompt and the answer
    # a question whose greedy answer runs to the token limit (no end of text to stop it early)
    for question in QUESTIONS:
        long_answer, reason = answer(tiny_reference, [{"role": "user", "content": question}], long_tokens)
        if reason == "length":
            break
    assert reason == "length", "no question of QUESTIONS has an answer that runs to the limit"
    short, _ = answer(tiny_reference, [{"role": "user", "content": HELLO}], 8)
    chat = spawn_chat(tiny_model, tmp_path, "--max-new-tokens", str(long_tokens), sigint=sigint)
    chat.expect_exact("> ")
    yield_to_the_test(chat.pid)  # so that a busy machine does not let the answer end before the Ctrl-C
    for _ in range(3):
        chat.sendline(question)
        chat.expect_exact(question)
        chat.expect_exact(on_terminal(long_answer[:8]))  # the answer streams...
        chat.sendintr()  # ... and Ctrl-C stops it
        if chat.expect_exact(["(answer stopped; the question is not kept)", "tokens; time to first token"]) == 0:
            break
        # the whole answer streamed before this test read its start (a busy machine), so the Ctrl-C met the
        # prompt, maybe before readline read (then it acts at the next Enter): two empty lines settle it
        chat.expect_exact("> ")
        assert wait_for(lambda: waiting_for_input(chat.pid))
        chat.sendline("")
        chat.sendline("")
        chat.sendline("/clear")  # and the question again, in a new conversation
        chat.expect_exact("(conversation cleared)")
        chat.expect_exact("> ")
    else:
        raise AssertionError("every answer ended before the Ctrl-C reached it")
    # the chat goes on, without the stopped turn: the next answer is the one of a new conversation
    chat.expect_exact("> ")
    chat.sendline("/max")
    chat.expect_exact("unknown command /max")
    ask(chat, HELLO, short)
    chat.expect_exact("> ")
    assert wait_for(lambda: waiting_for_input(chat.pid))
    chat.sendintr()
    chat.expect_exact("(Ctrl-C again, /exit or Ctrl-D to leave)")
    chat.expect_exact("> ")
    assert wait_for(lambda: waiting_for_input(chat.pid))
    chat.sendintr()
    chat.expect_exact("dashinfer chat: interrupted")
    chat.expect(pexpect.EOF)
    chat.close()
    assert chat.exitstatus == 130
