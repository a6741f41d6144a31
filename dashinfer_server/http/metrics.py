"""Prometheus metrics of the HTTP server (prometheus-client, one registry per app).

Counted here as answers are produced: prompt and generated tokens, finished requests by finish
reason, time to first token, inter-token latency and request latency (as the client sees them,
from the request's arrival at the server). Read from the engine at each scrape: requests running
and waiting, KV cache blocks used and total, preemptions, and rank group restarts. Read from the
admission gate (admission.py): requests held and queued in the server, refused with 429, ended by
their deadline.
"""
import asyncio
import logging

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

log = logging.getLogger("dashinfer_server.http")
PREFIX = "dashinfer"
THROUGHPUT_EVERY_S = 10.0
_LATENCY_BUCKETS = (0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1, 2.5, 5,
                    10, 20, 40, 80)
_REQUEST_BUCKETS = (0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 40, 60, 120, 300, 600)


class Metrics:
    def __init__(self, served, admission=None):
        self.registry = CollectorRegistry()
        labels = {"model_name": served.name}
        r = self.registry
        self.prompt_tokens = Counter(f"{PREFIX}_prompt_tokens", "Prompt tokens of finished requests",
                                     ["model_name"], registry=r).labels(**labels)
        self.generated_tokens = Counter(f"{PREFIX}_generation_tokens", "Tokens generated",
                                        ["model_name"], registry=r).labels(**labels)
        self.requests = Counter(f"{PREFIX}_request_success", "Requests answered to their end, by finish reason",
                                ["model_name", "finish_reason"], registry=r)
        self.ttft = Histogram(f"{PREFIX}_time_to_first_token_seconds", "Time to first token",
                              ["model_name"], buckets=_LATENCY_BUCKETS, registry=r).labels(**labels)
        self.itl = Histogram(f"{PREFIX}_inter_token_latency_seconds", "Time between tokens of a request",
                             ["model_name"], buckets=_LATENCY_BUCKETS, registry=r).labels(**labels)
        self.latency = Histogram(f"{PREFIX}_request_latency_seconds", "Request latency, arrival to last token",
                                 ["model_name"], buckets=_REQUEST_BUCKETS, registry=r).labels(**labels)
        r.register(_EngineCollector(served))
        if admission is not None:
            r.register(_AdmissionCollector(served.name, admission))
        self.name = served.name
        self.counts = {"requests": 0, "prompt": 0, "generated": 0}  # for the throughput line

    def tokens(self, n, seconds, first) -> None:
        """n tokens arrived `seconds` after the previous ones (after the request's arrival: first)."""
        self.generated_tokens.inc(n)
        self.counts["generated"] += n
        if first:
            self.ttft.observe(seconds)
            n -= 1
            seconds = 0.0
        for _ in range(n):
            self.itl.observe(seconds / n)

    def finished(self, usage, seconds, reason) -> None:
        self.prompt_tokens.inc(usage.prompt_tokens)
        self.counts["prompt"] += usage.prompt_tokens
        self.counts["requests"] += 1
        self.requests.labels(model_name=self.name, finish_reason=reason).inc()
        self.latency.observe(seconds)

    async def log_throughput(self, every=THROUGHPUT_EVERY_S) -> None:
        """One INFO line every `every` seconds in which tokens were generated (silent when idle)."""
        last = dict(self.counts)
        while True:
            await asyncio.sleep(every)
            now = dict(self.counts)
            if now["generated"] != last["generated"]:
                log.info("throughput: %.1f generated tok/s, %.1f prompt tok/s, %d requests finished in %.0f s",
                         (now["generated"] - last["generated"]) / every, (now["prompt"] - last["prompt"]) / every,
                         now["requests"] - last["requests"], every)
            last = now

    def render(self) -> bytes:
        return generate_latest(self.registry)


class _EngineCollector:
    """Gauges read from the engine at scrape time (nothing polls it in between)."""

    def __init__(self, served):
        self.served = served

    def collect(self):
        served = self.served
        labels = ["model_name"]
        restarts = CounterMetricFamily(f"{PREFIX}_rank_group_restarts", "Times the rank group was lost "
                                       "and brought back", labels=labels)
        restarts.add_metric([served.name], served.restarts)
        yield restarts
        stats = served.stats()
        if not stats:
            return
        for key, help_text in (("running", "Requests running"), ("waiting", "Requests waiting to be admitted")):
            g = GaugeMetricFamily(f"{PREFIX}_requests_{key}", help_text, labels=labels)
            g.add_metric([served.name], stats[key])
            yield g
        total, free = stats["kv_blocks_total"], stats["kv_blocks_free"]
        for key, value, help_text in (("used", total - free, "KV cache blocks in use"),
                                      ("total", total, "KV cache blocks")):
            g = GaugeMetricFamily(f"{PREFIX}_kv_cache_blocks_{key}", help_text, labels=labels)
            g.add_metric([served.name], value)
            yield g
        preemptions = CounterMetricFamily(f"{PREFIX}_kv_preemptions", "Requests preempted for KV blocks "
                                          "(their tokens recomputed later)", labels=labels)
        preemptions.add_metric([served.name], stats.get("preemptions", 0))
        yield preemptions


class _AdmissionCollector:
    """The admission gate's figures (admission.py), read at scrape time without the engine."""

    def __init__(self, name, admission):
        self.name, self.admission = name, admission

    def collect(self):
        gate, labels = self.admission, ["model_name"]
        for kind, key, value, help_text in (
                (GaugeMetricFamily, "http_requests_held", gate.held, "Requests the HTTP server holds (running or queued)"),
                (GaugeMetricFamily, "http_queue_length", gate.waiting, "Requests held beyond the engine's batch"),
                (CounterMetricFamily, "http_requests_refused", gate.refused, "Requests refused with 429 (queue full)"),
                (CounterMetricFamily, "http_requests_timed_out", gate.timed_out, "Requests ended by their deadline")):
            metric = kind(f"{PREFIX}_{key}", help_text, labels=labels)
            metric.add_metric([self.name], value)
            yield metric
