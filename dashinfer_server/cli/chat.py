"""`dashinfer chat [MODEL] [PROMPT]`: one answer to PROMPT, or a multi-turn chat without one.

The model is served here (--tp 1: in this process; --tp N: N ranks), or reached where it already
runs: --address (a gRPC rank group, e.g. the systemd service) or --url (a `dashinfer serve`).
The answer streams to stdout; a one-line summary (time to first token, speeds) goes to stderr.
With a single word, it is MODEL when it names one (an existing path or the default model's name),
else PROMPT.
"""
import contextlib
import json
import logging
import os
import sys
import urllib.error
import urllib.request

from dashinfer_client import settings
from dashinfer_server.arguments import at_least, grpc_address, http_url

from .chat_terminal import QuestionRefused, converse, load_in_background, take_ctrl_c
from .common import (CONFIG_ERROR, DEFAULT_NAMES, CliError, add_engine_options, add_model_options, check_ranks,
                     first_paragraph, resolve)


def add_parser(sub) -> None:
    p = sub.add_parser("chat", help="chat with a model (served here, or at --address / --url)",
                       description=first_paragraph(__doc__))
    p.add_argument("words", nargs="*", metavar="[MODEL] [PROMPT]")
    where = p.add_mutually_exclusive_group()
    where.add_argument("--address", type=grpc_address, help="a running gRPC rank group (unix:///path.sock or HOST:PORT)")
    where.add_argument("--url", type=http_url, help="a running dashinfer serve (http://HOST:PORT)")
    add_engine_options(p)
    add_model_options(p)
    p.add_argument("--model-name", default=None, help="with --address / --url: which served model")
    p.add_argument("--api-key", default=settings.get("DASHINFER_API_KEY"), help="with --url")
    p.add_argument("--max-new-tokens", type=at_least(1), default=256)
    p.add_argument("--temperature", type=at_least(0, float), default=0.0, help="0: greedy (default)")
    p.add_argument("--seed", type=int, default=None)
    p.set_defaults(run=run)


def run(args) -> int:
    take_ctrl_c()
    with _engine_logs_quiet():
        return _chat(args)


@contextlib.contextmanager
def _engine_logs_quiet():
    """The chat says why it refuses a question in one line; the engines' warnings would say it
    again. Their levels come back after (a caller of cli.main in its own process keeps its logs)."""
    loggers = [logging.getLogger(name) for name in ("dashinfer_client", "dashinfer_server")]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for logger, level in zip(loggers, levels):
            logger.setLevel(level)


def _chat(args) -> int:
    model, prompt = _split(args.words, remote=bool(args.address or args.url))
    options = {"max_tokens": args.max_new_tokens, "temperature": args.temperature}
    if args.seed is not None:
        options["seed"] = args.seed
    if args.url:
        ask = _HttpChat(args.url, args.api_key, args.model_name, options)
        close, label = None, f"{ask.model} at {args.url}"
    else:
        served = _open(model, args)
        ask, close = _EngineChat(served, options), served.close
        label = f"{served.name} at {args.address}" if args.address else _label(model)
    try:
        if prompt is not None:
            ask([{"role": "user", "content": prompt}])
            return 0
        from dashinfer_client.model_cache import cache_root
        converse(ask, label, history_path=os.path.join(cache_root(), "chat_history"))
        return 0
    finally:
        if close:
            close()


def _label(model) -> str:
    from dashinfer_client.default_model import MODEL_NAME
    return MODEL_NAME if model is None or model in DEFAULT_NAMES else os.path.basename(os.path.normpath(model))


def _split(words, remote):
    if len(words) > 2:
        raise CliError("expected at most MODEL and PROMPT (quote the prompt)", CONFIG_ERROR)
    if len(words) == 2:
        return words
    if len(words) == 1 and not remote and (os.path.exists(words[0]) or words[0] in DEFAULT_NAMES):
        return words[0], None
    return None, words[0] if words else None


def _open(model, args):
    """The ServedModel to chat with, loaded in a thread that leaves Ctrl-C to this one
    (chat_terminal.load_in_background), a loading indicator meanwhile."""
    from dashinfer_server.http.served import ServedModel
    if args.address:
        import dashinfer_client as allspark
        from dashinfer_client.client_engine import Unavailable
        try:
            return load_in_background(lambda: ServedModel.attach(allspark.ClientEngine(args.address, startup_timeout=10),
                                                                 args.model_name), args.address)
        except (Unavailable, RuntimeError) as e:
            raise CliError(str(e).splitlines()[0]) from None
    check_ranks(args.tp, args.threads)
    model_dir, prefix = resolve(model, args.dtype, args.quant)
    served = None
    try:
        served = ServedModel(model_dir, prefix, "default", tp=args.tp, threads=args.threads, max_batch=1,
                             max_length=args.max_model_len)
        load_in_background(served.load, _label(model))
    except (RuntimeError, ValueError) as e:  # ValueError: an option or a limit the engine refuses
        if served is not None:
            served.close()
        raise CliError(str(e).splitlines()[0], CONFIG_ERROR if isinstance(e, ValueError) else 1) from None
    return served


class _EngineChat:
    """Answers from a ServedModel (this process's Engine, or a ClientEngine's ranks)."""

    def __init__(self, served, options):
        self.served, self.options = served, options

    def __call__(self, messages) -> str:
        from dashinfer_client.types import GenerateRequestStatus
        from dashinfer_server.http.errors import ApiError
        from dashinfer_server.http.generate import output_processor
        from dashinfer_server.http.protocol import parse_chat
        served = self.served
        try:
            job = parse_chat(dict(self.options, model=served.name, messages=messages), served)
            handle, queue = served.start(job)
        except ApiError as e:  # 400: this question (its length); else the model (stopped, draining)
            raise (QuestionRefused if e.http_status == 400 else CliError)(e.message) from None
        except ValueError as e:  # the tokenizer's: text that is not valid Unicode (bytes that were not UTF-8)
            raise QuestionRefused(str(e)) from None
        output, text = output_processor(served, job), []

        def show(delta):  # the reasoning is shown, but only the answer goes back in the history
            text.append(delta.text)
            sys.stdout.write(delta.reasoning + delta.text)
            sys.stdout.flush()
        try:
            while (elements := queue.Get()) is not None:
                show(output.push(elements))
            show(output.finish(queue.RequestStatInfo()["finish_reason"]))
        finally:
            served.finish(handle, queue)
        print(flush=True)
        if queue.GenerateStatus() != GenerateRequestStatus.GenerateFinished:
            raise CliError(f"generation interrupted: {queue.error}")
        print(summary(queue.RequestStatInfo()), file=sys.stderr)
        return "".join(text)


def summary(stats) -> str:
    """The answer's one line: a prefill too short to time (within the queue's wait) has no rate."""
    prompt, cached, new = stats["context_token_length"], stats["context_cached_length"], \
        stats["generated_token_length"]
    rate = f", {stats['context_tps']:.0f} tok/s" if stats["context_tps"] > 0 else ""
    return (f"[{new} tokens; time to first token {stats['time_to_first_token']:.0f} ms "
            f"({prompt} prompt tokens{f', {cached} cached' if cached else ''}{rate}); "
            f"decode {stats['generate_tps']:.1f} tok/s]")


class _HttpChat:
    """Answers from a `dashinfer serve` (or any OpenAI-compatible server), streamed."""

    def __init__(self, url, api_key, model, options):
        self.url = url.rstrip("/")
        self.headers = {"Content-Type": "application/json"}
        if api_key:
            self.headers["Authorization"] = f"Bearer {api_key}"
        self.model = model or self._only_model()
        self.options = options

    def _open(self, path, body=None):
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.url + path, data=data, headers=self.headers)
        try:
            return urllib.request.urlopen(request, timeout=600)
        except urllib.error.HTTPError as e:
            try:
                message = json.loads(e.read())["error"]["message"]
            except (ValueError, KeyError, TypeError):
                message = e.reason
            refusal = QuestionRefused if e.code == 400 else CliError  # 400: this question; else the server
            raise refusal(f"{self.url}{path}: {e.code} {message}") from None
        except (urllib.error.URLError, OSError) as e:
            raise CliError(f"no server at {self.url}: {getattr(e, 'reason', e)}") from None

    def _only_model(self) -> str:
        with self._open("/v1/models") as r:
            return json.loads(r.read())["data"][0]["id"]

    def __call__(self, messages) -> str:
        body = dict(self.options, model=self.model, messages=messages, stream=True,
                    stream_options={"include_usage": True})
        text = []
        with self._open("/v1/chat/completions", body) as r:
            for line in r:
                line = line.decode().strip()
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                event = json.loads(line[len("data: "):])
                if "error" in event:
                    raise CliError(event["error"]["message"])
                for choice in event.get("choices", []):
                    piece = choice.get("delta", {}).get("content") or ""
                    text.append(piece)
                    sys.stdout.write(piece)
                    sys.stdout.flush()
        print(flush=True)
        return "".join(text)
