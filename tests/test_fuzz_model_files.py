"""Model files are input: 1,050 mutated copies of the tiny model's files (GGUF, a Hugging Face
safetensors directory, the serialized .asgraph/.asparam/.tokenizer) loaded in a worker process
(tests/fuzz_worker.py), each within a time bound. Every load must end in success or the loaders'
documented ModelSerializerException: no other exception, no crash, no hang, and no allocation
beyond what the file's size justifies (the worker's address space is capped, and the rise of its
resident peak is bounded per load). The mutations (tests/model_mutations.py) are deterministic
(seed DASHINFER_FUZZ_SEED, default 0), so a failure reproduces.
"""
import json
import os
import queue
import random
import shutil
import subprocess
import sys
import threading

import pytest

from tests import model_mutations as M
from tests.gguf_builders import build_tiny_gguf
from tests.http_server import ROOT, cli_env

CASES = {"gguf": 250, "hf": 450, "serialized": 350}
HANG_S = 20.0          # a load of these sub-megabyte files that takes longer is a hang
ADDRESS_SPACE_MIB = 256  # the most a load may add to the worker's address space
WORKER_ENV = {"MALLOC_ARENA_MAX": "2", "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1",
              "RAYON_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}


@pytest.fixture(scope="module")
def pristine(tiny_checkpoint, serialized_tiny, tmp_path_factory):
    """{kind: path} of the intact tiny model in each format."""
    hf = tiny_checkpoint()
    gguf = build_tiny_gguf(str(tmp_path_factory.mktemp("fuzz-gguf") / "tiny.gguf"), hf, quant_type="Q8_0")
    serialized = serialized_tiny(name="tiny").model_output_dir
    return {"gguf": gguf, "hf": hf, "serialized": serialized}


def targets(kind, path):
    """(file inside the model, mutations that fit it) a case may pick."""
    if kind == "gguf":
        slots = M.gguf_slots(path)
        field = lambda data, rng: M.gguf_field(data, rng, slots)  # noqa: E731
        return [("", M.BLIND + (field,) * 4)]
    if kind == "hf":
        return [("model.safetensors", M.BLIND + M.SAFETENSORS), ("config.json", M.JSON),
                ("tokenizer.json", M.JSON), ("tokenizer_config.json", M.JSON), ("generation_config.json", M.JSON)]
    return [("tiny.asparam", M.BLIND + M.SAFETENSORS), ("tiny.asgraph", M.JSON),
            ("tiny.tokenizer/tokenizer.json", M.JSON), ("tiny.tokenizer/tokenizer_config.json", M.JSON)]


def materialize(kind, source, inner, data, out):
    """A copy of the model at `out` (hard links) whose file `inner` holds `data`."""
    if kind == "gguf":
        out += ".gguf"
    else:
        shutil.copytree(source, out, copy_function=os.link)
    target = os.path.join(out, inner) if inner else out
    if os.path.exists(target):
        os.remove(target)  # a link to the intact file: never write through it
    with open(target, "wb") as f:
        f.write(data)
    return out


class Worker:
    """tests/fuzz_worker.py, answering one load at a time under the hang bound."""

    def __init__(self, pristine):
        self.proc = subprocess.Popen([sys.executable, "-m", "tests.fuzz_worker"], cwd=ROOT, text=True,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                     env=cli_env(**WORKER_ENV))
        self.answers = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        for kind, path in pristine.items():  # imports and lazy set-ups happen here, unbounded
            assert self.ask({"kind": kind, "path": path}, 120)["outcome"] == "ok"
        assert self.ask({"limit_mib": ADDRESS_SPACE_MIB})["outcome"] == "ok"

    def _read(self):
        for line in self.proc.stdout:
            self.answers.put(json.loads(line))
        self.answers.put(None)  # the worker died

    def ask(self, case, timeout=HANG_S):
        self.proc.stdin.write(json.dumps(case) + "\n")
        self.proc.stdin.flush()
        try:
            answer = self.answers.get(timeout=timeout)
        except queue.Empty:
            self.close()
            return {"outcome": "hang", "error": f"no answer in {timeout} s"}
        if answer is None:
            return {"outcome": "crash", "error": f"worker exited with {self.proc.wait()}"}
        return answer

    def close(self):
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


def test_mutated_model_files_load_or_are_refused(pristine, tmp_path):
    rng = random.Random(int(os.environ.get("DASHINFER_FUZZ_SEED", "0")))
    plans = {kind: targets(kind, path) for kind, path in pristine.items()}
    sizes = {kind: _size(path) for kind, path in pristine.items()}
    worker, failures, outcomes = Worker(pristine), [], {}
    try:
        for kind, count in CASES.items():
            for i in range(count):
                inner, mutations = rng.choice(plans[kind])
                source = os.path.join(pristine[kind], inner) if inner else pristine[kind]
                with open(source, "rb") as f:
                    data, what = rng.choice(mutations)(f.read(), rng)
                path = materialize(kind, pristine[kind], inner, data, str(tmp_path / f"{kind}-{i}"))
                answer = worker.ask({"kind": kind, "path": path})
                outcomes[answer["outcome"]] = outcomes.get(answer["outcome"], 0) + 1
                bound = 32 + 16 * sizes[kind] / 2**20
                if answer["outcome"] not in ("ok", "refused") or answer.get("grew_mib", 0) > bound:
                    failures.append((kind, inner, what, answer, path))
                if answer["outcome"] in ("hang", "crash"):
                    worker.close()
                    worker = Worker(pristine)
    finally:
        worker.close()
    print(f"\n{sum(CASES.values())} mutated loads: {outcomes}")
    assert not failures, "\n".join(map(repr, failures[:40]))
    assert sum(outcomes.values()) >= 1000 and outcomes.get("refused", 0) > 300


def _size(path):
    if os.path.isfile(path):
        return os.path.getsize(path)
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(path) for f in files)


@pytest.mark.parametrize("command", ["convert", "serve"])
def test_a_bad_model_file_exits_78_with_one_line(pristine, tmp_path, command):
    """`dashinfer convert` of a truncated GGUF, `dashinfer serve` of a serialized model whose
    .asparam is truncated: EX_CONFIG (a supervisor does not restart it) and one line, no traceback."""
    if command == "convert":
        with open(pristine["gguf"], "rb") as f:
            data = f.read()
        bad = materialize("gguf", pristine["gguf"], "", data[:len(data) // 2], str(tmp_path / "half"))
        args = ["convert", bad, str(tmp_path / "out")]
    else:
        with open(os.path.join(pristine["serialized"], "tiny.asparam"), "rb") as f:
            data = f.read()
        bad = materialize("serialized", pristine["serialized"], "tiny.asparam", data[:len(data) // 2],
                          str(tmp_path / "half"))
        args = ["serve", os.path.join(bad, "tiny"), "--port", "0"]
    done = subprocess.run([sys.executable, "-m", "dashinfer", *args], cwd=ROOT, env=cli_env(),
                          capture_output=True, text=True, timeout=120)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 78 and len(lines) == 1, done.stderr
    assert lines[0].startswith(f"dashinfer {command}: ") and "truncated" in lines[0]
