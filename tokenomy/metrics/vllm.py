"""vLLM's metric families for the embedded engines, beside the tokenomy_ ones: what reads a vLLM server (its Grafana
dashboards, KEDA rules, cache-aware routers, tokenomy's own backends/load_signals.py) reads a tokenomy engine
unchanged. Names, help, units, buckets and labels (`model_name`, `engine`) as vLLM's V1 engine publishes them
(vllm/v1/metrics/loggers.py, vllm/v1/spec_decode/metrics.py); counters show with `_total`. Only embedded models
get series: an upstream is a model server of its own and publishes its own.

Each fact comes from the one place that already computes it:
  vllm:num_requests_running, _waiting, kv_cache_usage_perc   the engine's last step report, read at scrape time
  vllm:prefix_cache_queries / _hits (tokens), num_preemptions, spec_decode_*, iteration_tokens_total
                                                             the engine's step counters (gateway.watch_engine -> step)
  vllm:prompt_tokens, generation_tokens, request_success{finished_reason}, time_to_first_token_seconds,
  e2e_request_latency_seconds, request_queue_time_seconds, request_{prefill,decode,inference}_time_seconds,
  request_{prompt,generation}_tokens, request_time_per_output_token_seconds, inter_token_latency_seconds
                                                             the usage the engine reported, at the Record stage
                                                             (request), for requests the engine ran (no
                                                             response-cache hit)

vllm:inter_token_latency_seconds: vLLM observes each gap between two tokens of a request; tokenomy knows a request's
decode time and its number of gaps, and observes their mean once per gap. Its sum and count are vLLM's; how the
gaps of one request spread around their mean is not seen.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterable
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.utils import floatToGoString

LABELS = ["model_name", "engine"]
ENGINE = "0"        # one engine process per model: vLLM's engine (data-parallel rank) 0
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
                40.0, 80.0, 160.0, 640.0, 2560.0)
TOKEN_LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
                         40.0, 80.0)
REQUEST_LATENCY_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
                           240.0, 480.0, 960.0, 1920.0, 7680.0)
ITERATION_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
FINISHED_REASONS = ("stop", "length", "abort", "error")     # vLLM's FinishReason


def finished_reason(reason: str | None) -> str:
    """vLLM's finished_reason for an answer's finish_reason: length, abort (the client left), error, else stop
    (tool calls and stop strings end a sequence as a stop does)."""
    return {"length": "length", "cancelled": "abort", "error": "error"}.get(reason or "", "stop")


def buckets_1_2_5(max_value: int) -> tuple[int, ...]:
    """vLLM's build_1_2_5_buckets: 1, 2, 5, 10, 20, 50, ... up to max_value (a model's max_model_len)."""
    out, scale = [], 1
    while True:
        for m in (1, 2, 5):
            if m * scale > max_value:
                return tuple(out)
            out.append(m * scale)
        scale *= 10


class SpreadHistogram:
    """A histogram that takes one value observed `count` times in one call (a request's mean gap between tokens,
    once per gap), exported as a Prometheus histogram with `buckets`."""

    def __init__(self, name: str, documentation: str, buckets: tuple[float, ...]) -> None:
        self.name, self.documentation, self.buckets = name, documentation, buckets
        self._series: dict[tuple[str, ...], tuple[list[float], list[float]]] = {}   # labels -> (counts, [sum])
        self._lock = threading.Lock()
        # several workers (metrics/prometheus.py): the counts go to prometheus-client's files, where every worker's
        # are summed, as a Histogram's own (its buckets are per bucket until exposed, as ours)
        self._shared: Histogram | None = None
        if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
            self._shared = Histogram(name, documentation, LABELS, buckets=buckets, registry=None)

    def observe(self, labels: tuple[str, ...], value: float, count: int = 1) -> None:
        if self._shared is not None:
            child = self._shared.labels(*labels)
            i = next((i for i, le in enumerate(self.buckets) if value <= le), len(self.buckets))
            child._buckets[i].inc(count)
            child._sum.inc(value * count)
            return
        with self._lock:
            counts, total = self._series.setdefault(labels, ([0.0] * (len(self.buckets) + 1), [0.0]))
            i = next((i for i, le in enumerate(self.buckets) if value <= le), len(self.buckets))
            counts[i] += count
            total[0] += value * count

    def collect(self) -> Iterable[HistogramMetricFamily]:
        if self._shared is not None:
            return
        family = HistogramMetricFamily(self.name, self.documentation, labels=LABELS)
        with self._lock:
            series = [(labels, list(counts), total[0]) for labels, (counts, total) in self._series.items()]
        for labels, counts, total in series:
            cumulative, running = [], 0.0
            for le, n in zip((*self.buckets, float("inf")), counts, strict=True):
                running += n
                cumulative.append((floatToGoString(le), running))
            family.add_metric(list(labels), cumulative, total)
        yield family


class EngineGauges:
    """vllm:num_requests_running, vllm:num_requests_waiting and vllm:kv_cache_usage_perc, read from the engines'
    live state at scrape time (the same state the tokenomy_engine_* gauges read)."""

    def __init__(self, engines: Callable[[], Iterable[tuple[str, Any]]]) -> None:
        self._engines = engines

    def collect(self) -> Iterable[GaugeMetricFamily]:
        running = GaugeMetricFamily("vllm:num_requests_running", "Number of requests in model execution batches.",
                                    labels=LABELS)
        waiting = GaugeMetricFamily("vllm:num_requests_waiting", "Number of requests waiting to be processed.",
                                    labels=LABELS)
        kv = GaugeMetricFamily("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.",
                               labels=LABELS)
        for name, engine in self._engines():
            running.add_metric([name, ENGINE], engine.running)
            waiting.add_metric([name, ENGINE], engine.queue_depth)
            kv.add_metric([name, ENGINE], engine.kv_usage)
        yield from (running, waiting, kv)


class VllmMetrics:
    """The vLLM families on `registry` for the engines `engines()` lists (name, EngineClient). Every series of every
    engine exists from the start at 0, as vLLM's do, so a rate() over a quiet engine is 0, not empty."""

    def __init__(self, registry: CollectorRegistry, engines: Callable[[], Iterable[tuple[str, Any]]],
                 windows: dict[str, int] | None = None) -> None:
        """`windows`: every embedded model's window by name, loaded or not (the fleet's); default: the engines
        running now."""
        lengths = windows if windows is not None else {name: engine.max_model_len for name, engine in engines()}
        self.models = frozenset(lengths)
        r, per_request = registry, buckets_1_2_5(max(lengths.values(), default=0) or 2048)

        def counter(name: str, doc: str, extra: tuple[str, ...] = ()) -> Counter:
            return Counter(name, doc, [*LABELS, *extra], registry=r)

        def histogram(name: str, doc: str, buckets: tuple[float, ...]) -> Histogram:
            return Histogram(name, doc, LABELS, buckets=buckets, registry=r)

        # engine steps
        self.prefix_queries = counter("vllm:prefix_cache_queries", "Prefix cache queries, in terms of number of "
                                      "queried tokens.")
        self.prefix_hits = counter("vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached "
                                   "tokens.")
        self.preemptions = counter("vllm:num_preemptions", "Cumulative number of preemption from the engine.")
        self.iteration_tokens = histogram("vllm:iteration_tokens_total", "Histogram of number of tokens per "
                                          "engine_step.", ITERATION_BUCKETS)
        self.spec = (counter("vllm:spec_decode_num_drafts", "Number of spec decoding drafts."),
                     counter("vllm:spec_decode_num_draft_tokens", "Number of draft tokens."),
                     counter("vllm:spec_decode_num_accepted_tokens", "Number of accepted tokens."))
        # requests
        self.prompt_tokens = counter("vllm:prompt_tokens", "Number of prefill tokens processed.")
        self.generation_tokens = counter("vllm:generation_tokens", "Number of generation tokens processed.")
        self.success = counter("vllm:request_success", "Count of successfully processed requests.",
                               ("finished_reason",))
        self.request_prompt_tokens = histogram("vllm:request_prompt_tokens", "Number of prefill tokens processed.",
                                               per_request)
        self.request_generation_tokens = histogram("vllm:request_generation_tokens", "Number of generation tokens "
                                                   "processed.", per_request)
        self.ttft = histogram("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.",
                              TTFT_BUCKETS)
        self.tpot = histogram("vllm:request_time_per_output_token_seconds", "Histogram of "
                              "time_per_output_token_seconds per request.", TOKEN_LATENCY_BUCKETS)
        self.e2e = histogram("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.",
                             REQUEST_LATENCY_BUCKETS)
        self.queue = histogram("vllm:request_queue_time_seconds", "Histogram of time spent in WAITING phase for "
                               "request.", REQUEST_LATENCY_BUCKETS)
        self.inference = histogram("vllm:request_inference_time_seconds", "Histogram of time spent in RUNNING "
                                   "phase for request.", REQUEST_LATENCY_BUCKETS)
        self.prefill = histogram("vllm:request_prefill_time_seconds", "Histogram of time spent in PREFILL phase "
                                 "for request.", REQUEST_LATENCY_BUCKETS)
        self.decode = histogram("vllm:request_decode_time_seconds", "Histogram of time spent in DECODE phase for "
                                "request.", REQUEST_LATENCY_BUCKETS)
        self.itl = SpreadHistogram("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in "
                                   "seconds.", TOKEN_LATENCY_BUCKETS)
        self.collectors = [self.itl, EngineGauges(engines)]   # read at scrape time (Metrics.shared has them too)
        for c in self.collectors:
            r.register(c)
        # each engine's series, bound once (as vLLM's make_per_engine): they exist from the start, and a request
        # costs no label lookups
        self._bound = {name: self._bind(name) for name in self.models}

    def _of(self, model: str) -> dict[str, Any]:
        """`model`'s bound series; bound now for a model added while serving (Gateway.add_model)."""
        b = self._bound.get(model)
        if b is None:
            b = self._bound[model] = self._bind(model)
        return b

    def _bind(self, model: str) -> dict[str, Any]:
        lv = (model, ENGINE)
        bound: dict[str, Any] = {attr: getattr(self, attr).labels(*lv) for attr in (
            "prefix_queries", "prefix_hits", "preemptions", "iteration_tokens", "prompt_tokens", "generation_tokens",
            "request_prompt_tokens", "request_generation_tokens", "ttft", "tpot", "e2e", "queue", "inference",
            "prefill", "decode")}
        bound["spec"] = tuple(c.labels(*lv) for c in self.spec)
        bound["success"] = {reason: self.success.labels(*lv, reason) for reason in FINISHED_REASONS}
        self.itl.observe(lv, 0.0, 0)
        return bound

    def step(self, model: str, n_tokens: int, preempted: int, queried: int, hit: int,
             spec: tuple[int, int, int]) -> None:
        """One engine step of `model`: tokens it decoded, and what the engine's counters grew by since the last."""
        b = self._of(model)
        b["iteration_tokens"].observe(n_tokens)
        for counter, n in ((b["preemptions"], preempted), (b["prefix_queries"], queried), (b["prefix_hits"], hit),
                           *zip(b["spec"], spec, strict=True)):
            if n:
                counter.inc(n)

    def tokens(self, model: str, prompt: int, generation: int) -> None:
        """Tokens of a part of an answer `model` wrote (token-level routing), counted without the request."""
        b = self._of(model)
        b["prompt_tokens"].inc(prompt)
        b["generation_tokens"].inc(generation)

    def request(self, model: str, usage: Any, reason: str | None, tpot: float | None = None, gaps: int = 0) -> None:
        """A request the engine of `model` finished (its usage, generation.Usage, and finish_reason); `tpot`, when
        known, is its mean time per token after the first over its `gaps` gaps between tokens."""
        b, u = self._of(model), usage
        b["prompt_tokens"].inc(u.prompt_tokens)
        b["generation_tokens"].inc(u.completion_tokens)
        b["success"][finished_reason(reason)].inc()
        b["request_prompt_tokens"].observe(u.prompt_tokens)
        b["request_generation_tokens"].observe(u.completion_tokens)
        queue = max(u.queue_s, 0.0)
        b["e2e"].observe(u.e2e_s)
        b["queue"].observe(queue)
        b["inference"].observe(max(u.e2e_s - queue, 0.0))
        if u.ttft_s is not None:
            b["ttft"].observe(u.ttft_s)
            b["prefill"].observe(max(u.ttft_s - queue, 0.0))
            b["decode"].observe(max(u.e2e_s - u.ttft_s, 0.0))
        if tpot is not None and gaps > 0:
            b["tpot"].observe(tpot)
            self.itl.observe((model, ENGINE), tpot, gaps)
