"""The reserve stage (pipeline/reserve.py) through the live API: concurrent requests never spend past a budget or
a rate limit, in one gateway and in two on one Redis; holds settle however a request ends; a fallback to a dearer
model reserves the difference; a killed gateway's holds lapse with their lease."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.conftest import NO_CACHE, free_port, live_server
from tests.helpers.upstream_stub import Stub
from tests.helpers.wait import wait_until
from tests.pipeline.test_gateway_upstream import StubServer
from tokenomy.generation import GenRequest
from tokenomy.pipeline.request import RequestContext

pytestmark = pytest.mark.slow       # a real engine, client or process (docs/testing.md)

PRICE = {"input": 1000, "output": 1000}          # USD per 1M: a request's tokens / 1000 is its cost in USD
MESSAGES = [{"role": "user", "content": "Hi"}]


def config(stub_port: int, keys: list[dict[str, Any]], limits: dict[str, Any] | None = None,
           **extra: Any) -> dict[str, Any]:
    return {"cache": NO_CACHE, "keys": keys, "limits": limits or {},
            "models": [{"name": "remote", "backend": "openai", "base_url": f"http://127.0.0.1:{stub_port}/v1",
                        "model": "stub", "tokenizer": "smollm2-135m-instruct", "max_retries": 0, "price": PRICE}],
            **extra}


def reserved(server: Any, max_tokens: int = 5, model: str = "remote") -> float:
    """Tokens the gateway holds for one MESSAGES request with this max_tokens (its prompt count + max_tokens)."""
    g = server.gateway
    ctx = RequestContext(gen=GenRequest(model=model, messages=MESSAGES, params={"max_tokens": max_tokens}))
    tc = g.count_tokens(model, ctx)
    ctx.prompt_tokens, ctx.prompt_tokens_exact, ctx.candidates = tc.tokens, tc.exact, [model]
    return g.reserve.bound(ctx, model)[0]


async def burst(urls: list[str], key: str, n: int, max_tokens: int = 5, model: str = "remote") -> list[httpx.Response]:
    """`n` requests at once, spread over the gateways at `urls`."""
    async with httpx.AsyncClient(timeout=60, limits=httpx.Limits(max_connections=n)) as client:
        return await asyncio.gather(*[
            client.post(urls[i % len(urls)] + "/chat/completions", headers={"authorization": f"Bearer {key}"},
                        json={"model": model, "max_tokens": max_tokens, "messages": MESSAGES})
            for i in range(n)])


def ledger_rows(*servers: Any, key_id: str | None = None) -> list[Any]:
    rows = []
    for s in servers:
        s.gateway.ledger.flush()
        rows += [r for r in s.gateway.ledger.query() if key_id is None or r.key_id == key_id]
    return rows


def settled(*servers: Any) -> bool:
    return all(not s.gateway.budgets.holding and not s.gateway.reserve.windows.holding for s in servers)


@pytest.mark.parametrize("limit", ["tokens", "usd", "tpm", "rpm"])
def test_a_burst_never_spends_past_a_limit(limit: str) -> None:
    key = f"sk-{uuid.uuid4().hex}"
    with StubServer(Stub(delay=0.3)) as stub:
        with live_server(config(stub.port, [{"key": key, "name": "alice"}])) as probe:
            per = reserved(probe)
        fits = 5
        spec: dict[str, Any] = {"key": key, "name": "alice"}
        if limit == "tokens":
            spec["budget"] = {"tokens_per_day": int(fits * per)}
        elif limit == "usd":
            spec["budget"] = {"usd_per_day": fits * per / 1000}
        elif limit == "tpm":
            spec["tpm"] = int(fits * per)
        else:
            spec["rpm"] = fits
        with live_server(config(stub.port, [spec])) as g:
            answers = asyncio.run(burst([g.base_url], key, 32))
            wait_until(lambda: settled(g), what="every hold to settle")
            rows = ledger_rows(g)
    ok = [a for a in answers if a.status_code == 200]
    refused = [a for a in answers if a.status_code == 429]
    assert len(ok) + len(refused) == 32
    assert {a.json()["error"]["code"] for a in refused} == {"rate_limit_exceeded" if limit in ("tpm", "rpm")
                                                            else "budget_exceeded"}
    billed = sum(r.billed_tokens for r in rows)
    assert len(ok) >= fits and billed == sum(a.json()["usage"]["total_tokens"] for a in ok)
    if limit == "rpm":
        assert len(ok) == fits
    elif limit == "usd":
        assert sum(r.cost_usd for r in rows) <= fits * per / 1000 + 1e-12
    else:
        assert billed <= fits * per
    assert all(int(a.headers["retry-after"]) >= 1 for a in refused)


def test_two_gateways_on_one_redis_hold_one_budget(redis_url: str) -> None:
    import redis

    key, tenant = f"sk-{uuid.uuid4().hex}", f"t-{uuid.uuid4().hex[:8]}"
    with StubServer(Stub(delay=0.3)) as stub:
        base = config(stub.port, [{"key": key, "name": "alice", "tenant": tenant}], {"store": redis_url})
        with live_server(base) as probe:
            per = reserved(probe)
        budget = int(4 * per)
        cfg = {**base, "tenants": {tenant: {"budget": {"tokens_per_day": budget}}}}
        with live_server(cfg) as g1, live_server(cfg) as g2:
            answers = asyncio.run(burst([g1.base_url, g2.base_url], key, 32))
            wait_until(lambda: settled(g1, g2), what="every hold to settle")
            rows = ledger_rows(g1, g2)
    ok = [a for a in answers if a.status_code == 200]
    assert len(ok) >= 4 and sum(r.billed_tokens for r in rows) <= budget
    r = redis.Redis.from_url(redis_url)
    [day] = [k for k in r.scan_iter(f"tokenomy:limits:budget:tenant:{tenant}:day:*") if not k.endswith((b"holds",
                                                                                                          b"leases"))]
    assert float(r.hget(day, "tokens")) == sum(row.billed_tokens for row in rows)    # Redis agrees with the ledger
    assert not r.hlen(day + b":holds")


def test_holds_settle_after_a_disconnect_a_failure_and_a_cache_hit() -> None:
    key = f"sk-{uuid.uuid4().hex}"
    limits = {"key": key, "name": "alice", "budget": {"tokens_per_day": 100_000}}
    with StubServer(Stub()) as ok, StubServer(Stub(stall_after=2)) as stalling, \
            StubServer(Stub(fail_status=500, fail_times=10**6)) as failing:
        cfg = config(ok.port, [limits])
        cfg["cache"] = {"exact": {"enabled": True}, "semantic": {"enabled": False}}
        cfg["models"] += [{**cfg["models"][0], "name": name, "base_url": f"http://127.0.0.1:{stub.port}/v1"}
                          for name, stub in (("stalling", stalling), ("broken", failing))]
        with live_server(cfg) as g:
            budgets = g.gateway.budgets
            auth = {"authorization": f"Bearer {key}"}
            # the client leaves a stream after two chunks: what it was sent is billed, the rest of the hold freed
            with httpx.stream("POST", g.base_url + "/chat/completions", headers=auth, timeout=30,
                              json={"model": "stalling", "max_tokens": 50, "messages": MESSAGES,
                                    "stream": True}) as r:
                chunks = 0
                lines = r.iter_lines()      # kept: a dropped generator would close the connection at the break
                for line in lines:
                    chunks += line.startswith("data: {")
                    if chunks == 2:
                        break
                assert chunks == 2 and budgets.holding
            wait_until(lambda: settled(g) and len(ledger_rows(g)) == 1, what="the cut stream's hold to settle")
            [cut] = ledger_rows(g)
            assert cut.status == 499 and budgets.used("key", cut.key_id, "day")[1] == cut.billed_tokens > 0
            # the upstream fails: nothing generated, nothing spent, nothing held
            r = httpx.post(g.base_url + "/chat/completions", headers=auth, timeout=30,
                           json={"model": "broken", "max_tokens": 5, "messages": MESSAGES})
            assert r.status_code in (502, 503) and settled(g)
            assert budgets.used("key", cut.key_id, "day")[1] == cut.billed_tokens
            # a cache hit is served before anything is held, and costs nothing
            body = {"model": "remote", "max_tokens": 5, "messages": [{"role": "user", "content": "Once"}],
                    "temperature": 0}
            first = httpx.post(g.base_url + "/chat/completions", headers=auth, timeout=30, json=body)
            assert first.status_code == 200
            used = budgets.used("key", cut.key_id, "day")
            hit = httpx.post(g.base_url + "/chat/completions", headers=auth, timeout=30, json=body)
            assert hit.headers["x-tokenomy-cache"] == "exact" and settled(g)
            assert budgets.used("key", cut.key_id, "day") == used


def fallback_config(stub_port: int, dead_port: int, key: str, usd: float) -> dict[str, Any]:
    cfg = config(stub_port, [{"key": key, "name": "alice", "budget": {"usd_per_day": usd}}])
    cfg["models"] = [
        {**cfg["models"][0], "name": "cheap", "base_url": f"http://127.0.0.1:{dead_port}/v1"},
        {**cfg["models"][0], "name": "dear", "price": {"input": 100_000, "output": 100_000}},
    ]
    cfg["routes"] = {"auto": {"strategy": "fixed", "models": ["cheap", "dear"]}}
    return cfg


def test_a_fallback_to_a_dearer_model_reserves_the_difference_first() -> None:
    key = f"sk-{uuid.uuid4().hex}"
    body = {"model": "auto", "max_tokens": 5, "messages": MESSAGES}
    with StubServer(Stub()) as stub, StubServer(Stub(fail_status=500, fail_times=10**6)) as dead:
        with live_server(fallback_config(stub.port, dead.port, key, 1.0)) as probe:
            cheap, dear = (reserved(probe, 5, m) for m in ("cheap", "dear"))
        # room for the cheap model's worst case, not for the dear one's: the fallback is refused, not overspent
        for usd, status in ((cheap * 2 * PRICE["input"] / 1e6, 429), (dear * 100_000 / 1e6 * 1.01, 200)):
            with live_server(fallback_config(stub.port, dead.port, key, usd)) as g:
                r = httpx.post(g.base_url + "/chat/completions", headers={"authorization": f"Bearer {key}"},
                               json=body, timeout=30)
                assert r.status_code == status, r.text
                assert settled(g)
                [row] = ledger_rows(g)
                assert row.cost_usd <= usd
                if status == 429:
                    assert r.json()["error"]["code"] == "budget_exceeded" and row.model in (None, "cheap", "dear")
                else:
                    assert r.headers["x-tokenomy-route"].startswith("dear;")
    assert dear > 0 and cheap > 0


def test_shrink_to_fit_lowers_max_tokens_instead_of_refusing() -> None:
    key = f"sk-{uuid.uuid4().hex}"
    with StubServer(Stub()) as stub:
        with live_server(config(stub.port, [{"key": key, "name": "alice"}])) as probe:
            prompt = reserved(probe, 0)
        spec = {"key": key, "name": "alice", "budget": {"tokens_per_day": int(prompt) + 3}}
        for shrink in (False, True):
            with live_server(config(stub.port, [spec], {"shrink_to_fit": shrink})) as g:
                r = httpx.post(g.base_url + "/chat/completions", headers={"authorization": f"Bearer {key}"},
                               json={"model": "remote", "max_tokens": 50, "messages": MESSAGES}, timeout=30)
                if not shrink:
                    assert r.status_code == 429 and "may cost up to" in r.json()["error"]["message"]
                else:
                    assert r.status_code == 200 and r.headers["x-tokenomy-max-tokens"].startswith("3;")
                    assert stub.stub.bodies[-1]["max_tokens"] == 3


def test_an_embeddings_request_holds_its_inputs() -> None:
    key = f"sk-{uuid.uuid4().hex}"
    cfg = {"cache": NO_CACHE, "keys": [{"key": key, "name": "alice", "budget": {"tokens_per_day": 20}}]}
    with live_server(cfg) as g:
        auth = {"authorization": f"Bearer {key}"}
        r = httpx.post(g.base_url + "/embeddings", headers=auth, timeout=60,
                       json={"model": "all-minilm-l6-v2", "input": "a text whose bytes bound its tokens, over 20"})
        assert r.status_code == 429 and r.json()["error"]["code"] == "budget_exceeded"
        r = httpx.post(g.base_url + "/embeddings", headers=auth, timeout=60,
                       json={"model": "all-minilm-l6-v2", "input": "short"})
        assert r.status_code == 200 and settled(g)
        assert g.gateway.budgets.used("key", g.gateway.keyring.lookup(auth["authorization"]).key_id, "day")[1] \
            == r.json()["usage"]["prompt_tokens"]


def test_a_killed_gateway_frees_its_holds_after_the_lease(redis_url: str, tmp_path: Path) -> None:
    key, tenant = f"sk-{uuid.uuid4().hex}", f"t-{uuid.uuid4().hex[:8]}"
    with StubServer(Stub(stall_after=1)) as stub, StubServer(Stub()) as quick:
        base = config(stub.port, [{"key": key, "name": "alice", "tenant": tenant}],
                      {"store": redis_url, "lease_s": 3})
        base["models"].append({**base["models"][0], "name": "quick", "base_url": f"http://127.0.0.1:{quick.port}/v1"})
        with live_server(base) as probe:
            per = reserved(probe)
        cfg = {**base, "tenants": {tenant: {"budget": {"tokens_per_day": int(2 * per)}}},
               "ledger": f"sqlite:///{tmp_path}/killed.db"}
        path = tmp_path / "tokenomy.yaml"
        path.write_text(yaml.safe_dump(cfg))
        port = free_port()
        env = {**os.environ, "TOKENOMY_HOME": tempfile.mkdtemp(prefix="tokenomy-home-")}
        proc = subprocess.Popen([sys.executable, "-m", "tokenomy.cli", "serve", "--config", str(path), "--port",
                                 str(port)], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            url = f"http://127.0.0.1:{port}/v1"
            wait_until(lambda: _answers(url), timeout=120, what="the gateway to start")
            streams = [_start_stream(url, key) for _ in range(2)]       # two stalled streams hold the budget
            cfg["ledger"] = f"sqlite:///{tmp_path}/alive.db"
            with live_server(cfg) as alive:
                wait_until(lambda: asyncio.run(burst([alive.base_url], key, 1, model="quick"))[0].status_code == 429,
                           what="the budget to be held by the other gateway's streams")
                proc.send_signal(signal.SIGKILL)
                proc.wait(30)
                for s in streams:
                    s.close()
                # within the lease the holds lapse and the surviving gateway admits again
                wait_until(lambda: asyncio.run(burst([alive.base_url], key, 1, model="quick"))[0].status_code == 200,
                           timeout=60, interval=0.2, what="the killed gateway's holds to lapse")
                alive.gateway.ledger.flush()
                [row] = [r for r in alive.gateway.ledger.query() if r.status == 200]
                assert alive.gateway.budgets.used("tenant", tenant, "day")[1] == row.billed_tokens
        finally:
            proc.kill()
            proc.wait(30)


def _answers(url: str) -> bool:
    try:
        return httpx.get(url + "/models", timeout=2).status_code in (200, 401)
    except httpx.HTTPError:
        return False


def _start_stream(url: str, key: str) -> Any:
    """A streamed request the stalling stub never finishes, once the gateway has answered its headers."""
    client = httpx.Client(timeout=60)
    r = client.send(client.build_request("POST", url + "/chat/completions", headers={"authorization": f"Bearer {key}"},
                                         json={"model": "remote", "max_tokens": 5, "messages": MESSAGES,
                                               "stream": True}), stream=True)
    assert r.status_code == 200, r.read()
    return client


def test_a_hold_settles_when_its_row_cannot_be_written() -> None:
    key = f"sk-{uuid.uuid4().hex}"
    with StubServer(Stub()) as stub:
        with live_server(config(stub.port, [{"key": key, "name": "alice", "budget": {"tokens_per_day": 1000}}])) as g:
            def broken(*_: Any, **__: Any) -> None:
                raise OSError("disk full")

            g.gateway.meter.ledger.write = broken      # the ledger fails: the budget still counts the spend
            r = httpx.post(g.base_url + "/chat/completions", headers={"authorization": f"Bearer {key}"},
                           json={"model": "remote", "max_tokens": 5, "messages": MESSAGES}, timeout=30)
            assert r.status_code == 200 and "x-tokenomy-reserved" in r.headers
            key_id = g.gateway.keyring.lookup(f"Bearer {key}").key_id
            assert settled(g) and g.gateway.budgets.held("key", key_id, "day") == (0.0, 0)
            assert g.gateway.budgets.used("key", key_id, "day")[1] == r.json()["usage"]["total_tokens"]
            g.gateway.meter.price_for = broken         # no row at all: the hold is released, nothing counted
            r = httpx.post(g.base_url + "/chat/completions", headers={"authorization": f"Bearer {key}"},
                           json={"model": "remote", "max_tokens": 5, "messages": MESSAGES}, timeout=30)
            assert r.status_code == 200 and settled(g)
            assert g.gateway.budgets.held("key", key_id, "day") == (0.0, 0)


def test_an_upstreams_margin_is_the_most_it_billed_beyond_the_count_in_its_last_256_answers() -> None:
    from tokenomy.generation import Usage
    from tokenomy.limits.budget import Budgets
    from tokenomy.pipeline.reserve import Reserve

    stage = Reserve(Budgets(), None, lambda model, batch: None, lambda model: None)   # an upstream: no window
    asked = RequestContext(gen=GenRequest(model="up", messages=MESSAGES))
    asked.prompt_tokens = 100

    def answered(billed: int) -> None:
        ctx = RequestContext(gen=GenRequest(model="up", messages=MESSAGES), reserved=("up", 0.0), model="up",
                             prompt_tokens=100, usage=Usage(prompt_tokens=billed, completion_tokens=1))
        stage.on_record(ctx)

    assert stage.prompt_bound(asked, "up") == 100 + 26        # nothing seen yet: 10% + 16
    answered(100 + 90)
    for _ in range(255):
        answered(100 + 3)
    assert stage.prompt_bound(asked, "up") == 100 + 90        # the 90 is still among the last 256
    answered(100 + 40)
    assert stage.prompt_bound(asked, "up") == 100 + 40        # it left: the most of the rest
    for _ in range(256):
        answered(100)
    assert stage.prompt_bound(asked, "up") == 100 + 26        # back to the floor
