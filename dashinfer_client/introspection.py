"""What DashInfer's introspection calls return: AsEngineStat (a model's KV pool, queues and
throughput), AsFileInfo (which versions wrote a serialized model), the engine's version string.

These are plain values: the in-process Engine fills them (dashinfer_server/engine_stat.py) and a
ClientEngine receives them from the server as the JSON of to_dict(). Field names are DashInfer's,
its misspelt `pendding_request` included, so code that reads them runs unchanged.
"""
import importlib.metadata
import json
import os
import stat

PACKAGE = "dashinfer-py"


def engine_version() -> str:
    """This package's version ("0.1.0"); "unknown" when it is run from a checkout never installed."""
    try:
        return importlib.metadata.version(PACKAGE)
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def version_full() -> str:
    """DashInfer's GetVersionFull layout, "<major>.<minor>.<patch>/(GitSha1:<sha>)": the package
    version; the commit is "unknown" (a pip install records none)."""
    return f"{engine_version()}/(GitSha1:unknown)"


class AsEngineStat:
    """One model's figures, as DashInfer's AsEngineStat (get_as_engine_stat).

    A span is DashInfer's unit of KV memory: one layer's K or V of span_size tokens, so a KV block
    here counts 2 * layers spans and total_token = total_span / (2 * layers) * span_size, as
    upstream computes it. free_* counts what a new request can take: free blocks and prefix-cache
    blocks no request holds. Throughput is over the last few seconds (engine_stat.RATE_WINDOW_S);
    DashInfer declares it but never fills it. total_device_memory_pool_size and
    used_device_memory_pool_size describe the CUDA memory pool: 0 on CPU, as DashInfer's CPU engine."""

    INT_FIELDS = ("total_span", "used_span", "free_span", "total_token", "free_token", "span_size",
                  "pendding_request", "running_request", "total_device_memory_pool_size",
                  "used_device_memory_pool_size", "total_generated_token", "total_prefill_token",
                  "prefix_cache_hit_token", "prefix_cache_miss_token")
    FLOAT_FIELDS = ("generate_token_persec", "process_token_persec", "token_usage_percentage",
                    "prefix_cache_hit_rate", "prefix_cache_miss_rate")

    def __init__(self, model_name: str = ""):
        self.model_name = model_name
        for name in self.INT_FIELDS:
            setattr(self, name, 0)
        for name in self.FLOAT_FIELDS:
            setattr(self, name, 0.0)

    def dict(self) -> dict:
        """{field: value as a str}, as DashInfer's dict() (its ToMap) gives them."""
        return {name: _text(getattr(self, name)) for name in self.INT_FIELDS + self.FLOAT_FIELDS}

    def ToString(self) -> str:  # noqa: N802 (DashInfer's name)
        """One "name = value" line per figure, under a title line, as DashInfer prints it."""
        lines = [f"{name} = {text}" for name, text in self.dict().items()]
        return "Members of AsEngineStat\n" + "".join(line + "\n" for line in lines)

    def __repr__(self):
        return self.ToString()

    def to_dict(self) -> dict:
        """The typed values (the wire form), model_name included."""
        return {"model_name": self.model_name,
                **{name: getattr(self, name) for name in self.INT_FIELDS + self.FLOAT_FIELDS}}

    @classmethod
    def from_dict(cls, d: dict) -> "AsEngineStat":
        stat = cls(str(d.get("model_name", "")))
        for name in cls.INT_FIELDS:
            setattr(stat, name, int(d.get(name, 0)))
        for name in cls.FLOAT_FIELDS:
            setattr(stat, name, float(d.get(name, 0.0)))
        return stat


class AsFileInfo:
    """Which versions wrote a serialized model, and this engine's (get_file_information). Here the
    graph and parameter versions are the serialized format's ("dashinfer-py format 1"): the
    files record the format they follow, which is what decides whether this engine reads them."""

    FIELDS = ("create_version_graph", "create_version_param", "current_version_engine")

    def __init__(self):
        self.create_version_graph = self.create_version_param = self.current_version_engine = ""

    def __repr__(self):
        return "AsFileInfo(" + ", ".join(f"{n}={getattr(self, n)!r}" for n in self.FIELDS) + ")"

    def to_dict(self) -> dict:
        return {name: getattr(self, name) for name in self.FIELDS}

    @classmethod
    def from_dict(cls, d: dict) -> "AsFileInfo":
        info = cls()
        for name in cls.FIELDS:
            setattr(info, name, str(d.get(name, "")))
        return info


# A graph lists its tensors in a few hundred bytes each: a Qwen3-235B-A22B quantized to u4 is about
# 16 MB. Anything larger is refused unread (a server's caller may name any file).
MAX_GRAPH_BYTES = 256 * 2**20


def file_information(as_graph_path: str, as_param_path: str) -> AsFileInfo:
    """The AsFileInfo of a serialized model's two files; raises OSError (unreadable) or ValueError
    (not files of this format). Only regular files are opened: a caller of a server names any
    path, and a FIFO would block its thread forever, /dev/zero fill its memory."""
    from .model.serialized import FORMAT
    for path in (as_graph_path, as_param_path):
        if not stat.S_ISREG(os.stat(path).st_mode):
            raise ValueError(f"{path} is not a regular file")
    if os.path.getsize(as_graph_path) > MAX_GRAPH_BYTES:
        raise ValueError(f"{as_graph_path} is larger than any model graph ({MAX_GRAPH_BYTES} bytes)")
    with open(as_graph_path) as f:
        try:
            graph = json.load(f)
        except json.JSONDecodeError as e:
            raise ValueError(f"{as_graph_path} is not a model graph (not JSON: {e})") from None
    if not isinstance(graph, dict) or graph.get("format") != FORMAT:
        raise ValueError(f"{as_graph_path} is not a {FORMAT} model graph")
    with open(as_param_path, "rb") as f:
        if len(f.read(8)) < 8:
            raise ValueError(f"{as_param_path} is not a parameter file (shorter than its header)")
    info = AsFileInfo()
    info.create_version_graph = info.create_version_param = f"{FORMAT} format {graph.get('version')}"
    info.current_version_engine = engine_version()
    return info


def _text(value) -> str:
    """A figure as C++'s std::to_string prints it (floats with 6 decimals)."""
    return f"{value:.6f}" if isinstance(value, float) else str(value)
