"""The HTTP layer's cost: serve32 through `dashinfer serve`'s /v1/completions (32 concurrent
streaming clients) against the same requests through a ClientEngine, and the idle CPU of the
HTTP server.

    python bench/http_load.py [--tp 2] [--repeat 3] [--idle 10] [--dtype bfloat16]

serve32: 32 requests at once, prompt 16 + (37 i mod 241) token ids, 32 + (29 i mod 97) new tokens,
greedy, eos masked (min_tokens = max_tokens; early_stopping off on the engine) so both paths
generate the same tokens. Both hold the default model on --tp ranks (simulated NUMA nodes when
the machine has fewer) with the same runtime limits, and take turns, interleaved: HTTP, engine,
HTTP, engine... Prints tokens/s of each run, the median ratio HTTP / ClientEngine (target >= 0.9),
then the CPU used by the idle HTTP server process (and by its whole process tree, ranks included)
over --idle seconds (target < 1%).
"""
import os
import sys

BENCH = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(BENCH)
sys.path.insert(0, ROOT)  # this checkout's packages

import argparse  # noqa: E402
import asyncio  # noqa: E402
import importlib.util  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import time  # noqa: E402

import dashinfer_client as allspark  # noqa: E402
from dashinfer_client import settings  # noqa: E402
from dashinfer_client.default_model import ensure_default_model  # noqa: E402

MAX_LENGTH = 512
TICKS = os.sysconf("SC_CLK_TCK")


def _bench_client():
    """bench/client.py: its serve32 prompts and its ClientEngine runner, the side compared against."""
    spec = importlib.util.spec_from_file_location("bench_client", os.path.join(BENCH, "client.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_client = _bench_client()
install, prompts, run = _client.install, _client.prompts, _client.run


def start_server(args, env) -> tuple:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-m", "dashinfer", "serve", "--tp", str(args.tp), "--port", str(port), "--dtype",
           args.dtype, "--max-batch", "32", "--max-model-len", str(MAX_LENGTH), "--log-level", "WARNING"]
    proc = subprocess.Popen(cmd, env=env, cwd=ROOT)
    url = f"http://127.0.0.1:{port}"
    import httpx
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + "/health").status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        if proc.poll() is not None:
            raise SystemExit(f"dashinfer serve exited with {proc.returncode}")
        time.sleep(0.2)
    raise SystemExit("dashinfer serve did not start serving")


async def http_run(url, requests) -> tuple:
    """32 concurrent streaming /v1/completions: (seconds, tokens generated)."""
    import httpx

    async def one(client, ids, n_new):
        body = {"model": "default", "prompt": ids, "max_tokens": n_new, "min_tokens": n_new, "temperature": 0,
                "stream": True, "stream_options": {"include_usage": True}}
        tokens = 0
        async with client.stream("POST", url + "/v1/completions", json=body) as r:
            async for line in r.aiter_lines():
                if line.startswith("data: {") and '"usage": {' in line:
                    tokens = json.loads(line[6:])["usage"]["completion_tokens"]
        return tokens

    limits = httpx.Limits(max_connections=64)
    async with httpx.AsyncClient(timeout=600, limits=limits) as client:
        t0 = time.perf_counter()
        counts = await asyncio.gather(*(one(client, ids, n) for ids, n in requests))
        return time.perf_counter() - t0, sum(counts)


def cpu_seconds(pids) -> float:
    total = 0.0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / TICKS
        except (OSError, IndexError):
            pass
    return total


def tree(pid) -> list:
    kids = {}
    for p in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{p}/stat") as f:
                kids.setdefault(int(f.read().rsplit(")", 1)[1].split()[1]), []).append(int(p))
        except OSError:
            pass
    out, todo = [], [pid]
    while todo:
        out.append(todo.pop())
        todo += kids.get(out[-1], [])
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--tp", type=int, default=2)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--idle", type=float, default=10.0)
    p.add_argument("--dtype", default="bfloat16")
    args = p.parse_args()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(x for x in (ROOT, os.environ.get("PYTHONPATH")) if x))
    if args.tp > 1 and not settings.get("DASHINFER_NUMA_NODES", env):
        from dashinfer_server import topology
        if len(topology.numa_nodes()) < args.tp:
            env["DASHINFER_NUMA_NODES"] = topology.simulated_nodes(args.tp)
    model_dir, prefix = ensure_default_model(args.dtype)
    loader = allspark.DashInferModel(model_dir, prefix)
    requests = prompts("serve32", loader.config.vocab_size)
    proc, url = start_server(args, env)
    nodes = settings.get("DASHINFER_NUMA_NODES", env)
    engine = allspark.ClientEngine(nodes=args.tp, env={"DASHINFER_NUMA_NODES": nodes} if nodes else None)
    runtime = (loader.create_reference_runtime_config_builder("bench", allspark.TargetDevice.CPU, [0], 32)
               .max_length(MAX_LENGTH).build())
    try:
        install(engine, runtime)
        asyncio.run(http_run(url, requests[:4]))  # warm-up of both paths
        run(engine, "bench", requests[:4])
        ratios = []
        for i in range(args.repeat):
            h_s, h_tok = asyncio.run(http_run(url, requests))
            e_s, e_tok = run(engine, "bench", requests)
            assert h_tok == e_tok == sum(n for _, n in requests), (h_tok, e_tok)
            ratios.append((h_tok / h_s) / (e_tok / e_s))
            print(f"run {i + 1}: HTTP {h_tok / h_s:7.1f} tok/s   ClientEngine {e_tok / e_s:7.1f} tok/s   "
                  f"ratio {ratios[-1]:.3f}", flush=True)
        print(f"serve32 HTTP / ClientEngine (tp {args.tp}): median ratio {statistics.median(ratios):.3f} "
              f"(target >= 0.9)")
        engine.release_model("bench")
        time.sleep(1.0)  # the last streams' connections close
        pids = tree(proc.pid)
        before_http, before_all, t0 = cpu_seconds([proc.pid]), cpu_seconds(pids), time.monotonic()
        time.sleep(args.idle)
        seconds = time.monotonic() - t0
        http_pct = 100 * (cpu_seconds([proc.pid]) - before_http) / seconds
        all_pct = 100 * (cpu_seconds(pids) - before_all) / seconds
        print(f"idle CPU over {seconds:.0f} s: HTTP server process {http_pct:.2f}% (target < 1%), "
              f"with its {len(pids) - 1} rank/launcher processes {all_pct:.2f}%")
    finally:
        engine.close()
        proc.terminate()
        proc.wait(60)
    return 0


if __name__ == "__main__":
    sys.exit(main())
