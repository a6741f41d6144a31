"""A `dashinfer serve` subprocess on a tiny model (the `tiny_model` fixture of tests/conftest.py)
and an in-process Engine reference, shared by tests/test_http.py and tests/test_cli.py."""
import contextlib
import os
import re
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

import dashinfer_client as allspark
from dashinfer_client import AsStatus

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TWO_NODES = {"DASHINFER_NUMA_NODES": "0:0;1:1"}
API_KEY = "test-key-123"
MAX_MODEL_LEN = 1024


def cli_env(**extra) -> dict:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p))
    env.update(extra)
    return env


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_status(url, headers=None) -> int:
    """The HTTP status of GET url, 0 when nothing answers."""
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers or {}), timeout=5) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except OSError:
        return 0


def wait_for(predicate, timeout=120.0, every=0.05):
    """Poll until predicate() is truthy; its last value (a bound on waiting, not a timed assert)."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(every)


class Server:
    """`python -m dashinfer serve` in a subprocess; its log goes to a file the tests can read."""

    def __init__(self, model_dir, log_path, *flags, tp=2, python_flags=()):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        self.log = open(log_path, "wb")
        cmd = [sys.executable, *python_flags, "-m", "dashinfer", "serve", model_dir, "--tp", str(tp), "--port", str(self.port),
               "--served-model-name", "tiny", "--max-model-len", str(MAX_MODEL_LEN), *flags]
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, env=cli_env(**TWO_NODES),
                                     cwd=ROOT)
        self.health_seen = []  # /health statuses while it started, in order, without repeats

    def wait_serving(self, timeout=180.0) -> None:
        def serving():
            code = http_status(self.url + "/health")
            if code and (not self.health_seen or self.health_seen[-1] != code):
                self.health_seen.append(code)
            assert self.proc.poll() is None, f"dashinfer serve exited:\n{self.output()}"
            return code == 200
        assert wait_for(serving, timeout), f"not serving after {timeout} s:\n{self.output()}"

    def output(self) -> str:
        with open(self.log_path, "rb") as f:
            return f.read().decode(errors="replace")

    def finished_lines(self) -> list:
        """(generated tokens, finish reason) of each request's log line, in order."""
        return [(int(n), why) for n, why in re.findall(r"request \S+ finished: \d+ prompt \(\d+ cached\) \+ (\d+) generated "
                                                       r"tokens.* finish_reason (\w+)", self.output())]

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self.log.close()
        return self.proc.wait()


@contextlib.contextmanager
def serving(model_dir, log_path, *flags, **options):
    """A Server serving (yielded), then stopped by SIGTERM, which must drain and exit cleanly."""
    server = Server(model_dir, log_path, *flags, **options)
    try:
        server.wait_serving()
        yield server
    finally:
        code = server.stop()
    assert code == 0, server.output()


def default_model_dir() -> str:
    """The default model's serialized files, as `dashinfer serve` takes them ({dir}/{prefix}: the
    cache directory may hold other conversions too)."""
    from dashinfer_client import default_model
    return os.path.join(*default_model.ensure_default_model("bfloat16", progress=False))


class Reference:
    """The same model in this process (Engine, one rank): what the server's answers must equal."""

    def __init__(self, model_dir, prefix="tiny"):
        from dashinfer_server.engine import Engine
        self.loader = allspark.DashInferModel(model_dir, prefix)
        self.tokenizer = self.loader.get_tokenizer()
        self.engine = Engine()
        self.runtime = (allspark.AsModelRuntimeConfigBuilder().model_name("ref").model_dir(model_dir, prefix)
                        .max_length(MAX_MODEL_LEN).max_batch(4).build())
        assert self.engine.install_model(self.runtime) == AsStatus.ALLSPARK_SUCCESS
        assert self.engine.start_model("ref") == AsStatus.ALLSPARK_SUCCESS

    def chat_ids(self, messages) -> list:
        text = self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def generate(self, prompt_ids, max_tokens, **options):
        """-> (ids, token logprobs, top logprobs, finish reason) of a greedy answer (or as options say)."""
        gen = self.loader.create_reference_generation_config_builder(self.runtime).update(
            {"do_sample": False, "top_k": 0, "max_length": len(prompt_ids) + max_tokens, **options})
        status, handle, queue = self.engine.start_request_ids("ref", None, prompt_ids, gen)
        assert status == AsStatus.ALLSPARK_SUCCESS, self.engine.last_error
        ids, lps, tops = [], [], []
        while (ele := queue.Get()) is not None:
            ids += ele.ids_from_generate
            lps += ele.token_logprobs_list
            tops += ele.log_probs_list
        reason = queue.RequestStatInfo()["finish_reason"]
        self.engine.release_request("ref", handle)
        return ids, lps, tops, reason

    def hf_tokenizer(self):
        """transformers' tokenizer of the model's files: the reference rendering of its chat template."""
        from transformers import AutoTokenizer
        return AutoTokenizer.from_pretrained(self.loader._tokenizer_path())

    def text(self, ids) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def close(self):
        self.engine.release_model("ref")
