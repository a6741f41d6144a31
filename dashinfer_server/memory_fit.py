"""Whether a model fits the memory its ranks' nodes can give, decided before any weight is loaded:
a rank's weights (its shard, as weights.py packs them) + its KV cache and step workspaces
(model.memory_bound) against dashinfer_client.memory.available() of its node. A model that does
not fit is refused with both figures in one line (ALLSPARK_MEMORY_ERROR; `dashinfer serve` exits
78), instead of being killed halfway through loading by the OOM killer."""
import math

from dashinfer_client import memory
from dashinfer_client.model.safetensors_io import itemsize
from dashinfer_client.refusals import Refused
from dashinfer_client.types import AsStatus

from . import topology
from .model import memory_bound


def weight_bytes(model, world: int) -> int:
    """Bytes of weights one of `world` ranks holds: its share of every sharded tensor, the embedding
    and the vectors whole (replicated), a tied head packed again from the embedding; fp16 tensors
    are widened to fp32 at load."""
    total = 0
    for name, info in model.graph["tensors"].items():
        n = math.prod(info["shape"]) * itemsize(info["dtype"]) * (2 if info["dtype"] == "F16" else 1)
        replicated = name == "model.embed_tokens.weight" or len(info["shape"]) == 1
        total += n if replicated else -(-n // world)
        if name == "model.embed_tokens.weight" and model.config.tie_word_embeddings:
            total += -(-n // world)  # the output head packed out of the embedding
    return total


def check_fits(cfg, model, world: int) -> None:
    """Raise Refused (ALLSPARK_MEMORY_ERROR) when a rank's weights + KV cache and workspaces exceed
    what its node can give. Ranks on real NUMA nodes each have their node's memory; ranks sharing
    one (in-process, simulated nodes) share the machine's."""
    weights, rest = weight_bytes(model, world), memory_bound(cfg, model)
    need = weights + rest
    nodes = topology.numa_nodes()[:world] if world > 1 else []
    if nodes and len(nodes) == world and all(n.real for n in nodes):
        budgets = [(memory.available(n.id), f"node {n.id}") for n in nodes]
    else:
        have, where = memory.available()
        if world == 1:
            who = "this machine"
        elif where == memory.LIMIT_SETTING:  # a rank's budget by definition: not divided
            who = f"each of {world} ranks"
        else:
            have, who = have // world, f"each of {world} ranks sharing this machine"
        budgets = [((have, where), who)]
    for (have, where), who in budgets:
        if need > have:
            raise Refused(AsStatus.ALLSPARK_MEMORY_ERROR,
                          f"model {cfg.model_name!r} needs {memory.gib(need)} a rank (weights {memory.gib(weights)} "
                          f"+ KV cache and step workspaces of max_batch {cfg.max_batch} x max_length "
                          f"{cfg.max_length}: {memory.gib(rest)}), more than the {memory.gib(have)} {who} can give "
                          f"({where}); lower max_batch, max_length or kv_cache_memory_mb, quantize the weights, "
                          "or use more ranks")
