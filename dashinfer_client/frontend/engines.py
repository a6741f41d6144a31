"""The one place that picks the engine for a model and starts it: the in-process Engine for one
rank, a ClientEngine over a spawned rank group for several. The HTTP server, the pipeline, `dashinfer
chat` and EngineHelper all open theirs here.
"""
from ..refusals import Refused


class EngineStartError(RuntimeError):
    """The rank group could not be started (nothing the model's configuration can change)."""


def new_engine(tp=1, threads_per_rank=None, env=None):
    """tp 1: an Engine in this process; tp N: a ClientEngine spawning N ranks (one per NUMA node);
    tp None: a ClientEngine with as many ranks as its launcher picks. EngineStartError when the
    group does not start."""
    import dashinfer_client as allspark
    if tp == 1:
        return allspark.Engine()
    from ..client_engine import Unavailable
    try:
        return allspark.ClientEngine(nodes=tp, threads_per_rank=threads_per_rank or None, env=env)
    except Unavailable as e:
        raise EngineStartError(str(e)) from None


def start_engine(runtime_config, tp=1, threads_per_rank=None, env=None):
    """A new engine (new_engine) serving runtime_config's model, installed and started. Refused
    (status and reason) when the engine refuses the model or its limits; the engine is closed then."""
    engine = new_engine(tp, threads_per_rank, env)
    try:
        engine.serve_model(runtime_config)
    except Refused:
        engine.close()  # a ClientEngine's ranks stop; an Engine releases what it installed
        raise
    return engine
