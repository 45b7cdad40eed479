"""Two gateway processes on one Redis and one PostgreSQL ledger hold one budget and one rate limit per key; a Redis
that does not answer gives the configured behaviour."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.conftest import NO_CACHE, live_server
from tests.helpers import services
from tests.helpers.ledger_urls import pg_schema_url
from tests.helpers.upstream_stub import Stub
from tests.pipeline.test_gateway_upstream import StubServer
from tests.pipeline.test_reserve import reserved

pytestmark = pytest.mark.slow       # a real engine, client or process (docs/testing.md)

COST = (7 * 1000 + 5 * 1000) / 1e6          # the stub's usage (7 prompt, 5 completion tokens) at $1000 per 1M


def config(stub_port: int, keys: list[dict[str, Any]], limits: dict[str, Any], ledger: str | None = None,
           tenants: dict[str, Any] | None = None) -> dict[str, Any]:
    data: dict[str, Any] = {
        "cache": NO_CACHE, "keys": keys, "limits": limits, "tenants": tenants or {},
        "models": [{"name": "remote", "backend": "openai", "base_url": f"http://127.0.0.1:{stub_port}/v1",
                    "model": "stub", "tokenizer": "smollm2-135m-instruct", "max_retries": 0,
                    "price": {"input": 1000, "output": 1000}}]}
    if ledger is not None:
        data["ledger"] = ledger
    return data


def ask(server: Any, key: str) -> httpx.Response:
    return httpx.post(server.base_url + "/chat/completions", headers={"authorization": f"Bearer {key}"}, timeout=30,
                      json={"model": "remote", "max_tokens": 4, "messages": [{"role": "user", "content": "Hi"}]})


@pytest.fixture
def pg_ledger(postgres_url: str) -> Iterator[str]:
    yield from pg_schema_url(postgres_url)


def test_a_budget_holds_across_two_gateways_and_is_rebuilt_from_the_ledger(redis_url: str, pg_ledger: str) -> None:
    import redis

    key, tenant = f"sk-{uuid.uuid4().hex}", f"t-{uuid.uuid4().hex[:8]}"
    limit = 0.05
    with StubServer(Stub()) as stub:
        cfg = config(stub.port, [{"key": key, "name": "alice", "tenant": tenant}], {"store": redis_url},
                     pg_ledger, tenants={tenant: {"budget": {"usd_per_day": limit}}})
        with live_server(cfg) as g1, live_server(cfg) as g2:
            # a request is served while what is spent + its worst case (prompt count with an upstream's margin,
            # and max_tokens) fits: one after another, each spends COST
            worst = reserved(g1, 4) * 1000 / 1e6
            fits = next(k for k in range(1, 10) if (k - 1) * COST + worst <= limit < k * COST + worst)
            answers = [ask((g1, g2)[i % 2], key) for i in range(10)]
            assert [a.status_code for a in answers] == [200] * fits + [429] * (10 - fits)
            assert {a.json()["error"]["code"] for a in answers[fits:]} == {"budget_exceeded"}
            for g in (g1, g2):
                g.gateway.ledger.flush()
            spent = sum(r.cost_usd for r in g1.gateway.ledger.query() if r.tenant == tenant)
            assert spent == pytest.approx(fits * COST) and spent <= limit
        # Redis loses the counters; a gateway that starts now rebuilds them from the ledger
        r = redis.Redis.from_url(redis_url)
        for k in r.scan_iter(f"tokenomy:limits:budget:tenant:{tenant}:*"):
            r.delete(k)
        with live_server(cfg) as g3:
            assert ask(g3, key).status_code == 429


def test_far_from_the_limit_two_gateways_spend_from_allowances_and_redis_ends_equal_to_the_ledgers(
        redis_url: str) -> None:
    """A budget with room for thousands of requests: each gateway holds an allowance (one hold in Redis under an
    `allow:` id, not one per request); once both stopped (allowances given back), Redis holds nothing and its
    total equals the two ledgers'."""
    import redis

    key, limit = f"sk-{uuid.uuid4().hex}", 50.0
    r = redis.Redis.from_url(redis_url)
    with StubServer(Stub()) as stub:
        cfg = config(stub.port, [{"key": key, "name": "alice", "budget": {"usd_per_day": limit}}], {"store": redis_url})
        with live_server(cfg) as g1, live_server(cfg) as g2:
            key_id = g1.gateway.keyring.lookup(f"Bearer {key}").key_id
            answers = [ask((g1, g2)[i % 2], key) for i in range(20)]
            assert [a.status_code for a in answers] == [200] * 20
            [holds] = r.scan_iter(f"tokenomy:limits:budget:key:{key_id}:day:*:holds")
            assert sorted(h.split(b":")[0] for h in r.hkeys(holds)) == [b"allow", b"allow"]     # one per gateway
            for g in (g1, g2):
                g.gateway.ledger.flush()
            spent = sum(row.cost_usd for g in (g1, g2) for row in g.gateway.ledger.query() if row.key_id == key_id)
        day = holds.removesuffix(b":holds")
        assert spent == pytest.approx(20 * COST) and float(r.hget(day, "usd")) == pytest.approx(spent)
        assert r.hlen(holds) == 0


def test_a_reload_that_lowers_a_budget_ends_the_allowances_taken_under_the_old_one(redis_url: str,
                                                                                    tmp_path: Path) -> None:
    key, admin = f"sk-{uuid.uuid4().hex}", f"sk-{uuid.uuid4().hex}"
    path = tmp_path / "tokenomy.yaml"

    def write(limit: float) -> None:
        cfg = config(0, [{"key": key, "name": "alice", "budget": {"usd_per_day": limit}},
                         {"key": admin, "name": "admin", "admin": True}], {"store": redis_url})
        cfg["models"][0]["base_url"] = f"http://127.0.0.1:{stub.port}/v1"
        cfg["cache"] = {**NO_CACHE, "path": str(tmp_path / "cache")}
        path.write_text(yaml.safe_dump({**cfg, "ledger": f"sqlite:///{tmp_path}/ledger.db"}))

    with StubServer(Stub()) as stub:
        write(50.0)                                  # room for thousands: the first request takes an allowance
        with live_server(config_path=str(path)) as g:
            assert ask(g, key).status_code == 200
            assert g.gateway.budgets.allowances is not None and g.gateway.budgets.allowances.state()["open"] == 1
            worst = reserved(g, 4) * 1000 / 1e6
            write(COST + worst / 2)                  # spent COST: the next request's worst case no longer fits
            r = httpx.post(g.root + "/admin/reload", headers={"authorization": f"Bearer {admin}"})
            assert r.status_code == 200, r.text
            refused = ask(g, key)
            assert refused.status_code == 429 and refused.json()["error"]["code"] == "budget_exceeded"


def test_rpm_and_tpm_hold_across_two_gateways(redis_url: str) -> None:
    rpm_key, tpm_key = f"sk-{uuid.uuid4().hex}", f"sk-{uuid.uuid4().hex}"
    keys = [{"key": rpm_key, "name": "rpm", "rpm": 3}, {"key": tpm_key, "name": "tpm", "tpm": 40}]
    with StubServer(Stub()) as stub:
        cfg = config(stub.port, keys, {"store": redis_url})
        with live_server(cfg) as g1, live_server(cfg) as g2:
            assert [ask((g1, g2)[i % 2], rpm_key).status_code for i in range(6)] == [200] * 3 + [429] * 3
            # 12 tokens a request, 23 held while it runs (the prompt count with an upstream's margin, + 4): 0 and
            # 12 used leave room for 23 under 40, 24 does not
            got = [ask((g1, g2)[i % 2], tpm_key) for i in range(4)]
            assert [a.status_code for a in got] == [200, 200, 429, 429]
            assert "tokens per minute" in got[2].json()["error"]["message"]
            assert int(got[2].headers["retry-after"]) >= 1


def test_a_tenants_rpm_holds_across_two_gateways_for_all_its_keys(redis_url: str) -> None:
    tenant = f"t{uuid.uuid4().hex[:8]}"
    one, two = f"sk-{uuid.uuid4().hex}", f"sk-{uuid.uuid4().hex}"
    keys = [{"key": one, "name": "one", "tenant": tenant}, {"key": two, "name": "two", "tenant": tenant}]
    with StubServer(Stub()) as stub:
        cfg = config(stub.port, keys, {"store": redis_url}, tenants={tenant: {"rpm": 3}})
        with live_server(cfg) as g1, live_server(cfg) as g2:
            got = [ask((g1, g2)[i % 2], (one, two)[i // 2 % 2]) for i in range(5)]
            assert [a.status_code for a in got] == [200] * 3 + [429] * 2
            assert f"tenant {tenant}: 3 requests per minute" in got[3].json()["error"]["message"]


@contextlib.contextmanager
def dead_redis() -> Iterator[str]:
    """The URL of a Redis that has stopped."""
    server = services.start_redis()
    server.stop()
    yield server.url


@pytest.mark.parametrize("budgets, rates", [("closed", "open"), ("open", "closed")])
def test_redis_down_gives_the_configured_behaviour(budgets: str, rates: str) -> None:
    budget_key, rpm_key = f"sk-{uuid.uuid4().hex}", f"sk-{uuid.uuid4().hex}"
    keys = [{"key": budget_key, "name": "b", "budget": {"usd_per_day": 1}}, {"key": rpm_key, "name": "r", "rpm": 100}]
    with dead_redis() as url, StubServer(Stub()) as stub:
        cfg = config(stub.port, keys, {"store": url, "budgets_on_store_down": budgets, "rates_on_store_down": rates})
        with live_server(cfg) as g:
            b, r = ask(g, budget_key), ask(g, rpm_key)
            metrics = httpx.get(g.root + "/metrics", headers={"authorization": f"Bearer {rpm_key}"}).text
    for answer, mode in ((b, budgets), (r, rates)):
        if mode == "open":
            assert answer.status_code == 200, answer.text
        else:
            assert answer.status_code == 503 and answer.json()["error"]["code"] == "limits_unavailable"
            assert answer.headers["retry-after"] == "1"
    assert "tokenomy_limits_store_up 0.0" in metrics
