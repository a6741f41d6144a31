"""What an operator reads when a server starts: kernel path, ranks and where they run, the model,
its KV capacity and limits, how long loading took, where it listens.

    summary = startup_summary(cfg, model, world=2, address="unix:///run/dashinfer/dashinfer.sock",
                              load_s=1.2, start_s=3.4)
    log_startup(summary)

cfg is the model's AsModelRuntimeConfig, model its DashInferModel (the serialized files); both are
public and at hand wherever a model is installed, in `python -m dashinfer_server` as in an HTTP
server. Every figure is computed from them the way the runtime computes it (runner.num_kv_blocks,
kv_cache.bytes_per_block), so the log says what the engine allocates. One INFO record per topic;
with the JSON log format each record also carries its figures as fields.
"""
import logging
import os

from dashinfer_client import settings

from . import kernels as K
from . import topology
from .kv_cache import bytes_per_block
from .model import kv_format, num_kv_blocks

log = logging.getLogger("dashinfer_server.startup")
MIB = 2**20


def rank_placements(world: int, threads=None, env=None) -> list:
    """[{rank, node, cpus, threads, memory, text}] of every rank of the group, as the launcher
    places them (rank r on the r-th NUMA node; this rank on DASHINFER_NODE). A lone rank started
    without a node is not pinned: it runs on the cpus this process may use."""
    env = os.environ if env is None else env
    if world == 1 and settings.get("DASHINFER_NODE", env) is None:
        cpus = sorted(os.sched_getaffinity(0))
        count = threads or K.num_threads()
        return [{"rank": 0, "node": None, "cpus": cpus, "threads": count, "memory": "not bound",
                 "text": f"rank 0/1 not pinned to a NUMA node: {len(cpus)} cpu(s) of this process, "
                         f"{count} OpenMP thread(s)"}]
    out = []
    for rank in range(world):
        rank_env = env if rank == 0 else {k: v for k, v in env.items() if k != "DASHINFER_NODE"}
        try:
            p = topology.plan_placement(rank, world, threads, rank_env)
        except topology.PlacementError as e:
            out.append({"rank": rank, "node": None, "text": f"rank {rank}/{world}: placement unknown ({e})"})
            continue
        memory = p.membind if p.node.real else "not bound (simulated node)"
        out.append({"rank": rank, "node": p.node.id, "cpus": list(p.node.cpus), "threads": p.threads,
                    "memory": memory, "text": p.describe()})
    return out


def startup_summary(cfg, model, *, world: int, address: str, load_s: float = 0.0, start_s: float = 0.0,
                    threads=None, isa=None, env=None) -> dict:
    """The figures of a started group as one JSON-able dict (see log_startup); cfg and model None:
    a group started without a model. load_s: install (reading and checking the files); start_s:
    start (weights into the kernels' layout and the warm-up step). threads / isa: of the ranks,
    default this process's kernels."""
    out = {"isa": isa or K.isa(), "isa_supported": K.supported_isa(), "world": world,
           "ranks": rank_placements(world, threads, env), "address": address}
    if model is None:
        return out
    c = model.config
    block = cfg.kv_cache_span_size
    blocks = num_kv_blocks(cfg, model, block)
    fmt = kv_format(cfg, model)
    quant = model.quantization
    out.update({
        "model_name": cfg.model_name, "model_path": os.path.join(cfg.model_dir, cfg.model_prefix),
        "architecture": model.architecture, "dtype": model.dtype,
        "quantization": f"{quant['weight_format']} (group {quant['group_size']})" if quant else "none",
        "layers": c.num_hidden_layers, "hidden_size": c.hidden_size, "vocab_size": c.vocab_size,
        "weights_bytes": os.path.getsize(os.path.join(cfg.model_dir, cfg.model_prefix + ".asparam")),
        "kv_format": fmt, "kv_blocks": blocks, "kv_block_tokens": block, "kv_tokens": blocks * block,
        "kv_bytes": blocks * bytes_per_block(fmt, c.num_hidden_layers, c.num_key_value_heads, block, c.head_dim),
        "max_batch": cfg.max_batch, "max_length": cfg.max_length,
        "context_length": c.max_position_embeddings,
        "load_s": round(load_s, 3), "start_s": round(start_s, 3),
    })
    return out


def log_startup(s: dict, logger: logging.Logger = log) -> None:
    """The summary as INFO records, one per topic."""
    def info(topic, text, **fields):
        logger.info("%s", text, extra={"fields": {"event": "startup", "topic": topic, **fields}})

    info("kernels", f"kernels: {s['isa']} path (best this CPU supports: {s['isa_supported']})",
         isa=s["isa"], isa_supported=s["isa_supported"])
    for r in s["ranks"]:
        info("rank", r["text"], **{k: v for k, v in r.items() if k != "text"}, world=s["world"])
    if "model_name" in s:
        _log_model(s, info)
    info("listen", f"listening on {s['address']}", address=s["address"])


def _log_model(s, info) -> None:
    info("model", f"model {s['model_name']!r}: {s['model_path']} ({s['architecture']}, {s['dtype']}, "
                  f"quantization {s['quantization']}, {s['weights_bytes'] / MIB:.1f} MiB of weights, "
                  f"{s['layers']} layers, hidden {s['hidden_size']}, vocab {s['vocab_size']})",
         **{k: s[k] for k in ("model_name", "model_path", "architecture", "dtype", "quantization",
                              "weights_bytes", "layers", "hidden_size", "vocab_size")})
    info("kv_cache", f"KV cache: {s['kv_tokens']} tokens in {s['kv_blocks']} blocks of {s['kv_block_tokens']} "
                     f"({s['kv_format']}, {s['kv_bytes'] / MIB:.1f} MiB over {s['world']} rank(s))",
         **{k: s[k] for k in ("kv_tokens", "kv_blocks", "kv_block_tokens", "kv_format", "kv_bytes")})
    info("limits", f"limits: max batch {s['max_batch']}, max length {s['max_length']} tokens "
                   f"(model context {s['context_length']})",
         max_batch=s["max_batch"], max_length=s["max_length"], context_length=s["context_length"])
    info("timing", f"loaded in {s['load_s']:.2f} s, started (weights packed, warm-up) in {s['start_s']:.2f} s",
         load_s=s["load_s"], start_s=s["start_s"])
