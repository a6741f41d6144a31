"""Soak: many short requests from concurrent clients against a rank group this script starts;
latency, failures, and whether the ranks' memory stays flat.

    PYTHONPATH=. python bench/soak.py [--requests 10000] [--clients 8] [--ranks 2] [--model PATH]

The group: a ClientEngine spawns `--ranks` ranks (simulated NUMA nodes when the machine has fewer,
one thread each by default) and installs the model (default: SmolLM2-135M-Instruct, bf16). The
clients: `--clients` ClientEngines connected to its address, one per thread of this process, each
with its own session; each sends its share of the requests one after another (a closed loop, so
`--clients` requests are in flight at any time). A request: a prompt of 8-40 ids, 4-24 greedy new
tokens, drained, released; its latency runs from start_request_ids to its last token.

Prints p50 / p99 latency, tokens per second, failures (a refused start, a request that did not
end GenerateFinished, or fewer tokens than asked), greedy outputs that differ from the same
prompt's first output (batch neighbours may tip a near-tie: counted, not a failure), and the RSS
of every rank at 10 evenly spaced points of the run with each rank's max/min ratio (flat: < 1.05).
"""
import argparse
import os
import statistics
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import psutil  # noqa: E402

import dashinfer_client as allspark  # noqa: E402
from dashinfer_client import settings  # noqa: E402
from dashinfer_client.model_cache import resolve_model  # noqa: E402

OK = allspark.AsStatus.ALLSPARK_SUCCESS
POINTS = 10
DISTINCT = 64  # distinct (prompt, length) pairs, cycled: each has one expected greedy output


def workload(i, vocab):
    """Request i: (prompt ids, new tokens), deterministic."""
    k = i % DISTINCT
    n_prompt, n_new = 8 + (13 * k) % 33, 4 + (7 * k) % 21
    return [(11 + 97 * k + 31 * j) % (vocab - 20) + 10 for j in range(n_prompt)], n_new


def rank_processes(leader_pid) -> dict:
    """{rank: psutil.Process} of the group under the launcher's process."""
    ranks = {}
    for proc in psutil.Process(leader_pid).children(recursive=True):
        try:
            env = proc.environ()
            if "dashinfer_server" in proc.cmdline():
                ranks[int(env.get("PMI_RANK", 0))] = proc
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return ranks


class Soak:
    def __init__(self, address, model_name, vocab, total, clients):
        self.address, self.model_name, self.vocab, self.total = address, model_name, vocab, total
        self.clients = clients
        self.lock = threading.Lock()
        self.next = 0
        self.done = 0
        self.latencies, self.failures, self.mismatches, self.tokens = [], [], 0, 0
        self.expected = {}
        self.progress = threading.Condition(self.lock)

    def take(self):
        with self.lock:
            if self.next >= self.total:
                return None
            self.next += 1
            return self.next - 1

    def one(self, engine, i):
        ids, n_new = workload(i, self.vocab)
        gen = allspark.ASGenerationConfigBuilder().update(
            {"top_k": 1, "max_length": len(ids) + n_new, "early_stopping": False, "seed": 1})
        t0 = time.perf_counter()
        status, handle, queue = engine.start_request_ids(self.model_name, None, ids, gen)
        if status != OK:
            return f"request {i}: start_request_ids {status.name}: {engine.last_error}", None, 0.0
        out = []
        while (ele := queue.Get()) is not None:
            out += ele.ids_from_generate
        latency = time.perf_counter() - t0
        final = queue.GenerateStatus()
        engine.release_request(self.model_name, handle)
        if final != allspark.GenerateRequestStatus.GenerateFinished or len(out) != n_new:
            return f"request {i}: {final.name}, {len(out)}/{n_new} tokens ({queue.error})", None, latency
        return None, out, latency

    def client(self, errors):
        try:
            engine = allspark.ClientEngine(self.address, startup_timeout=60)
        except Exception as e:  # noqa: BLE001 - reported, the other clients go on
            errors.append(f"a client could not connect: {e}")
            return
        try:
            while (i := self.take()) is not None:
                failure, out, latency = self.one(engine, i)
                with self.progress:
                    self.done += 1
                    if failure:
                        self.failures.append(failure)
                    else:
                        self.latencies.append(latency)
                        self.tokens += len(out)
                        first = self.expected.setdefault(i % DISTINCT, out)
                        self.mismatches += first != out
                    self.progress.notify_all()
        finally:
            engine.close()

    def run(self, ranks):
        """Run every client; sample each rank's RSS at POINTS evenly spaced counts of finished
        requests -> [(finished, {rank: rss bytes})]."""
        errors = []
        threads = [threading.Thread(target=self.client, args=(errors,), daemon=True) for _ in range(self.clients)]
        for t in threads:
            t.start()
        samples = []
        for point in range(1, POINTS + 1):
            target = self.total * point // POINTS
            with self.progress:
                while self.done < target and any(t.is_alive() for t in threads):
                    self.progress.wait(5.0)
                done = self.done
            samples.append((done, {r: _rss(p) for r, p in ranks.items()}))
        for t in threads:
            t.join()
        self.failures += errors
        return samples


def _rss(proc) -> int:
    try:
        return proc.memory_info().rss
    except psutil.NoSuchProcess:
        return 0


def percentile(values, q):
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))] if values else float("nan")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--requests", type=int, default=10_000)
    p.add_argument("--clients", type=int, default=8)
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--threads-per-rank", type=int, default=1)
    p.add_argument("--model", default=None, help="a model path (default: the default model)")
    p.add_argument("--dtype", default=None, help="bfloat16 | float32 (conversions)")
    args = p.parse_args()

    model_dir, prefix = resolve_model(args.model, args.dtype)
    vocab = allspark.DashInferModel(model_dir, prefix).config.vocab_size
    env = {}
    if args.ranks > 1 and not settings.get("DASHINFER_NUMA_NODES"):
        from dashinfer_server.topology import numa_nodes, simulated_nodes
        if len(numa_nodes()) < args.ranks:
            env["DASHINFER_NUMA_NODES"] = simulated_nodes(args.ranks)
    owner = allspark.ClientEngine(nodes=args.ranks, threads_per_rank=args.threads_per_rank, env=env)
    try:
        cfg = (allspark.AsModelRuntimeConfigBuilder().model_name("soak").model_dir(model_dir, prefix)
               .max_batch(max(8, args.clients)).max_length(128).build())
        for call, arg in (("install_model", cfg), ("start_model", "soak")):
            if getattr(owner, call)(arg) != OK:
                raise SystemExit(f"{call}: {owner.last_error}")
        ranks = rank_processes(owner.server.proc.pid)
        soak = Soak(owner.address, "soak", vocab, args.requests, args.clients)
        t0 = time.perf_counter()
        samples = soak.run(ranks)
        seconds = time.perf_counter() - t0
    finally:
        owner.close()

    lat = soak.latencies
    print(f"soak: {args.requests} requests, {args.clients} ClientEngines (one thread each) -> a group of "
          f"{args.ranks} rank(s) x {args.threads_per_rank} thread(s), model {prefix}, {seconds:.1f} s")
    print(f"latency p50 {percentile(lat, 0.5) * 1000:.1f} ms, p99 {percentile(lat, 0.99) * 1000:.1f} ms, "
          f"mean {statistics.fmean(lat) * 1000 if lat else float('nan'):.1f} ms; "
          f"{soak.tokens / seconds:.1f} generated tok/s")
    print(f"failures: {len(soak.failures)}; greedy outputs differing from the prompt's first: {soak.mismatches}")
    for failure in soak.failures[:10]:
        print(f"  {failure}")
    order = sorted(ranks)
    print("finished  " + "  ".join(f"rank {r} RSS MB" for r in order))
    for done, rss in samples:
        print(f"{done:8d}  " + "  ".join(f"{rss.get(r, 0) / 2**20:13.1f}" for r in order))
    for r in order:
        values = [rss[r] for _, rss in samples if rss.get(r)]
        ratio = max(values) / min(values) if values else float("nan")
        print(f"rank {r}: RSS max/min {ratio:.4f} ({'flat' if ratio < 1.05 else 'NOT flat'} within 5%)")


if __name__ == "__main__":
    main()
