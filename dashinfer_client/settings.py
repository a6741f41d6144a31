"""Every environment variable dashinfer-py reads, declared once: its type, default, what it
accepts, who reads it and what it means (docs/deployment.md's table is written from REGISTRY by
`python -m dashinfer_client.settings --doc`; tests/test_settings.py keeps the two in agreement).

One rule for a bad value: `check_environment()` runs when a process starts (the `dashinfer`
commands, the launcher, a rank, `Engine`, `ClientEngine`) and refuses a variable that does not
parse with a one-line `SettingError` naming it and what it accepts; `get(name)` applies the same
check where the value is read. Unset or empty means the default. Stdlib only: setup.py loads this
file by path to read DASHINFER_BUILD_JOBS and DASHINFER_BUILD_ISA before the package is built.

The C kernels read no variable: DASHINFER_ISA and DASHINFER_AMX are read here and passed to
native.set_isa / set_amx by dashinfer_server/kernels.py.
"""
import os
import re
import string
import sys
from dataclasses import dataclass

_FLAG_WORDS = {"1": True, "true": True, "yes": True, "on": True,
               "0": False, "false": False, "no": False, "off": False}


# What a token may hold: it travels as call metadata, "Bearer <token>", where gRPC refuses to send a
# newline or non-ASCII (saying only "Invalid metadata").
TOKEN_CHARS = frozenset(string.ascii_letters + string.digits + string.punctuation)


class SettingError(ValueError):
    """An environment variable set to a value it does not accept (the message is one line)."""


@dataclass(frozen=True)
class Setting:
    name: str
    kind: str            # int, float, flag, choice, text, nodes, token
    default: object      # the value when unset (None: none)
    read_by: str
    doc: str
    default_doc: str = ""   # the default as the table words it, where the value alone does not say it
    choices: tuple = ()
    minimum: float = 0
    maximum: float = None

    def accepts(self) -> str:
        """What a value must be, as the error and the table say it."""
        bound = f">= {self.minimum:g}" + (f" and <= {self.maximum:g}" if self.maximum is not None else "")
        return {"int": f"an integer {bound}", "float": f"a number {bound}",
                "flag": "1/true/yes/on or 0/false/no/off",
                "choice": "one of " + ", ".join(self.choices),
                "nodes": "node:cpulist;... (e.g. 0:0-3;1:4-7)", "text": "any text",
                "token": "printable ASCII without spaces"}[self.kind]

    def parse(self, text: str):
        """The value of `text` (not empty); SettingError when this setting does not accept it."""
        value = text.strip()
        try:
            if self.kind == "int":
                parsed = int(value)
            elif self.kind == "float":
                parsed = float(value)
                if parsed != parsed:
                    raise ValueError
            elif self.kind == "flag":
                parsed = _FLAG_WORDS[value.lower()]
            elif self.kind == "choice":
                parsed = {c.lower(): c for c in self.choices}[value.lower()]
            elif self.kind == "nodes":
                # the form only: what the nodes hold is checked by dashinfer_server.topology
                if not all(re.fullmatch(r"\s*\d+\s*:[\d,\-\s]*", item) for item in value.split(";") if item.strip()):
                    raise ValueError
                parsed = value
            elif self.kind == "token":
                if not set(value) <= TOKEN_CHARS:
                    raise ValueError
                parsed = value
            else:
                parsed = value
        except (ValueError, KeyError):
            raise SettingError(f"{self.name}={text!r}: expected {self.accepts()}") from None
        if self.kind in ("int", "float") and (parsed < self.minimum or
                                              (self.maximum is not None and parsed > self.maximum)):
            raise SettingError(f"{self.name}={text!r}: expected {self.accepts()}")
        return parsed

    def shown_default(self) -> str:
        if self.default_doc:
            return self.default_doc
        return "none" if self.default is None else f"`{self.default}`"


REGISTRY = {s.name: s for s in (
    Setting("DASHINFER_PYTHON", "text", "python3", "`launch/dashinfer-launch`",
       "the Python whose environment has dashinfer-py, mpi4py and mpich"),
    Setting("DASHINFER_NODES", "int", 0, "launcher", "ranks (one per NUMA node)", "every node"),
    Setting("DASHINFER_THREADS_PER_RANK", "int", 0, "launcher", "OpenMP threads per rank",
       "the physical cores of its node"),
    Setting("DASHINFER_ADDRESS", "text", None, "launcher",
       "gRPC address of rank 0: `unix:///path.sock` or `HOST:PORT`",
       "a unix socket in `$XDG_RUNTIME_DIR` or `/tmp/dashinfer-<uid>/` (0700)"),
    Setting("DASHINFER_TOKEN", "token", None, "rank 0, `ClientEngine`, `dashinfer serve --tp N`",
       "the token every gRPC call must carry ([security.md](security.md)); required beyond loopback"),
    Setting("DASHINFER_TOKEN_FILE", "text", None, "rank 0", "a file holding `DASHINFER_TOKEN`"),
    Setting("DASHINFER_ADMIN_TOKEN", "token", None, "rank 0",
       "the token of model calls (install, start, stop, release); without one they are allowed on "
       "a unix socket only"),
    Setting("DASHINFER_ADMIN_TOKEN_FILE", "text", None, "rank 0", "a file holding `DASHINFER_ADMIN_TOKEN`"),
    Setting("DASHINFER_TLS_CA", "text", None, "`ClientEngine`", "the CA certificate (PEM) to connect with TLS",
       "none: plain"),
    Setting("DASHINFER_API_KEY", "text", None, "`dashinfer serve`, `dashinfer chat --url`",
       "the bearer token every `/v1` route requires (`--api-key`)", "none: no key asked"),
    Setting("DASHINFER_MAX_WAITING", "int", 128, "`dashinfer serve`",
       "requests queued beyond `--max-batch` before new ones get 429 + `Retry-After` "
       "(`--max-waiting`; [http.md](http.md))"),
    Setting("DASHINFER_REQUEST_TIMEOUT", "float", 0.0, "`dashinfer serve`",
       "seconds a request may take when its body names no `timeout`; it then ends with "
       "`finish_reason` `timeout` (`--request-timeout`)", "`0`: none"),
    Setting("DASHINFER_MAX_WAIT_STEPS", "int", 4, "every model loop",
       "steps in which shorter prompts may overtake a waiting prompt before it goes first "
       "(`0`: first come first served)"),
    Setting("DASHINFER_PROMPT_STEP_TOKENS", "int", 32, "every model loop",
       "while prompts wait, steps run prompts only, whole ones shortest first until a step reaches "
       "this many tokens (each step then ends at a first token); decodes wait at most "
       "`max_prefill_length` tokens of work (512 by default) for their next token (`0`: decodes run "
       "in every step)"),
    Setting("DASHINFER_STREAM_INTERVAL_MS", "float", 20.0, "rank 0 (gRPC service)",
       "least milliseconds between two events of a client session's stream (first tokens and ends "
       "go at once); fewer wake-ups on the cores the kernels use; `0`: every event as soon as the "
       "writer wakes", "`20`"),
    Setting("DASHINFER_KEEPALIVE_MS", "int", 30000, "rank 0 (gRPC server), `ClientEngine`",
       "each end of a gRPC connection pings it after this long without hearing from the other; the server "
       "accepts a client's pings as often as every quarter of this (of the default, if this is larger)",
       "`30000`", minimum=1),
    Setting("DASHINFER_KEEPALIVE_TIMEOUT_MS", "int", 20000, "rank 0 (gRPC server), `ClientEngine`",
       "a ping unanswered this long ends the connection: a client that vanished without closing it "
       "(power loss, a partition, a NAT that dropped it) loses its session and its requests, a "
       "`ClientEngine` whose server vanished ends its requests as interrupted", "`20000`", minimum=1),
    Setting("DASHINFER_ADAPTIVE_THREADS", "flag", True, "every rank",
       "off keeps the configured kernel thread count; on, the count follows the cores other "
       "processes leave free (checked every 0.25 s)", "`1`"),
    Setting("DASHINFER_MODEL_DIR", "text", None, "launcher", "the serialized model to install and start at "
       "launch: its directory", "none: clients install models"),
    Setting("DASHINFER_MODEL_PREFIX", "text", None, "launcher", "the serialized model's file prefix"),
    Setting("DASHINFER_MODEL_NAME", "text", None, "launcher", "the name it is served under"),
    Setting("DASHINFER_LOG_LEVEL", "choice", None, "launcher", "the least level logged", "`INFO`",
       choices=("DEBUG", "INFO", "WARNING", "ERROR")),
    Setting("DASHINFER_LOG_FORMAT", "choice", None, "launcher", "`json`: one object per line", "`text`",
       choices=("text", "json")),
    Setting("DASHINFER_NUMA_NODES", "nodes", None, "ranks, launcher",
       "nodes to use instead of sysfs; memory is bound only to nodes that exist", "sysfs"),
    Setting("DASHINFER_NODE", "int", None, "each rank", "the node this rank runs on (set by the launcher)",
       "the rank-th node"),
    Setting("DASHINFER_THREADS", "int", 0, "each rank", "OpenMP threads of a rank started without "
       "`--threads`", "the physical cores of its node"),
    Setting("DASHINFER_MEMBIND", "choice", "bind", "each rank", "memory policy on its node",
       choices=("bind", "preferred", "none")),
    Setting("DASHINFER_ALLREDUCE", "choice", "auto", "ranks",
       "`auto`: shared memory when every rank is on this host, else MPI", choices=("auto", "shm", "mpi")),
    Setting("DASHINFER_ALLREDUCE_TIMEOUT", "float", 60.0, "ranks",
       "seconds a rank waits for a peer before failing the group", "`60`", minimum=0.001),
    Setting("DASHINFER_MOE_SPLIT", "choice", "intermediate", "ranks",
       "how a mixture-of-experts layer's experts are spread over the ranks: `intermediate` (every "
       "expert's rows split, as a dense MLP's) or `experts` (whole experts dealt out: rank r of R holds r, r+R, ...)",
       choices=("intermediate", "experts")),
    Setting("DASHINFER_MEMORY_LIMIT_MB", "int", 0, "every rank, conversions",
            "the memory (MiB) a rank's weights, KV cache and workspaces, or a conversion, may take: more "
            "is refused before loading or converting", "what the node can give (MemAvailable, within the cgroup's "
            "limit)"),
    Setting("DASHINFER_ISA", "choice", None, "kernels", "cap the kernel path", "the best the CPU has",
       choices=("portable", "avx2", "avx512")),
    Setting("DASHINFER_AMX", "choice", None, "kernels",
       "how GEMMs of bf16 weights (5 rows or more) and of int8/uint4 weights (i8q/u4q, 32 rows or "
       "more) run: `tiles` (AMX, on the `avx512` path; quantized panels dequantized to bf16 a k "
       "chunk at a time), `off` (the ISA path's own kernels, VNNI's int8 ones for i8q/u4q), "
       "`emulated` (AMX's driver with the tile multiply in plain C, on any path: slow, for tests "
       "on CPUs without AMX)",
       "`tiles` where the CPU has AMX and Linux grants the tile state, else `off`",
       choices=("off", "tiles", "emulated")),
    Setting("DASHINFER_CACHE", "text", None, "default model, conversions",
       "where the default model is downloaded and converted models are kept", "`~/.cache/dashinfer-py`"),
    Setting("DASHINFER_QUIET", "flag", False, "conversions, default model", "on: no progress output", "off"),
    Setting("DASHINFER_BUILD_JOBS", "int", None, "`setup.py`", "C files compiled at once",
       "the cpus", minimum=1),
    Setting("DASHINFER_BUILD_ISA", "choice", "native", "`setup.py`",
       "which ISA variants of the kernels to compile: `native`, those this CPU runs (the AVX-512 files "
       "are left out on a CPU without the `avx512` path); `all`, every one (CI, or a build for other "
       "machines)", choices=("native", "all")),
    Setting("DASHINFER_MODEL", "text", "SmolLM2-135M-Instruct", "`dashinfer-http.service`",
       "what `dashinfer serve` serves: a HF directory, a GGUF file, a serialized model directory or "
       "the default model's name"),
    Setting("DASHINFER_TP", "int", 1, "`dashinfer-http.service`", "`--tp`: ranks serving the model", minimum=1),
    Setting("DASHINFER_HOST", "text", "127.0.0.1", "`dashinfer-http.service`", "where the HTTP server listens"),
    Setting("DASHINFER_PORT", "int", 8000, "`dashinfer-http.service`", "the port it listens on",
       minimum=1, maximum=65535),
    Setting("DASHINFER_SERVE_ARGS", "text", None, "`dashinfer-http.service`", "further flags of `dashinfer serve`"),
    Setting("AS_NUMA_NUM", "int", None, "a `ClientEngine` that spawns its group",
       "DashInfer's: ranks, one per NUMA node (the `nodes=` argument wins)", "every node", minimum=1),
    Setting("AS_NUMA_OFFSET", "int", None, "a `ClientEngine` that spawns its group",
       "DashInfer's: the id of the first node the ranks take", "`0`"),
    Setting("AS_DAEMON_PATH", "text", None, "a `ClientEngine` that spawns its group",
       "DashInfer's directory of its `mpirun`: here its `mpiexec` (or `mpirun`) starts the ranks; it "
       "must be of the MPI mpi4py was built with. A directory with neither (a DashInfer install's) is "
       "ignored, with a warning", "the `mpiexec` beside Python"),
    Setting("AS_PROFILE", "choice", "OFF", "the serving process (rank 0; every rank runs op by op)",
       "DashInfer's: `ON` times every kernel call of models started from then on, reported by "
       "`get_op_profiling_info` (slower: the layers run op by op)", choices=("ON", "OFF")),
)}


def get(name: str, env=None):
    """The value of variable `name` in `env` (default os.environ), or its default when unset or
    empty; SettingError when it is set to a value it does not accept."""
    setting = REGISTRY[name]
    text = (os.environ if env is None else env).get(name, "")
    return setting.parse(text) if text.strip() else setting.default


def check_environment(env=None) -> None:
    """Refuse, at a process's start, the first declared variable that holds a bad value."""
    env = os.environ if env is None else env
    for name in REGISTRY:
        get(name, env)


def doc_table() -> str:
    """docs/deployment.md's table of variables, from the registry."""
    rows = ["| variable | read by | meaning | accepts | default |", "| --- | --- | --- | --- | --- |"]
    for s in REGISTRY.values():
        rows.append(f"| `{s.name}` | {s.read_by} | {s.doc} | {s.accepts()} | {s.shown_default()} |")
    return "\n".join(rows) + "\n"


if __name__ == "__main__":
    if sys.argv[1:] != ["--doc"]:
        sys.exit("usage: python -m dashinfer_client.settings --doc  (prints docs/deployment.md's table)")
    print(doc_table(), end="")
