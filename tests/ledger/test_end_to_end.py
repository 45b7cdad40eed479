"""Through the real gateway and engine: requests to two models with different prices (and an error) leave ledger
rows whose report figures equal an independent computation from the `usage` the client received, and whose
prompt token counts equal the model tokenizer's count of the rendered prompt.

The meter sink is attached to the running gateway's Record stage here, as gateway.py will attach it."""

from __future__ import annotations

import openai
import pytest

from tests.conftest import SMALL_ENGINE, live_server
from tokenomy.generation import GenRequest
from tokenomy.ledger.ledger import Ledger
from tokenomy.pipeline.sink import MeterSink
from tokenomy.report.figures import build

pytestmark = pytest.mark.slow       # a real engine, client or process (docs/testing.md)

PRICES = {"cheap": {"input": 0.02, "cached_input": 0.005, "output": 0.08},
          "dear": {"input": 0.20, "cached_input": 0.05, "output": 0.60}}
SYSTEM = "You are a terse assistant. " * 12       # a shared prefix, so later prompts reuse its KV


@pytest.fixture(scope="module")
def metered(tmp_path_factory):
    path = tmp_path_factory.mktemp("meter") / "l.db"
    config = {"engine": SMALL_ENGINE, "models": [
        {"name": name, "gguf": "smollm2-135m-instruct", "price": price} for name, price in PRICES.items()],
        "routes": {"auto": {"strategy": "fixed", "models": ["cheap", "dear"]}},
        "cache": {"path": str(path.parent / "cache"), "semantic": {"enabled": False}}}
    with live_server(config) as server, Ledger(f"sqlite:///{path}") as ledger:
        gw = server.gateway
        gw.record.sinks.append(MeterSink(ledger, {m.name: m.price for m in gw.config.models}, gw.metrics,
                                         backends={m.name: m.backend for m in gw.config.models}))
        client = openai.OpenAI(base_url=server.base_url, api_key="unused", max_retries=0, timeout=120)
        sent = []
        for model, question, stream in (("cheap", "Name a colour.", False), ("cheap", "Name a fruit.", False),
                                        ("dear", "Name a colour.", False), ("dear", "Name a tree.", True),
                                        ("auto", "Name a river.", False),
                                        ("cheap", "Name a colour.", False)):     # the last: an exact hit
            messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]
            kw = dict(model=model, messages=messages, max_tokens=6, temperature=0)
            if stream:
                raw = client.chat.completions.with_raw_response.create(
                    **kw, stream=True, stream_options={"include_usage": True})
                usage = [c for c in raw.parse() if c.usage is not None][-1].usage
            else:
                raw = client.chat.completions.with_raw_response.create(**kw)
                usage = raw.parse().usage
            sent.append((raw.headers["x-tokenomy-request-id"], model, messages, usage, raw.headers["x-tokenomy-cache"]))
        with pytest.raises(openai.NotFoundError) as exc:
            client.chat.completions.with_raw_response.create(model="nope", messages=[{"role": "user",
                                                                                      "content": "x"}])
        missing = exc.value.response.headers["x-tokenomy-request-id"]
        assert ledger.flush()
        yield gw, ledger.query(), sent, missing


SERVED = {"cheap": "cheap", "dear": "dear", "auto": "cheap"}     # the fixed route serves on its first model


def bill(model: str, u) -> float:
    p = PRICES[model]
    c = u.prompt_tokens_details.cached_tokens if u.prompt_tokens_details else 0
    return ((u.prompt_tokens - c) * p["input"] + c * p["cached_input"] + u.completion_tokens * p["output"]) / 1e6


def test_rows_match_what_the_client_received(metered):
    gw, rows, sent, missing = metered
    by_id = {r.request_id: r for r in rows}
    assert set(by_id) == {rid for rid, *_ in sent} | {missing}
    assert by_id[missing].status == 404 and by_id[missing].error_code == "model_not_found"
    assert [c for *_, c in sent] == ["miss"] * 5 + ["exact"]
    for rid, model, messages, usage, cache in sent:
        row = by_id[rid]
        cached = usage.prompt_tokens_details.cached_tokens if usage.prompt_tokens_details else 0
        assert (row.model, row.backend, row.cache) == (SERVED[model], "embedded", cache)
        assert row.route == ("auto" if model == "auto" else None)
        assert (row.prompt_tokens, row.cached_tokens, row.completion_tokens) == (
            usage.prompt_tokens, cached, usage.completion_tokens)
        rendered = gw.registry.get(SERVED[model]).count_tokens(GenRequest(model=model, messages=messages))
        assert rendered.exact and row.prompt_tokens == rendered.tokens
        if cache == "miss":
            assert row.ttft_s is not None and row.e2e_s >= row.ttft_s
            assert row.cost_usd == pytest.approx(bill(SERVED[model], usage), rel=1e-12)
        else:
            assert row.cost_usd == 0 and row.ttft_s is None
    assert any(r.cached_tokens for r in rows if r.cache == "miss"), "the shared system prompt should be reused"


def test_report_equals_an_independent_computation_from_client_usage(metered):
    _, rows, sent, _ = metered
    data = build(rows)["total"]
    gen = [(m, u) for _, m, _, u, c in sent if c == "miss"]
    hits = [(m, u) for _, m, _, u, c in sent if c == "exact"]
    billed = sum(u.prompt_tokens + u.completion_tokens for _, u in gen)
    delivered = sum(u.completion_tokens for *_, u, _ in sent)
    cost = sum(bill(SERVED[m], u) for m, u in gen)
    n = len(sent) + 1
    assert data["requests"] == n and data["ok"] == len(sent)
    assert data["tokens"]["billed"] == billed and data["tokens"]["delivered"] == delivered
    assert data["cost_usd"]["total"] == pytest.approx(cost, rel=1e-12)
    assert data["tokens_per_usd"] == pytest.approx(billed / cost)
    assert data["cost_per_1k_tokens_usd"] == pytest.approx(1000 * cost / billed)
    assert data["cost_per_request_usd"] == pytest.approx(cost / n)
    assert data["token_efficiency"] == pytest.approx(delivered / billed)
    cached = sum(u.prompt_tokens_details.cached_tokens for _, u in gen if u.prompt_tokens_details)
    assert data["cache"]["prefix"]["hit_rate"] == pytest.approx(cached / sum(u.prompt_tokens for _, u in gen))
    assert data["cache"]["exact"]["hit_rate"] == pytest.approx(len(hits) / len(sent))
    saved = data["saved"]["by"]
    assert saved["exact"]["usd"] == pytest.approx(sum(bill(SERVED[m], u) for m, u in hits), rel=1e-9)
    assert saved["exact"]["tokens"] == sum(u.prompt_tokens + u.completion_tokens for _, u in hits)
    [(_, routed)] = [(m, u) for m, u in gen if m == "auto"]
    assert saved["route"]["usd"] == pytest.approx(bill("dear", routed) - bill("cheap", routed), rel=1e-9)
    assert data["notional_prices"] == []          # prices given in config are not notional
