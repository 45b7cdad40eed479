"""A real Prometheus (Debian's `prometheus`, started here as tests/helpers/services.py starts Redis and PostgreSQL)
scrapes a running tokenomy server every second, and the queries of vLLM's Grafana dashboard
(vllm/examples/online_serving/prometheus_grafana/grafana.json) return data for the served model.

Without a prometheus binary the test is skipped, naming the fix, except in CI ($CI set), where it fails:
`bash install.sh test` installs it there (apt-get install prometheus)."""

from __future__ import annotations

import math
import os
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.conftest import LiveServer
from tests.helpers import services
from tests.helpers.wait import wait_until
from tokenomy.models.catalog import DEFAULT_MODEL

pytestmark = pytest.mark.slow       # a real engine, client or process (docs/testing.md)

M = f'model_name="{DEFAULT_MODEL}"'
# The vLLM dashboard's queries, its $__rate_interval as 1m
DASHBOARD = {
    "prompt tokens/s": f"rate(vllm:prompt_tokens_total{{{M}}}[1m])",
    "generation tokens/s": f"rate(vllm:generation_tokens_total{{{M}}}[1m])",
    "TTFT p99": f"histogram_quantile(0.99, sum by(le) (rate(vllm:time_to_first_token_seconds_bucket{{{M}}}[1m])))",
    "ITL p99": f"histogram_quantile(0.99, sum by(le) (rate(vllm:inter_token_latency_seconds_bucket{{{M}}}[1m])))",
    "E2E p50": f"histogram_quantile(0.5, sum by(le) (rate(vllm:e2e_request_latency_seconds_bucket{{{M}}}[1m])))",
    "queue time p99": f"histogram_quantile(0.99, sum by(le) "
                      f"(rate(vllm:request_queue_time_seconds_bucket{{{M}}}[1m])))",
    "mean TTFT": f"rate(vllm:time_to_first_token_seconds_sum{{{M}}}[1m]) / "
                 f"rate(vllm:time_to_first_token_seconds_count{{{M}}}[1m])",
    "finished by length": f'rate(vllm:request_success_total{{finished_reason="length",{M}}}[1m])',
    "prompt length heatmap": f"sum by(le) (increase(vllm:request_prompt_tokens_bucket{{{M}}}[1m]))",
    "prefix cache hit rate": f"rate(vllm:prefix_cache_hits_total{{{M}}}[1m]) / "
                             f"rate(vllm:prefix_cache_queries_total{{{M}}}[1m])",
    "running": f"vllm:num_requests_running{{{M}}}",
    "waiting": f"vllm:num_requests_waiting{{{M}}}",
    "KV cache usage": f"vllm:kv_cache_usage_perc{{{M}}}",
}
BY_MODEL = {"prompt tokens/s", "generation tokens/s", "finished by length", "running", "waiting", "KV cache usage"}


@pytest.fixture(scope="module")
def prometheus(request: pytest.FixtureRequest) -> Iterator[str]:
    try:
        binary = services.prometheus_binary()
    except services.ServiceError as e:
        pytest.fail(str(e), pytrace=False)
    if binary is None:
        why = ("no prometheus binary: `bash install.sh test` installs Debian's (apt-get install prometheus), or set "
               f"{services.PROMETHEUS_ENV}=/path/to/prometheus")
        if os.environ.get("CI"):
            pytest.fail(why, pytrace=False)
        pytest.skip(why)
    server: LiveServer = request.getfixturevalue("server")      # only once there is a Prometheus to scrape it
    try:
        prom = services.start_prometheus(binary, [f"127.0.0.1:{server.port}"])
    except services.ServiceError as e:
        pytest.fail(str(e), pytrace=False)
    try:
        yield prom.url
    finally:
        prom.stop()


def query(url: str, promql: str) -> list[dict[str, Any]]:
    r = httpx.get(url + "/api/v1/query", params={"query": promql}, timeout=10)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["status"] == "success", body
    return body["data"]["result"]


def test_prometheus_scrapes_the_vllm_families_and_the_vllm_dashboards_queries_answer(
        server: LiveServer, prometheus: str) -> None:
    def generated() -> float:
        return float(httpx.get(server.root + "/metrics").text.split(
            f'vllm:generation_tokens_total{{engine="0",{M}}} ')[1].split()[0])

    # a rate() needs the counter scraped before the requests too: wait for a sample of it as it stands now
    before = generated()
    wait_until(lambda: any(float(s["value"][1]) == before for s in query(prometheus,
                                                                          f"vllm:generation_tokens_total{{{M}}}")),
               timeout=60, interval=0.25, what="Prometheus to scrape the counters before the requests")
    completion = 0
    with httpx.Client(base_url=server.base_url, timeout=120) as c:
        for i, question in enumerate(("Name a colour.", "Name a fruit.", "Name a tree.")):
            r = c.post("/chat/completions", json={
                "model": DEFAULT_MODEL, "max_tokens": 6, "temperature": 0, "ignore_eos": True, "stream": i == 2,
                "messages": [{"role": "system", "content": "Answer in one word. " * 10},
                             {"role": "user", "content": question}]})
            assert r.status_code == 200
        completion = int(generated())
    assert completion >= before + 18

    def scraped() -> bool:          # Prometheus holds the counter as it stands after the requests
        result = query(prometheus, f"vllm:generation_tokens_total{{{M}}}")
        return bool(result) and float(result[0]["value"][1]) >= completion

    wait_until(scraped, timeout=60, interval=0.25, what="Prometheus to scrape the requests")

    def answered() -> dict[str, list[float]] | None:   # a rate() needs two scrapes of the new values in its range
        answers.update({name: query(prometheus, q) for name, q in DASHBOARD.items()})
        values = {name: [float(s["value"][1]) for s in result] for name, result in answers.items()}
        complete = all(v and not any(math.isnan(x) for x in v) for v in values.values())
        return values if complete and values["generation tokens/s"][0] > 0 else None

    answers: dict[str, list[dict[str, Any]]] = {}
    try:
        values = wait_until(answered, timeout=30, interval=0.25, what="every dashboard query to return data")
    except AssertionError as e:
        raise AssertionError(f"{e}; the last answers: {answers}") from None
    for name in BY_MODEL:
        assert [s["metric"]["model_name"] for s in answers[name]] == [DEFAULT_MODEL], answers[name]
    assert values["TTFT p99"][0] > 0 and values["E2E p50"][0] > 0 and values["ITL p99"][0] > 0
    # the ratio of two rate()s can pass 1: Prometheus extrapolates each counter to the range's edges, capped at
    # its own zero point, so two counters with different first values are stretched differently; the counters
    # themselves never have more hits than queries
    assert 0 <= values["KV cache usage"][0] <= 1 and values["prefix cache hit rate"][0] > 0
    [hits] = query(prometheus, f"vllm:prefix_cache_hits_total{{{M}}}")
    [queries] = query(prometheus, f"vllm:prefix_cache_queries_total{{{M}}}")
    assert 0 < float(hits["value"][1]) <= float(queries["value"][1])
    up = query(prometheus, 'up{job="tokenomy"}')
    assert [s["value"][1] for s in up] == ["1"]


def test_the_exposition_without_per_tenant_families_drops_exactly_them() -> None:
    from prometheus_client.parser import text_string_to_metric_families

    from tokenomy.metrics.prometheus import Metrics

    m = Metrics()
    m.tenant_cost.labels("a").inc(1.5)
    m.tenant_requests.labels("a").inc()
    m.budget_used.labels("tenant", "a", "day", "usd").set(0.5)
    m.cost.labels("other").inc(1.5)
    every = {f.name for f in text_string_to_metric_families(m.render().decode())}
    shown = {f.name for f in text_string_to_metric_families(m.render(per_tenant=False).decode())}
    per_tenant = {"tokenomy_tenant_cost_usd", "tokenomy_tenant_requests", "tokenomy_budget_used_ratio"}
    assert every - shown == per_tenant | {"tokenomy_tenant_cost_usd_created", "tokenomy_tenant_requests_created"}
    assert "tokenomy_cost_usd" in shown and b'tenant="a"' not in m.render(per_tenant=False)
