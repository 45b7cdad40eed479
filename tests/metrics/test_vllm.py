"""tokenomy/metrics/vllm.py against a live engine: the vllm: families a running server's /metrics shows, with
vLLM's names, labels and buckets, count exactly what the engine ran (the usage its clients received), and nothing
of a response-cache hit."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import SMALL_ENGINE, LiveServer, live_server
from tests.helpers.wait import wait_until
from tokenomy.metrics.vllm import buckets_1_2_5, finished_reason
from tokenomy.models.catalog import DEFAULT_MODEL

pytestmark = pytest.mark.slow       # a real engine, client or process (docs/testing.md)

SYSTEM = "You are a terse assistant. Answer in one word. " * 8      # a shared prefix the engine's cache keeps
LABELS = {"model_name": DEFAULT_MODEL, "engine": "0"}


@pytest.fixture(scope="module")
def srv() -> Iterator[LiveServer]:
    with live_server({"engine": {**SMALL_ENGINE, "n_threads": 1},
                      "cache": {"exact": {"enabled": True}, "semantic": {"enabled": False}}}) as s:
        yield s


def scrape(root: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of the server's /metrics: (name, sorted labels) -> value."""
    text = httpx.get(root + "/metrics", timeout=30).text
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for f in text_string_to_metric_families(text) for s in f.samples}


def value(samples: dict, name: str, **labels: str) -> float:
    return samples[(name, tuple(sorted({**LABELS, **labels}.items())))]


def chat(question: str, **extra: Any) -> dict[str, Any]:
    return {"model": DEFAULT_MODEL, "max_tokens": 6, "temperature": 0, "ignore_eos": True,
            "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}], **extra}


def test_vllm_families_count_what_the_engine_ran_and_no_cache_hit(srv: LiveServer) -> None:
    with httpx.Client(base_url=srv.base_url, timeout=120) as c:
        assert c.post("/chat/completions", json=chat("Warm up.")).status_code == 200
        before = scrape(srv.root)
        ran = [c.post("/chat/completions", json=chat(q)) for q in ("Name a colour.", "Name a fruit.")]
        hit = c.post("/chat/completions", json=chat("Name a colour."))
    assert [r.status_code for r in ran] == [200, 200] and hit.headers["x-tokenomy-cache"] == "exact"
    assert all(r.headers["x-tokenomy-cache"] == "miss" for r in ran)
    usage = [r.json()["usage"] for r in ran]
    after = scrape(srv.root)

    def delta(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    prompt = sum(u["prompt_tokens"] for u in usage)
    completion = sum(u["completion_tokens"] for u in usage)
    cached = sum(u["prompt_tokens_details"]["cached_tokens"] for u in usage)
    assert cached > 0                                       # the second prompt reused the shared system prefix
    assert delta("vllm:prompt_tokens_total") == prompt
    assert delta("vllm:generation_tokens_total") == completion == 12
    assert delta("vllm:request_success_total", finished_reason="length") == 2
    assert delta("vllm:request_success_total", finished_reason="stop") == 0
    assert delta("vllm:prefix_cache_queries_total") == prompt          # tokens looked up, as vLLM counts them
    assert delta("vllm:prefix_cache_hits_total") == cached
    for family in ("time_to_first_token_seconds", "e2e_request_latency_seconds", "request_queue_time_seconds",
                   "request_time_per_output_token_seconds", "request_prefill_time_seconds",
                   "request_decode_time_seconds", "request_prompt_tokens", "request_generation_tokens"):
        assert delta(f"vllm:{family}_count") == 2, family
    assert delta("vllm:inter_token_latency_seconds_count") == completion - 2     # the gaps between tokens
    assert delta("vllm:inter_token_latency_seconds_sum") > 0
    assert delta("vllm:iteration_tokens_total_count") >= completion // 2
    assert delta("vllm:request_prompt_tokens_sum") == prompt
    # live state: idle now, and the KV holds the cached prefix (a share, 0..1)
    assert value(after, "vllm:num_requests_running") == 0 and value(after, "vllm:num_requests_waiting") == 0
    assert 0 < value(after, "vllm:kv_cache_usage_perc") <= 1
    # vLLM's buckets: TTFT up to 2560 s, request latencies up to 7680 s, token counts 1-2-5 up to max_model_len
    assert value(after, "vllm:time_to_first_token_seconds_bucket", le="2560.0") == \
        value(after, "vllm:time_to_first_token_seconds_count")
    assert ("vllm:e2e_request_latency_seconds_bucket", tuple(sorted({**LABELS, "le": "7680.0"}.items()))) in after
    les = {dict(k[1])["le"] for k in after if k[0] == "vllm:request_prompt_tokens_bucket"}
    assert les == {f"{float(b)}" for b in buckets_1_2_5(SMALL_ENGINE["max_model_len"])} | {"+Inf"}
    # the gateway's own families still count the cache hit
    assert after[("tokenomy_cache_requests_total", (("cache", "exact"), ("model", DEFAULT_MODEL)))] >= 1
    assert not any(n.startswith("vllm:") and dict(k).get("model_name") != DEFAULT_MODEL for n, k in after)


def test_a_stream_the_client_leaves_is_an_abort(srv: LiveServer) -> None:
    key = ("vllm:request_success_total", tuple(sorted({**LABELS, "finished_reason": "abort"}.items())))
    before = scrape(srv.root)[key]
    with httpx.Client(base_url=srv.base_url, timeout=120) as c, \
            c.stream("POST", "/chat/completions", json=chat("Count to a thousand.", max_tokens=400,
                                                            stream=True)) as r:
        for line in r.iter_lines():
            if line.startswith("data: {") and json.loads(line[6:])["choices"][0]["delta"].get("content"):
                break                                       # then leave, mid-answer
    wait_until(lambda: scrape(srv.root)[key] == before + 1, timeout=60, what="the abandoned stream counted")
    wait_until(lambda: value(scrape(srv.root), "vllm:num_requests_running") == 0, what="the engine idle again")


def test_finished_reasons_and_buckets_are_vllms() -> None:
    assert [finished_reason(r) for r in ("stop", "tool_calls", "length", "cancelled", "error", None)] == \
        ["stop", "stop", "length", "abort", "error", "stop"]
    assert buckets_1_2_5(100) == (1, 2, 5, 10, 20, 50, 100)       # vLLM's own docstring example
