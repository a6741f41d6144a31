"""The interactive side of `dashinfer chat`: the banner, the loading indicator, the turns and their
local commands (/help, /clear, /exit), Ctrl-C, and the readline history.

Ctrl-C during an answer stops that answer and keeps the chat; at the prompt it says how to leave,
and a second one in a row leaves. For that the main thread must be the one that gets SIGINT: the
kernel hands a process's signal to any thread that does not block it, and a main thread waiting
in read() never sees one taken by an engine thread. So the model loads in a thread that blocks
SIGINT, and every thread it starts (the engine's loop, OpenMP's workers, gRPC's) inherits the mask.
"""
import os
import signal
import sys
import threading
import time

from .common import CliError

HELP = """/help    this list
/clear   forget the conversation so far (the next question starts a new one)
/exit    leave (also Ctrl-D, or Ctrl-C twice at the prompt)
Ctrl-C during an answer stops it; up and down arrows recall earlier questions."""
HISTORY_LINES = 1000


def take_ctrl_c() -> None:
    """Ctrl-C raises KeyboardInterrupt here when the chat runs on a terminal, even if whatever
    started it ignored SIGINT: a shell's background job does, and Python keeps an ignored SIGINT
    ignored at start-up, so Ctrl-C would neither stop an answer nor leave. Off a terminal the
    disposition the chat was given stays (nohup and scripts mean it)."""
    if _is_terminal(sys.stdin) and signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def load_in_background(load, label):
    """load() in a thread that leaves SIGINT to the main thread (see the module's docstring), with
    a loading indicator on a terminal's stderr meanwhile; returns what load() returns. Ctrl-C
    while it loads interrupts the wait (the loading thread is a daemon: it ends with the process)."""
    done = {}

    def target():
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        try:
            done["value"] = load()
        except BaseException as e:  # handed to the main thread, which raises it
            done["error"] = e

    loader = threading.Thread(target=target, name="dashinfer-chat-load", daemon=True)
    loader.start()
    with _Indicator(f"loading {label}"):
        while loader.is_alive():
            loader.join(0.1)
    if "error" in done:
        raise done["error"]
    return done["value"]


class _Indicator:
    """A spinner with the seconds elapsed on stderr's last line while the block runs, erased at
    its end; nothing when stderr is not a terminal (a log or a pipe keeps only real lines)."""
    FRAMES = "|/-\\"

    def __init__(self, text):
        self.text, self.stop = text, threading.Event()
        self.thread = None

    def __enter__(self):
        if _is_terminal(sys.stderr):
            self.thread = threading.Thread(target=self._spin, name="dashinfer-chat-indicator", daemon=True)
            self.thread.start()
        return self

    def _spin(self):
        begin, frame = time.monotonic(), 0
        while True:  # the first frame at once: a load shorter than a frame still shows
            sys.stderr.write(f"\r{self.text} {self.FRAMES[frame % 4]} {time.monotonic() - begin:.0f} s")
            sys.stderr.flush()
            frame += 1
            if self.stop.wait(0.1):
                return

    def __exit__(self, *exc):
        if self.thread is not None:
            self.stop.set()
            self.thread.join()
            sys.stderr.write("\r\033[K")
            sys.stderr.flush()


def _is_terminal(stream) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # a replaced or closed stream
        return False


class QuestionRefused(CliError):
    """The model or the server refused this question before answering (over the length limit, not
    valid text): a chat drops it and goes on, a one-shot question exits with it."""


def converse(ask, label, history_path=None) -> None:
    """Turns until /exit, Ctrl-D or two Ctrl-C at the prompt (KeyboardInterrupt); the
    conversation so far goes with each question. ask(messages) streams an answer and returns it,
    or raises QuestionRefused."""
    print(f"dashinfer chat: {label}. /help for commands, /exit or Ctrl-D to leave.", file=sys.stderr, flush=True)
    if hasattr(sys.stdin, "reconfigure"):
        # a line that is not UTF-8 reaches the tokenizer, which refuses it by name, where input()
        # would raise UnicodeDecodeError (stdin decodes strictly outside the C locales)
        sys.stdin.reconfigure(errors="surrogateescape")
    history = _History(history_path) if _is_terminal(sys.stdin) else None
    messages, interrupted = [], False
    try:
        while True:
            try:
                question = input("> ")
            except EOFError:
                print()
                return
            except KeyboardInterrupt:
                if interrupted:
                    print(file=sys.stderr)
                    raise
                interrupted = True
                print("\n(Ctrl-C again, /exit or Ctrl-D to leave)", file=sys.stderr, flush=True)
                continue
            interrupted = False
            command = question.strip()
            if not command:
                continue
            if command.startswith("/"):
                if _command(command, messages):
                    return
                continue
            messages.append({"role": "user", "content": question})
            try:
                messages.append({"role": "assistant", "content": ask(messages)})
            except KeyboardInterrupt:  # the answer stops (ask's cleanup stops the request); the chat goes on
                messages.pop()
                print("\n(answer stopped; the question is not kept)", file=sys.stderr, flush=True)
            except QuestionRefused as e:
                messages.pop()
                # a conversation grown past the limit refuses every question until /clear
                hint = "; /clear forgets the conversation so far" if messages else ""
                print(f"(refused: {e}; the question is not kept{hint})", file=sys.stderr, flush=True)
    finally:
        if history is not None:
            history.save()


def _command(command, messages) -> bool:
    """Handle a /command here; True when it asks to leave."""
    name = command.split()[0].lower()
    if name in ("/exit", "/quit", "/bye"):
        return True
    if name == "/clear":
        messages.clear()
        print("(conversation cleared)", file=sys.stderr, flush=True)
    elif name in ("/help", "/?"):
        print(HELP, file=sys.stderr, flush=True)
    else:
        print(f"unknown command {name}: /help lists them", file=sys.stderr, flush=True)
    return False


class _History:
    """readline's line editing and history for input(), kept in a file between chats."""

    def __init__(self, path):
        self.path, self.readline = path, None
        try:
            import readline
        except ImportError:  # a Python built without readline: plain input()
            return
        self.readline = readline
        readline.set_history_length(HISTORY_LINES)
        if path and os.path.isfile(path):
            try:
                readline.read_history_file(path)
            except OSError:
                pass  # an unreadable history is no reason to refuse a chat

    def save(self):
        if self.readline is None or not self.path:
            return
        try:
            os.makedirs(os.path.dirname(self.path), exist_ok=True)
            self.readline.write_history_file(self.path)
        except OSError:
            pass
