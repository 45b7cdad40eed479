"""The context stage in the live gateway on the embedded model: compaction with cached summaries, the opt-out,
the lint's header, metric and report section, and the ledger's tokens before and after."""

from __future__ import annotations

import httpx
import pytest

from tests.conftest import NO_CACHE, SMALL_ENGINE, live_server
from tokenomy.report.figures import build, render_table

pytestmark = pytest.mark.slow       # a real engine, client or process (docs/testing.md)

MODEL = "smollm2-135m-instruct"
SYSTEM = "You are a travel assistant. Answer in one short sentence."
RULES = "You are the help desk of a library. Answer briefly, name the shelf, and never invent titles."


def post(gw, route, messages, headers=None):
    body = {"model": route, "messages": messages, "max_tokens": 4, "temperature": 0}
    return httpx.post(gw.base_url + "/chat/completions", json=body, headers=headers or {}, timeout=120)


def conversation(turns: int) -> list[dict]:
    msgs = [{"role": "system", "content": SYSTEM}]
    for i in range(turns):
        msgs += [{"role": "user", "content": f"Day {i}: which city should I visit next, and why?"},
                 {"role": "assistant", "content": f"Visit city number {i}, it has a fine old harbour and a market."}]
    return msgs + [{"role": "user", "content": "And after that?"}]


@pytest.fixture(scope="module")
def gw():
    cfg = {"engine": {**SMALL_ENGINE, "n_threads": 1}, "cache": NO_CACHE,
           "models": [{"name": MODEL}],
           "routes": {
               "chat": {"models": [MODEL], "context": {"compaction": {
                   "trigger_tokens": 300, "keep_last_turns": 2, "strategy": "summarize", "summary_model": MODEL,
                   "max_summary_tokens": 24}}},
               "desk": {"models": [MODEL], "context": {"lint": True}},
               "fixed": {"models": [MODEL], "context": {"lint": True, "rewrite": True}},
               "docs": {"models": [MODEL], "context": {"compress": {"min_tokens": 32}}},
               "fitted": {"models": [MODEL], "context": {"fit": "on", "fit_min_answer": 256}},
               "strict": {"models": [MODEL], "context": {"fit": "off"}}}}
    with live_server(cfg) as s:
        stage = next(st for st in s.gateway.pipeline.stages if st.name == "context")
        calls = []
        real = stage.summarize

        async def counting(model, text, n, batch):
            calls.append(text)
            return await real(model, text, n, batch)

        stage.summarize = counting
        s.summary_calls = calls
        yield s


def test_compaction_summarizes_once_and_reuses_the_summary_next_turn(gw):
    first = post(gw, "chat", conversation(14))
    assert first.status_code == 200, first.text
    assert "compaction=summarize" in first.headers["x-tokenomy-context"] and "summary=new" in \
        first.headers["x-tokenomy-context"]
    assert len(gw.summary_calls) == 1
    second = post(gw, "chat", conversation(15))
    assert "summary=cached" in second.headers["x-tokenomy-context"]
    assert len(gw.summary_calls) == 1                  # the second turn did not call the summary model again
    off = post(gw, "chat", conversation(15), {"x-tokenomy-context": "off"})
    assert off.headers["x-tokenomy-context"] == "off"
    assert off.json()["usage"]["prompt_tokens"] > second.json()["usage"]["prompt_tokens"]
    bad = post(gw, "chat", conversation(2), {"x-tokenomy-context": "maybe"})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "x-tokenomy-context"

    gw.gateway.ledger.flush()
    rows = {r.request_id: r for r in gw.gateway.ledger.query()}
    r1 = rows[first.headers["x-tokenomy-request-id"]]
    assert r1.context_tokens_before > r1.context_tokens_after == r1.prompt_tokens
    assert r1.context_cost_usd > 0 and "summarize" in r1.context_actions
    assert r1.saved_by["compress"]["tokens"] == r1.context_tokens_before - r1.context_tokens_after
    assert rows[off.headers["x-tokenomy-request-id"]].context_tokens_before is None


def test_lint_finds_a_date_early_in_the_system_prompt(gw):
    ids = []
    for day, q in (("2026-11-30 08:01", "Where are the atlases?"), ("2026-12-01 17:45", "Where is poetry?")):
        msgs = [{"role": "system", "content": f"Now: {day}. {RULES}"}, {"role": "user", "content": q}]
        r = post(gw, "desk", msgs, {"x-tokenomy-lint": "on"})
        assert r.status_code == 200, r.text
        ids.append(r.headers["x-tokenomy-request-id"])
    assert "break=volatile" in r.headers["x-tokenomy-lint"] and "2026-12-01 17:45" in r.headers["x-tokenomy-lint"]
    metrics = httpx.get(gw.root + "/metrics").text
    assert 'tokenomy_prefix_break_total{reason="volatile"}' in metrics
    gw.gateway.ledger.flush()
    data = build(gw.gateway.ledger.query())
    lint = data["lint"]["default"]
    assert lint["breaks"]["volatile"] >= 1 and lint["possible_share"] > lint["cached_share"]
    assert any("2026-12-01 17:45" in s["span"] for s in lint["spans"])
    assert "Prompt layout, tenant default" in render_table(data)


def test_rewrite_moves_the_date_line_and_the_prefix_holds(gw):
    for day, q in (("2026-11-30", "Where are the atlases?"), ("2026-12-01", "Where is poetry?")):
        msgs = [{"role": "system", "content": f"Today is {day}.\n{RULES}"}, {"role": "user", "content": q}]
        r = post(gw, "fixed", msgs, {"x-tokenomy-lint": "on"})
    assert "rewrite=moved 1" in r.headers["x-tokenomy-context"]
    assert "break=" not in r.headers["x-tokenomy-lint"]
    assert post(gw, "desk", [{"role": "user", "content": "hi"}], {"x-tokenomy-lint": "yes"}).status_code == 400


def test_compression_switches_itself_off_on_the_embedded_engine(gw):
    # the target is the compressor's own model on the same CPU: reading the text costs what its prefill saves
    text = "The harbour of the old town was rebuilt in 1890 after a storm, and the market moved near it. " * 6
    r = post(gw, "docs", [{"role": "user", "content": text + "\n\nQuestion: When was the harbour rebuilt?"}])
    assert r.status_code == 200, r.text
    assert "compress=skipped" in r.headers["x-tokenomy-context"]


def test_a_priced_upstream_gets_compressed_and_the_compressor_is_charged():
    import asyncio

    from tokenomy.config import RouteSpec
    from tokenomy.context.tokens import TokenCount
    from tokenomy.generation import GenRequest
    from tokenomy.pipeline.context import Context
    from tokenomy.pipeline.request import RequestContext

    def count(model, ctx):
        return TokenCount(sum(len(str(m["content"]).split()) for m in ctx.gen.messages), exact=False)

    route = RouteSpec.model_validate({"models": ["up"], "context": {"compress": {"min_tokens": 32}}})
    prices = {"up": (0.2e-6, False), MODEL: (0.02e-6, True)}
    stage = Context(count, {"up": route}, input_price=lambda m, batch: prices.get(m, (0.0, True)))
    text = "The harbour of the old town was rebuilt in 1890 after a storm, and the market moved near it. " * 6
    ctx = RequestContext(gen=GenRequest(model="up", messages=[{"role": "user", "content": text}]))

    async def end(_):
        return None

    asyncio.run(stage(ctx, end))
    work = ctx.context_work
    assert work is not None and work.after < work.before and work.cost_usd > 0
    assert "1890" in ctx.gen.messages[0]["content"]
    assert "compress=" in ctx.response_headers["x-tokenomy-context"]


LONG_TOOL = {"type": "function", "function": {
    "name": "lookup", "description": "Look a word up in the dictionary. " + "It knows many words and their meanings, "
    "and it answers with the definition, the etymology and examples of use. " * 40,
    "parameters": {"type": "object", "properties": {
        "word": {"type": "string", "description": "The word to look up. " * 30},
        "description": {"type": "string", "description": "A property named description stays. " * 10}},
        "required": ["word"]}}}


def test_fit_keeps_an_agent_sized_request_valid_on_a_small_window(gw):
    """A request over the 2048-token window (a tool described at length, a long history, a max_tokens past the
    window) is refused without fitting, and answered with it: tools described briefly, old turns dropped and
    max_tokens lowered, each said in the header and the ledger row."""
    msgs = conversation(40)
    body = {"messages": msgs, "tools": [LONG_TOOL], "max_tokens": 32000, "temperature": 0}
    refused = httpx.post(gw.base_url + "/chat/completions", json={**body, "model": "strict"}, timeout=120)
    assert refused.status_code == 400 and refused.json()["error"]["code"] == "context_length_exceeded"
    r = httpx.post(gw.base_url + "/chat/completions", json={**body, "model": "fitted", "max_tokens": 8},
                   timeout=120)
    assert r.status_code == 200, r.text
    header = r.headers["x-tokenomy-context"]
    assert "fit=tools described briefly" in header and "oldest turn(s)" in header
    before, after = (int(x) for x in header.rsplit("tokens=", 1)[1].split("->"))
    assert before > 2048 >= after + 256
    assert r.json()["usage"]["prompt_tokens"] == after
    big = httpx.post(gw.base_url + "/chat/completions", json={**body, "model": "fitted"}, timeout=120)
    assert big.status_code == 200, big.text
    assert f"fit=max_tokens 32000->{2048 - after}" in big.headers["x-tokenomy-context"]
    assert big.json()["usage"]["prompt_tokens"] + big.json()["usage"]["completion_tokens"] <= 2048
    off = httpx.post(gw.base_url + "/chat/completions", json={**body, "model": "fitted"}, timeout=120,
                     headers={"x-tokenomy-context": "off"})
    assert off.status_code == 400
