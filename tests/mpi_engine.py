"""An in-process Engine on rank 0 of an mpiexec'd group (or alone, as the 1-rank reference),
driven by tests/test_parallel.py:

    [mpiexec -n 2] python tests/mpi_engine.py SPEC_JSON

SPEC_JSON: {"models": [{"dir", "prefix", "prompts": [[ids]...] | "question": str, "max_new",
            "max_batch", "max_length", "top_logprobs": n}], "linger": print GENERATING once
            tokens flow, "wait_sigterm": print WAITING at the end, then close the group on SIGTERM}
Rank 0 prints "RESULT <json>" (per model, the greedy ids of each prompt, with top_logprobs the n
most likely (id, logprob) pairs of each step, and the answer text for a question); every rank
prints "PID <rank> <pid>" first. Workers run run_worker.
"""
import json
import logging
import os
import signal
import sys
import threading

from dashinfer_client import ASGenerationConfigBuilder, AsModelRuntimeConfigBuilder
from dashinfer_client.model.serialized import DashInferModel
from dashinfer_client.types import AsStatus
from dashinfer_server.engine import Engine
from dashinfer_server.group import init_group
from dashinfer_server.worker import run_worker

logging.basicConfig(level=os.environ.get("LOG_LEVEL", "WARNING"), format="%(message)s")
group = init_group()  # places the rank, then loads the kernels


def check(status, what, engine):
    if status != AsStatus.ALLSPARK_SUCCESS:
        raise RuntimeError(f"{what}: {status} {engine.last_error}")


def serve(engine, spec, index, linger):
    name = f"m{index}"
    rt = (AsModelRuntimeConfigBuilder().model_name(name).model_dir(spec["dir"], spec["prefix"])
          .max_length(spec.get("max_length", 256)).max_batch(spec.get("max_batch", 4))
          .max_prefill_length(spec.get("max_prefill", 32)).build())
    check(engine.install_model(rt), "install_model", engine)
    check(engine.start_model(name), "start_model", engine)
    files = DashInferModel(spec["dir"], spec["prefix"])
    prompts = spec.get("prompts")
    if "question" in spec:
        tok = files.get_tokenizer()
        text = tok.apply_chat_template([{"role": "user", "content": spec["question"]}],
                                       tokenize=False, add_generation_prompt=True)
        prompts = [tok(text, add_special_tokens=False)["input_ids"]]
    queues = []
    for ids in prompts:
        options = {"top_k": 1, "early_stopping": False, "max_length": len(ids) + spec["max_new"]}
        if spec.get("top_logprobs"):
            options.update(logprobs=True, top_logprobs=spec["top_logprobs"])
        gen = ASGenerationConfigBuilder().update(options)
        status, handle, q = engine.start_request_ids(name, None, ids, gen)
        check(status, "start_request_ids", engine)
        queues.append((handle, q))
    if linger:
        queues[0][1].GetWithTimeout(60_000)
        print("GENERATING", flush=True)
    outs = []
    for handle, q in queues:
        engine.sync_request(name, handle)
        ids, top = [], []
        while (el := q.GetNoWait()) is not None:
            ids += el.ids_from_generate
            top += el.log_probs_list
        outs.append({"ids": ids, "top_logprobs": top, "status": q.GenerateStatus().name, "error": q.error})
    if "question" in spec:
        outs[0]["text"] = files.get_tokenizer().decode(outs[0]["ids"], skip_special_tokens=True)
    check(engine.stop_model(name), "stop_model", engine)
    check(engine.release_model(name), "release_model", engine)
    return outs


def main():
    # one write per line: mpiexec merges the ranks' stdout, and print() writes the newline apart
    sys.stdout.write(f"PID {group.rank} {os.getpid()}\n")
    sys.stdout.flush()
    if group.rank:
        return run_worker(group)
    spec = json.loads(sys.argv[1])
    engine = Engine(group)
    results = [serve(engine, m, i, spec.get("linger")) for i, m in enumerate(spec["models"])]
    print("RESULT", json.dumps({"world": group.world, "allreduce": getattr(group, "allreduce_kind", None),
                                "models": results}), flush=True)
    if spec.get("wait_sigterm"):  # as the service does: drain on SIGTERM, then shut down
        term = threading.Event()
        signal.signal(signal.SIGTERM, lambda s, f: term.set())
        print("WAITING", flush=True)
        term.wait(60)
        print("rank 0: SIGTERM", flush=True)
    group.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
