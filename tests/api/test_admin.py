"""The admin API (tokenomy/api/admin.py) over gateways in front of a stub upstream: keys and tenants made, changed,
revoked and rotated by API and live on every gateway sharing the database (two app instances over one SQLite file,
and over one PostgreSQL schema), spend equal to the report's, tenant admins confined to their tenant, the last
admin key kept, failed authentication rate-limited, errors in OpenAI's shape."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest
from fastapi.testclient import TestClient

from tests.conftest import NO_CACHE
from tests.helpers.upstream_stub import Stub
from tests.helpers.wait import wait_until
from tests.pipeline.test_gateway_upstream import StubServer
from tokenomy.api.app import create_app
from tokenomy.config import Config
from tokenomy.gateway import Gateway
from tokenomy.report.figures import build

ADMIN = {"authorization": "Bearer sk-admin"}


def config(tmp_path: Path, stub_port: int, ledger: str, keys: list[dict[str, Any]] | None = None) -> Config:
    return Config.model_validate({
        "cache": {**NO_CACHE, "path": str(tmp_path / "cache")}, "ledger": {"url": ledger},
        "keys": [{"key": "sk-admin", "name": "ops", "tenant": "ops", "admin": True}] if keys is None else keys,
        "models": [{"name": name, "backend": "openai", "base_url": f"http://127.0.0.1:{stub_port}/v1",
                    "model": "stub", "tokenizer": "smollm2-135m-instruct", "max_retries": 0,
                    "price": {"input": 1000, "output": 1000}} for name in ("a", "b")]})


@contextmanager
def gateways(tmp_path: Path, ledger: str, n: int = 1, keys: list[dict[str, Any]] | None = None,
             stub: Stub | None = None) -> Iterator[list[TestClient]]:
    """`n` gateways (app instances, each with its lifespan: its poll of the key store runs) over one ledger."""
    with StubServer(stub or Stub()) as server, ExitStack() as stack:
        yield [stack.enter_context(TestClient(create_app(Gateway(config(tmp_path, server.port, ledger, keys)))))
               for _ in range(n)]


def chat(client: TestClient, key: str, model: str = "a", **extra: Any) -> Any:
    return client.post("/v1/chat/completions", headers={"authorization": f"Bearer {key}"},
                       json={"model": model, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4,
                             **extra})


def is_openai_error(r: Any, status: int, code: str | None = None) -> bool:
    body = r.json()
    return r.status_code == status and set(body["error"]) >= {"message", "type", "param", "code"} \
        and (code is None or body["error"]["code"] == code)


def test_keys_and_tenants_are_made_used_changed_and_revoked_by_api(tmp_path: Path) -> None:
    with gateways(tmp_path, f"sqlite:///{tmp_path}/ledger.db") as [gw]:
        r = gw.post("/admin/tenants", headers=ADMIN, json={"name": "acme", "budget": {"usd_per_day": 10},
                                                          "models": ["a"], "metadata": {"team": "search"}})
        assert r.status_code == 201 and r.json()["budget"]["usd_per_day"] == 10
        r = gw.post("/admin/keys", headers=ADMIN, json={"name": "dev", "tenant": "acme", "rpm": 100})
        assert r.status_code == 201
        made = r.json()
        plain, key_id = made["key"], made["id"]
        assert chat(gw, plain).status_code == 200                      # at once on the gateway that made it
        assert is_openai_error(chat(gw, plain, model="b"), 403)        # the tenant's allow-list holds
        listed = gw.get("/admin/keys", headers=ADMIN)
        assert listed.status_code == 200 and plain not in listed.text and "key_sha256" not in listed.text
        sources = {k["id"]: k["source"] for k in listed.json()["data"]}
        assert sources[key_id] == "database" and "config" in sources.values()
        assert gw.get(f"/admin/keys/{key_id}", headers=ADMIN).json()["rpm"] == 100
        r = gw.patch(f"/admin/keys/{key_id}", headers=ADMIN, json={"rpm": 1})
        assert r.status_code == 200 and r.json()["rpm"] == 1
        r = chat(gw, plain)          # the window kept this minute's requests: the new rpm holds at once
        assert is_openai_error(r, 429) and "per minute" in r.json()["error"]["message"]
        r = gw.delete(f"/admin/keys/{key_id}", headers=ADMIN)
        assert r.status_code == 200 and r.json()["revoked_at"] is not None
        assert is_openai_error(chat(gw, plain), 401, "invalid_api_key")
        tenants = gw.get("/admin/tenants", headers=ADMIN).json()["data"]
        assert [t["name"] for t in tenants] == ["acme"]
        assert gw.delete("/admin/tenants/acme", headers=ADMIN).status_code == 200
        audit = gw.get("/admin/audit", headers=ADMIN).json()["data"]
        assert [(a["action"], a["kind"]) for a in audit] == [("delete", "tenant"), ("revoke", "key"),
                                                             ("update", "key"), ("create", "key"),
                                                             ("create", "tenant")]
        config_id = next(k for k, s in sources.items() if s == "config")
        assert {a["actor"] for a in audit} == {config_id}
        assert audit[2]["before"]["rpm"] == 100 and audit[2]["after"]["rpm"] == 1 and plain not in repr(audit)


def test_a_tenants_rpm_set_by_api_holds_for_all_its_keys_at_once(tmp_path: Path) -> None:
    with gateways(tmp_path, f"sqlite:///{tmp_path}/ledger.db") as [gw]:
        assert gw.post("/admin/tenants", headers=ADMIN, json={"name": "acme"}).status_code == 201
        one, two = (gw.post("/admin/keys", headers=ADMIN, json={"name": n, "tenant": "acme"}).json()["key"]
                    for n in ("one", "two"))
        assert [chat(gw, k).status_code for k in (one, two)] == [200, 200]     # no tenant limit yet
        r = gw.patch("/admin/tenants/acme", headers=ADMIN, json={"rpm": 3})
        assert r.status_code == 200 and r.json()["rpm"] == 3
        assert chat(gw, one).status_code == 200          # the tenant's window counts from the change: 1, 2, 3
        assert chat(gw, two).status_code == 200
        assert chat(gw, one).status_code == 200
        r = chat(gw, two)
        assert is_openai_error(r, 429) and "tenant acme: 3 requests per minute" in r.json()["error"]["message"]


def test_bad_calls_get_openai_errors(tmp_path: Path) -> None:
    keys = [{"key": "sk-admin", "name": "ops", "tenant": "ops", "admin": True},
            {"key": "sk-user", "name": "u", "tenant": "ops"}]
    with gateways(tmp_path, f"sqlite:///{tmp_path}/ledger.db", keys=keys) as [gw]:
        assert is_openai_error(gw.get("/admin/keys"), 401, "missing_api_key")
        assert is_openai_error(gw.get("/admin/keys", headers={"authorization": "Bearer sk-user"}), 403, "not_admin")
        assert is_openai_error(gw.post("/admin/keys", headers=ADMIN, json={"rpm": 0}), 400)
        assert is_openai_error(gw.post("/admin/keys", headers=ADMIN, json={"surprise": 1}), 400)
        assert is_openai_error(gw.post("/admin/keys", headers=ADMIN, content=b"{not json"), 400)
        assert is_openai_error(gw.post("/admin/keys", headers=ADMIN, json={"tenant": "nobody"}), 404)
        assert is_openai_error(gw.get("/admin/keys/000000000000", headers=ADMIN), 404)
        assert is_openai_error(gw.get("/admin/spend?group_by=color", headers=ADMIN), 400)
        assert is_openai_error(gw.get("/admin/spend?since=yesterday-ish", headers=ADMIN), 400)
        config_id = gw.get("/admin/keys", headers=ADMIN).json()["data"][0]["id"]
        assert is_openai_error(gw.delete(f"/admin/keys/{config_id}", headers=ADMIN), 403, "read_only")
        gw.post("/admin/tenants", headers=ADMIN, json={"name": "acme"})
        assert is_openai_error(gw.post("/admin/tenants", headers=ADMIN, json={"name": "acme"}), 409)


@pytest.fixture(params=["sqlite", "postgresql"])
def shared_ledger(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'ledger.db'}"
    else:
        from tests.helpers.ledger_urls import pg_schema_url

        yield from pg_schema_url(request.getfixturevalue("postgres_url"))


def test_a_change_on_one_gateway_reaches_the_other(tmp_path: Path, shared_ledger: str) -> None:
    """B learns of A's changes by its poll of keys_version (every 0.5 s): a new key works there, a new rpm holds
    there, a budget lowered below the spend refuses B's next request, and a revoked key is refused there."""
    with gateways(tmp_path, shared_ledger, n=2) as [a, b]:
        made = a.post("/admin/keys", headers=ADMIN, json={"name": "dev"}).json()
        plain, key_id = made["key"], made["id"]
        wait_until(lambda: chat(b, plain).status_code == 200, what="B to accept the new key")
        assert chat(b, plain).status_code == 200                       # $0.001 a token: a few cents spent on B
        a.patch(f"/admin/keys/{key_id}", headers=ADMIN, json={"budget": {"usd_per_day": 0.001}})
        r = wait_until(lambda: (r := chat(b, plain)).status_code != 200 and r, what="B to hold the lower budget")
        assert is_openai_error(r, 429, "budget_exceeded")
        a.patch(f"/admin/keys/{key_id}", headers=ADMIN, json={"budget": None})
        wait_until(lambda: chat(b, plain).status_code == 200, what="B to drop the budget")
        a.delete(f"/admin/keys/{key_id}", headers=ADMIN)
        r = wait_until(lambda: (r := chat(b, plain)).status_code != 200 and r, what="B to refuse the revoked key")
        assert is_openai_error(r, 401, "invalid_api_key")
        assert is_openai_error(chat(a, plain), 401)


def test_a_request_in_flight_during_a_revocation_does_not_bring_the_key_back(tmp_path: Path) -> None:
    """The keyring is rebuilt from the database only; a request that started with the key ends on the parts it
    started with, and the key stays revoked after it (the race of LiteLLM #25553)."""
    import threading

    stub = Stub(delay=1.0)
    with gateways(tmp_path, f"sqlite:///{tmp_path}/ledger.db", stub=stub) as [gw]:
        made = gw.post("/admin/keys", headers=ADMIN, json={"name": "dev"}).json()
        results: list[int] = []
        thread = threading.Thread(target=lambda: results.append(chat(gw, made["key"]).status_code))
        thread.start()
        wait_until(lambda: stub.hits == 1, what="the request at the upstream")
        assert gw.delete(f"/admin/keys/{made['id']}", headers=ADMIN).status_code == 200
        thread.join()
        assert results == [200]
        assert is_openai_error(chat(gw, made["key"]), 401)
        assert gw.app.state.gateway.refresh_keys() is False           # nothing newer to load: the table stays


def test_spend_is_the_reports_figures_by_every_dimension(tmp_path: Path) -> None:
    with gateways(tmp_path, f"sqlite:///{tmp_path}/ledger.db") as [gw]:
        gw.post("/admin/tenants", headers=ADMIN, json={"name": "acme"})
        gw.post("/admin/tenants", headers=ADMIN, json={"name": "globex"})
        k1 = gw.post("/admin/keys", headers=ADMIN, json={"tenant": "acme"}).json()["key"]
        k2 = gw.post("/admin/keys", headers=ADMIN, json={"tenant": "globex"}).json()["key"]
        oa = openai.OpenAI(base_url="http://testserver/v1", api_key=k1, http_client=gw, max_retries=0)
        oa.chat.completions.create(model="a", messages=[{"role": "user", "content": "Hi"}], max_tokens=4,
                                   user="alice@acme")
        oa.chat.completions.create(model="b", messages=[{"role": "user", "content": "Hi"}], max_tokens=4)
        an = anthropic.Anthropic(base_url="http://testserver", api_key=k2, http_client=gw, max_retries=0)
        an.messages.create(model="a", max_tokens=4, messages=[{"role": "user", "content": "Hi"}],
                           metadata={"user_id": "bob@globex"})
        assert chat(gw, k2, model="nope").status_code == 404           # an error row counts too
        ledger = gw.app.state.gateway.ledger
        ledger.flush()
        rows = ledger.query()
        assert {r.user for r in rows} == {"alice@acme", "bob@globex", None}
        for by, column in (("tenant", "tenant"), ("key", "key"), ("model", "model")):
            got = gw.get(f"/admin/spend?group_by={by}&since=1d", headers=ADMIN).json()
            report = build(rows, by=column)
            mine = {(g[by] or "(none)"): g for g in got["data"]}
            assert set(mine) == set(report["groups"])
            for name, figures in report["groups"].items():
                t, want = figures["tokens"], mine[name]
                assert (want["requests"], want["input_tokens"], want["output_tokens"], want["cached_tokens"]) == \
                    (figures["requests"], t["prompt"], t["completion"], t["cached"])
                assert want["cost_usd"] == pytest.approx(figures["cost_usd"]["total"])
            total = report["total"]
            assert (got["total"]["requests"], got["total"]["input_tokens"]) == (total["requests"],
                                                                              total["tokens"]["prompt"])
            assert got["total"]["cost_usd"] == pytest.approx(total["cost_usd"]["total"]) and total["cost_usd"]["total"]
        users = gw.get("/admin/spend?group_by=user", headers=ADMIN).json()
        assert [u["user"] for u in users["data"]] == ["alice@acme", "bob@globex", None]
        assert sum(u["requests"] for u in users["data"]) == len(rows)
        days = gw.get("/admin/spend?group_by=day", headers=ADMIN).json()
        assert sum(d["cost_usd"] for d in days["data"]) == pytest.approx(days["total"]["cost_usd"])
        by_tenant = {g["tenant"]: g["cost_usd"] for g in gw.get("/admin/spend?group_by=tenant",
                                                               headers=ADMIN).json()["data"]}
        over_time = gw.get("/admin/spend?group_by=day,tenant", headers=ADMIN).json()["data"]
        assert {g["tenant"] for g in over_time} == set(by_tenant) and all("day" in g for g in over_time)
        for tenant, usd in by_tenant.items():
            assert sum(g["cost_usd"] for g in over_time if g["tenant"] == tenant) == pytest.approx(usd)
        assert is_openai_error(gw.get("/admin/spend?group_by=day,day", headers=ADMIN), 400)
        empty = gw.get("/admin/spend?group_by=tenant&until=2000-01-01", headers=ADMIN).json()
        assert empty["data"] == [] and empty["total"]["requests"] == 0


def test_a_tenant_admin_sees_and_manages_only_its_tenant(tmp_path: Path) -> None:
    with gateways(tmp_path, f"sqlite:///{tmp_path}/ledger.db") as [gw]:
        for name in ("acme", "globex"):
            gw.post("/admin/tenants", headers=ADMIN, json={"name": name})
        boss = gw.post("/admin/keys", headers=ADMIN, json={"tenant": "acme", "role": "tenant_admin"}).json()
        theirs = gw.post("/admin/keys", headers=ADMIN, json={"tenant": "globex"}).json()
        chat(gw, theirs["key"])
        h = {"authorization": f"Bearer {boss['key']}"}
        mine = gw.post("/admin/keys", headers=h, json={"name": "dev"})
        assert mine.status_code == 201 and mine.json()["tenant"] == "acme"
        chat(gw, mine.json()["key"])
        assert {k["tenant"] for k in gw.get("/admin/keys", headers=h).json()["data"]} == {"acme"}
        assert [t["name"] for t in gw.get("/admin/tenants", headers=h).json()["data"]] == ["acme"]
        spend = gw.get("/admin/spend?group_by=tenant", headers=h).json()
        assert [g["tenant"] for g in spend["data"]] == ["acme"]
        assert {a["tenant"] for a in gw.get("/admin/audit", headers=h).json()["data"]} == {"acme"}
        assert is_openai_error(gw.get(f"/admin/keys/{theirs['id']}", headers=h), 404)
        assert is_openai_error(gw.delete(f"/admin/keys/{theirs['id']}", headers=h), 404)
        assert is_openai_error(gw.post("/admin/keys", headers=h, json={"tenant": "globex"}), 404)
        assert is_openai_error(gw.post("/admin/keys", headers=h, json={"role": "admin"}), 403)
        assert is_openai_error(gw.post("/admin/tenants", headers=h, json={"name": "x"}), 403)
        assert is_openai_error(gw.get("/dashboard/data", headers=h), 403)      # the dashboard: global admins only
        assert is_openai_error(gw.post("/admin/reload", headers=h), 403)


def test_the_last_admin_key_needs_force_and_failed_authentication_is_rate_limited(tmp_path: Path) -> None:
    with gateways(tmp_path, f"sqlite:///{tmp_path}/ledger.db", keys=[]) as [gw]:
        first = gw.post("/admin/keys", json={"name": "root", "role": "admin"})   # no key anywhere: open
        assert first.status_code == 201
        h = {"authorization": f"Bearer {first.json()['key']}"}
        assert is_openai_error(gw.get("/admin/keys"), 401)                       # the first key closed it
        r = gw.delete(f"/admin/keys/{first.json()['id']}", headers=h)
        assert is_openai_error(r, 409, "last_admin_key") and "force=true" in r.json()["error"]["message"]
        second = gw.post("/admin/keys", headers=h, json={"role": "admin"}).json()
        assert gw.delete(f"/admin/keys/{first.json()['id']}", headers=h).status_code == 200   # one remains
        h2 = {"authorization": f"Bearer {second['key']}"}
        assert is_openai_error(gw.delete(f"/admin/keys/{second['id']}", headers=h2), 409)
        assert is_openai_error(gw.patch(f"/admin/keys/{second['id']}", headers=h2, json={"role": "user"}), 409)
        for _ in range(9):          # the keyless call above was the first of ten failures a minute
            assert is_openai_error(gw.get("/admin/keys", headers={"authorization": "Bearer sk-guess"}), 401)
        r = gw.get("/admin/keys", headers=h2)            # the source is refused now, even with a good key
        assert is_openai_error(r, 429, "too_many_auth_failures") and int(r.headers["retry-after"]) >= 1
        failures = gw.app.state.auth_failures
        failures.clock = lambda: 1e12                    # the window has passed
        assert gw.delete(f"/admin/keys/{second['id']}?force=true", headers=h2).status_code == 200
        assert is_openai_error(gw.get("/admin/keys", headers=h2), 401)     # closed, not open
        assert is_openai_error(gw.get("/admin/keys"), 401)


def test_the_request_path_reads_no_key_table_and_no_key_is_logged(tmp_path: Path,
                                                                   caplog: pytest.LogCaptureFixture) -> None:
    """Keys are looked up in the gateway's memory: serving requests runs no statement on api_keys or tenants (the
    poll reads keys_version alone), and neither a plain key nor its digest reaches a log line."""
    import logging

    import sqlalchemy as sa

    caplog.set_level(logging.DEBUG)
    with gateways(tmp_path, f"sqlite:///{tmp_path}/ledger.db") as [gw]:
        gw.post("/admin/tenants", headers=ADMIN, json={"name": "acme", "budget": {"usd_per_day": 100}})
        made = gw.post("/admin/keys", headers=ADMIN, json={"tenant": "acme", "budget": {"usd_per_day": 100}}).json()
        statements: list[str] = []

        def seen(conn: Any, cursor: Any, statement: str, *_: Any) -> None:
            statements.append(statement)

        engine = gw.app.state.gateway.ledger.engine
        sa.event.listen(engine, "before_cursor_execute", seen)
        for _ in range(10):
            assert chat(gw, made["key"]).status_code == 200
        assert chat(gw, "sk-wrong").status_code == 401
        sa.event.remove(engine, "before_cursor_execute", seen)
        assert not [s for s in statements if "api_keys" in s or "tenants" in s]
        digest = gw.app.state.gateway.parts.stored.keys[0].key_sha256
        assert made["key"] not in caplog.text and digest not in caplog.text and "sk-wrong" not in caplog.text


def test_a_config_reload_keeps_the_stored_keys_and_is_audited(tmp_path: Path) -> None:
    import yaml

    with StubServer(Stub()) as server:
        path = tmp_path / "tokenomy.yaml"
        cfg = config(tmp_path, server.port, f"sqlite:///{tmp_path}/ledger.db")
        path.write_text(yaml.safe_dump(cfg.model_dump(mode="json", exclude_unset=True)))
        with TestClient(create_app(Gateway(cfg, str(path)))) as gw:
            made = gw.post("/admin/keys", headers=ADMIN, json={"name": "dev"}).json()
            r = gw.post("/admin/reload", headers=ADMIN)
            assert r.status_code == 200 and r.json()["reloaded"]
            assert chat(gw, made["key"]).status_code == 200                # the stored key outlives the reload
            audit = gw.get("/admin/audit", headers=ADMIN).json()["data"]
            assert (audit[0]["action"], audit[0]["kind"], audit[0]["target"]) == ("reload", "config", str(path))
