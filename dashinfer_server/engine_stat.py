"""The figures of DashInfer's introspection calls for one model: AsEngineStat (get_as_engine_stat,
get_free_frame) and the model description (get_model_info).

StatCounters is written by the model's loop thread after every step and read by any thread:
counts are plain ints (one attribute store each), the throughput buckets sit under a lock.
"""
import threading
import time
from collections import deque

from dashinfer_client.introspection import AsEngineStat

RATE_WINDOW_S = 5.0   # throughput is averaged over this many recent seconds (DashInfer logs every 5 s)
_BUCKET_S = 0.25      # resolution of that window


class StatCounters:
    """What a model's steps computed since it was installed, as DashInfer counts it:
    total_prefill_token: prompt tokens (cached ones included) of requests that got a first token;
    total_generated_token: tokens sampled; prefix cache hits and misses: prompt tokens found in /
    computed past the prefix cache at the request's first admission, counted with its first token
    when the cache is on."""

    def __init__(self, clock=time.monotonic):
        self.clock = clock
        self.prefill_tokens = 0
        self.generated_tokens = 0
        self.prefix_hit_tokens = 0
        self.prefix_miss_tokens = 0
        self._started = clock()
        self._lock = threading.Lock()
        self._buckets = deque()  # [bucket index, prompt tokens computed, tokens generated]

    def count(self, chunks, prefix_cache: bool) -> None:
        """After a step, before the scheduler advances its sequences (a chunk of a sequence still
        in prefill that samples gives that request its first token)."""
        computed = generated = 0
        for c in chunks:
            seq = c.seq
            if c.sample:
                generated += 1
            if seq.num_generated > 0:
                continue  # a decode: its chunk is its newest token
            computed += c.count
            if c.sample:  # its first token: counted once, however often it was preempted
                self.prefill_tokens += seq.prompt_len
                if prefix_cache:
                    self.prefix_hit_tokens += seq.prompt_cached
                    self.prefix_miss_tokens += seq.prompt_len - seq.prompt_cached
        self.generated_tokens += generated
        index = int(self.clock() / _BUCKET_S)
        with self._lock:
            if self._buckets and self._buckets[-1][0] == index:
                self._buckets[-1][1] += computed
                self._buckets[-1][2] += generated
            else:
                self._buckets.append([index, computed, generated])
            self._drop_old(index)

    def rates(self) -> tuple:
        """(prompt tokens computed, tokens generated) per second over the last RATE_WINDOW_S
        (over the counters' lifetime when shorter)."""
        now = self.clock()
        with self._lock:
            self._drop_old(int(now / _BUCKET_S))
            computed = sum(b[1] for b in self._buckets)
            generated = sum(b[2] for b in self._buckets)
        span = min(RATE_WINDOW_S, now - self._started)
        return (computed / span, generated / span) if span > 0 else (0.0, 0.0)

    def _drop_old(self, index) -> None:
        oldest = index - int(RATE_WINDOW_S / _BUCKET_S)
        while self._buckets and self._buckets[0][0] < oldest:
            self._buckets.popleft()


def engine_stat(model_name: str, num_layers: int, loop=None) -> AsEngineStat:
    """The AsEngineStat of a model whose ModelLoop is `loop` (None: installed, never started)."""
    stat = AsEngineStat(model_name)
    if loop is None or loop.pool is None:
        return stat
    pool, scheduler, counters = loop.pool, loop.scheduler, loop.counters
    spans_per_block = 2 * num_layers
    stat.span_size = pool.block_size
    stat.total_span = len(pool.blocks) * spans_per_block
    stat.free_span = pool.num_available * spans_per_block
    stat.used_span = stat.total_span - stat.free_span
    stat.total_token = len(pool.blocks) * pool.block_size
    stat.free_token = pool.num_available * pool.block_size
    stat.token_usage_percentage = (stat.total_token - stat.free_token) / stat.total_token
    stat.running_request = len(scheduler.running)
    stat.pendding_request = len(scheduler.waiting)
    stat.total_prefill_token = counters.prefill_tokens
    stat.total_generated_token = counters.generated_tokens
    stat.process_token_persec, stat.generate_token_persec = counters.rates()
    hit, miss = counters.prefix_hit_tokens, counters.prefix_miss_tokens
    stat.prefix_cache_hit_token, stat.prefix_cache_miss_token = hit, miss
    if hit + miss:
        stat.prefix_cache_hit_rate, stat.prefix_cache_miss_rate = hit / (hit + miss), miss / (hit + miss)
    return stat


def model_info(model_name: str, files, cfg) -> str:
    """A model described: DashInfer's first line ("Model Type : ..."), then its shape, weights and
    how it is served. files: its DashInferModel; cfg: its AsModelRuntimeConfig."""
    c = files.config
    quant = files.quantization
    weights = files.dtype + (f", {quant['weight_format']} weights in groups of {quant['group_size']}"
                             if quant else "")
    return "".join(line + "\n" for line in (
        f"Model Type : {files.architecture}",
        f"Model Name : {model_name} (files {files.model_dir}/{files.prefix}.asgraph, .asparam)",
        f"Layers : {c.num_hidden_layers}, hidden {c.hidden_size}, intermediate {c.intermediate_size}",
        f"Attention : {c.num_attention_heads} heads, {c.num_key_value_heads} KV heads of {c.head_dim}",
        f"Vocabulary : {c.vocab_size}, context {c.max_position_embeddings}",
        f"Weights : {weights}",
        "Model Inputs : input_ids int64 [batch, length]",
        "Model Outputs : generated_ids int64 [batch, length]",
        f"Serving : max_batch {cfg.max_batch}, max_length {cfg.max_length}, KV cache "
        f"{getattr(cfg.kv_cache_mode, 'name', cfg.kv_cache_mode)}, prefix cache "
        f"{'on' if cfg.prefill_cache else 'off'}",
    ))
