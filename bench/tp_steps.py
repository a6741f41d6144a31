"""Where a tensor-parallel step's time goes on each rank, without gRPC: the engine workloads of
bench/engine.py on an in-process Engine on rank 0 of an mpiexec'd group.

    PYTHONPATH=. python bench/tp_steps.py [--ranks 2] [--model PATH] [--workloads decode1,batch8]
    PYTHONPATH=. python bench/tp_steps.py --ranks 1 --threads 2     # the one-process reference

--ranks 1 runs in this process (the in-process Engine, --threads threads); more ranks run under
the mpiexec beside this Python, one simulated NUMA node of one core per rank (unless
DASHINFER_NUMA_NODES says otherwise). Per workload, one JSON line: the figures of
bench/engine.py (decode_tok_s, ...) and, per rank, milliseconds per step of
    rank 0   schedule, plan broadcast, forward (of which: waiting for peers in collectives),
             sample, postprocess, rest of the step
    others   waiting for rank 0's plan, forward (of which: waiting in collectives)
The waits say what each cause costs: a rank that waits in the collectives has less work than its
peers (the split) or is held by their Python; a worker that waits for the plan is held by rank
0's scheduling, sampling and delivery.
"""
import argparse
import collections
import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from bench.engine import WORKLOADS, rates, start_workload, submit, timed_call  # noqa: E402

spent = collections.defaultdict(float)


def timed(owner, attr, label):
    """Wrap owner.attr so that every call adds its seconds to spent[label]."""
    setattr(owner, attr, timed_call(spent, label, getattr(owner, attr)))


def comm_wait_s(group) -> float:
    from dashinfer_server import kernels as K
    native = group.native_allreduce()
    return K.comm_waits(native[0])[1] if native and native[0] is not None else 0.0


def serve_workload(engine, group, model, name, threads):
    """Rank 0: serve one workload; return bench/engine.py's figures and rank 0's breakdown."""
    from dashinfer_client import AsStatus

    prompts, _ = start_workload(engine, model, name, threads)
    spent.clear()
    wait0 = comm_wait_s(group)
    t0 = time.time() * 1000.0
    queues = submit(engine, model, prompts, WORKLOADS[name])
    assert engine.sync_request("bench", None) == AsStatus.ALLSPARK_SUCCESS
    comm_wait = comm_wait_s(group) - wait0
    stats = [q.RequestStatInfo() for q in queues]
    engine.release_model("bench")
    steps = spent.pop("steps", 0) or 1
    per_step = {k: round(v / steps * 1e3, 3) for k, v in spent.items() if k != "steps"}
    per_step["forward comm wait"] = round(comm_wait / steps * 1e3, 3)
    per_step["step rest"] = round(per_step.get("step", 0) - sum(
        per_step.get(k, 0) for k in ("schedule", "plan broadcast", "forward", "sample", "postprocess")), 3)
    return {
        "workload": name, "steps": int(steps),
        **rates(stats, t0),
        "rank0_ms_per_step": per_step,
    }


def instrument_rank0():
    from dashinfer_server import model_loop
    from dashinfer_server.model import DecoderModel

    loop = model_loop.ModelLoop
    step = loop.step

    def counted_step(self):
        spent["steps"] += 1
        t = time.perf_counter()
        try:
            step(self)
        finally:
            spent["step"] += time.perf_counter() - t
    loop.step = counted_step
    timed(loop, "postprocess", "postprocess")
    timed(DecoderModel, "forward", "forward")
    from dashinfer_server import parallel, sampler, scheduler
    timed(scheduler.Scheduler, "schedule", "schedule")
    timed(sampler.Sampler, "sample", "sample")
    timed(parallel.MPIGroup, "step", "plan broadcast")


def run_rank(args):
    from dashinfer_server.group import init_group
    group = init_group()
    from bench import models
    model = models.load(args.model, args.dtype, args.quant)
    if group.rank:
        from dashinfer_server import worker
        timed(type(group), "receive", "plan wait")
        timed(worker.Worker, "step", "forward")
        worker.run_worker(group)
        mine = {k: round(v * 1e3, 1) for k, v in spent.items()}
        mine["comm wait"] = round(comm_wait_s(group) * 1e3, 1)
        group.comm.gather(mine, root=0)
        return
    instrument_rank0()
    from dashinfer_server.engine import Engine
    engine = Engine(group)
    results = [serve_workload(engine, group, model, name, args.threads) for name in args.workloads.split(",")]
    group.close()
    workers = group.comm.gather(None, root=0)[1:] if group.world > 1 else []
    for r in results:
        r.update(ranks=group.world, threads=args.threads, model=os.path.basename(args.model.rstrip("/")))
        print(json.dumps(r), flush=True)
    for rank, w in enumerate(workers, 1):  # totals over every workload (ms)
        print(json.dumps({"rank": rank, "ms_total": w}), flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="default")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    parser.add_argument("--quant", default=None, choices=["int8", "uint4"])
    parser.add_argument("--workloads", default="decode1,batch8")
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1, help="kernel threads per rank")
    args = parser.parse_args()
    if args.ranks > 1 and "PMI_RANK" not in os.environ:
        from bench import models
        from dashinfer_server.launch import mpiexec_path
        from dashinfer_server.topology import simulated_nodes
        models.load(args.model, args.dtype, args.quant)  # convert once, before the ranks start
        env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
        env.setdefault("DASHINFER_NUMA_NODES", simulated_nodes(args.ranks))
        cmd = [mpiexec_path(), "-n", str(args.ranks), sys.executable, os.path.abspath(__file__), *sys.argv[1:]]
        sys.exit(subprocess.run(cmd, env=env).returncode)
    run_rank(args)


if __name__ == "__main__":
    main()
