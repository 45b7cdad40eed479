"""`tokenomy keys|tenants|spend` (tokenomy/api/admin_command.py) against a running server's admin API, with
TOKENOMY_URL and TOKENOMY_ADMIN_KEY: tables on a terminal, the API's JSON with --json, errors on stderr with exit 1."""

from __future__ import annotations

import json
from typing import Any

import httpx
from typer.testing import CliRunner

from tests.conftest import NO_CACHE, live_server
from tests.helpers.upstream_stub import Stub
from tests.pipeline.test_gateway_upstream import StubServer
from tokenomy.cli import app


def server_config(stub_port: int) -> dict[str, Any]:
    return {"cache": NO_CACHE, "keys": [{"key": "sk-admin", "name": "ops", "tenant": "ops", "admin": True}],
            "models": [{"name": "a", "backend": "openai", "base_url": f"http://127.0.0.1:{stub_port}/v1",
                        "model": "stub", "tokenizer": "smollm2-135m-instruct", "max_retries": 0,
                        "price": {"input": 1000, "output": 1000}}]}


def test_keys_tenants_and_spend_from_the_command_line() -> None:
    with StubServer(Stub()) as stub, live_server(server_config(stub.port)) as gw:
        env = {"TOKENOMY_URL": gw.root, "TOKENOMY_ADMIN_KEY": "sk-admin", "COLUMNS": "200"}
        runner = CliRunner()

        def run(*args: str, ok: bool = True) -> Any:
            result = runner.invoke(app, list(args), env=env)
            assert (result.exit_code == 0) is ok, result.output
            return result

        assert "acme" in run("tenants", "create", "acme", "--usd-per-day", "5", "--models", "a").output
        made = json.loads(run("keys", "create", "--name", "dev", "--tenant", "acme", "--rpm", "50", "--json").output)
        assert made["tenant"] == "acme" and made["rpm"] == 50 and made["key"].startswith("sk-")
        r = httpx.post(gw.base_url + "/chat/completions", headers={"authorization": f"Bearer {made['key']}"},
                       json={"model": "a", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4})
        assert r.status_code == 200
        listed = run("keys", "list").output
        assert "dev" in listed and "config" in listed and made["key"] not in listed
        assert json.loads(run("keys", "show", made["id"], "--json").output)["name"] == "dev"
        assert json.loads(run("keys", "update", made["id"], "--tpm", "900", "--json").output)["tpm"] == 900
        rotated = json.loads(run("keys", "rotate", made["id"], "--grace", "60", "--json").output)
        assert rotated["rotated_from"] == made["id"] and rotated["key"] != made["key"]
        assert json.loads(run("keys", "revoke", rotated["id"], "--json").output)["revoked_at"] is not None
        spent = json.loads(run("spend", "--by", "tenant", "--since", "7d", "--json").output)
        api = httpx.get(gw.root + "/admin/spend", params={"group_by": "tenant", "since": spent["since"]},
                        headers={"authorization": "Bearer sk-admin"}).json()
        assert spent["data"] == api["data"] and [g["tenant"] for g in spent["data"]] == ["acme"]
        table = run("spend", "--by", "model").output
        assert "spend by model" in table and "total" in table
        assert [t["name"] for t in json.loads(run("tenants", "list", "--json").output)["data"]] == ["acme"]
        failed = run("keys", "show", "000000000000", ok=False)
        assert "404" in failed.output and "No key" in failed.output
        denied = runner.invoke(app, ["keys", "list"], env={**env, "TOKENOMY_ADMIN_KEY": made["key"]})
        assert denied.exit_code == 1 and "403" in denied.output       # in its grace, but no admin
