"""The composition root (tokenomy/gateway.py): parts built from a config, swapped whole on reload, and what a reload
keeps."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import NO_CACHE
from tests.helpers.upstream_stub import Stub
from tests.helpers.wait import wait_until_async
from tests.pipeline.test_gateway_upstream import StubServer
from tokenomy.config import load_config
from tokenomy.errors import APIError
from tokenomy.gateway import Gateway
from tokenomy.generation import GenRequest
from tokenomy.pipeline.request import RequestContext


def write(path: Path, stub_port: int, keys: list[dict[str, Any]], store_prompts: bool, routes: list[str]) -> None:
    path.write_text(yaml.safe_dump({
        "cache": {**NO_CACHE, "path": str(path.parent / "cache")},
        "ledger": {"url": f"sqlite:///{path.parent}/ledger.db", "store_prompts": store_prompts},
        "keys": keys,
        "routes": {"r": {"strategy": "fixed", "models": routes}},
        "models": [{"name": name, "backend": "openai", "base_url": f"http://127.0.0.1:{stub_port}/v1",
                    "model": "stub", "tokenizer": "smollm2-135m-instruct", "max_retries": 0,
                    "price": {"input": 1000, "output": 1000}} for name in ("a", "b")]}))


def request(key: str, model: str = "a") -> RequestContext:
    return RequestContext(gen=GenRequest(model=model, messages=[{"role": "user", "content": "Hi"}],
                                         params={"max_tokens": 4}),
                          headers={"authorization": f"Bearer {key}"})


ALICE = {"key": "sk-alice", "name": "alice", "tenant": "acme", "rpm": 100, "tpm": 10_000,
         "budget": {"usd_per_day": 50}}
CAROL = {"key": "sk-carol", "name": "carol", "tenant": "acme"}


def test_a_request_in_flight_during_a_reload_ends_on_its_parts_and_the_next_sees_the_new_ones(tmp_path: Path) -> None:
    path = tmp_path / "tokenomy.yaml"
    with StubServer(Stub(delay=1.0)) as stub:
        write(path, stub.port, [ALICE], store_prompts=False, routes=["a"])
        gw = Gateway(load_config(str(path)), str(path))

        async def scenario() -> None:
            before = gw.parts
            assert (await gw.handle(request("sk-alice"))).status == 200
            in_flight = asyncio.get_running_loop().create_task(gw.handle(request("sk-alice", "r")))
            await wait_until_async(lambda: stub.stub.hits == 2, what="the request at the upstream")
            # the new file: alice gone, carol in; bodies stored; the route to the other model
            write(path, stub.port, [CAROL], store_prompts=True, routes=["b"])
            assert gw.reload()["reloaded"]
            after = gw.parts
            assert after is not before and after.running is before.running
            assert after.keyring is not before.keyring and after.pipeline is not before.pipeline
            assert after.routes["r"].models == ["b"] and before.routes["r"].models == ["a"]
            ctx = await in_flight                     # ends on the parts it started with
            assert ctx.status == 200 and ctx.model == "a" and ctx.key is not None and ctx.key.name == "alice"
            nxt = await gw.handle(request("sk-carol", "r"))
            assert nxt.status == 200 and nxt.model == "b"
            with pytest.raises(APIError) as e:
                await gw.handle(request("sk-alice"))
            assert e.value.status == 401
            assert gw.ledger is not None
            gw.ledger.flush()
            stored = gw.ledger.prompts()
            assert ctx.request_id not in stored and nxt.request_id in stored   # the old meter, then the new one
            await gw.close()

        asyncio.run(scenario())


def test_a_reload_swaps_the_budgets_limits_and_keeps_their_spend_and_the_rate_windows(tmp_path: Path) -> None:
    path = tmp_path / "tokenomy.yaml"
    with StubServer(Stub()) as stub:
        write(path, stub.port, [{**ALICE, "rpm": 2}], store_prompts=False, routes=["a"])
        gw = Gateway(load_config(str(path)), str(path))

        async def scenario() -> None:
            run = gw.parts.running
            assert (await gw.handle(request("sk-alice"))).status == 200
            key_id = gw.keyring.lookup("Bearer sk-alice").key_id
            spent = gw.budgets.used("key", key_id, "day")
            assert spent[0] > 0
            # a budget the next request's worst case does not fit beside the spend: the spend counts on
            write(path, stub.port, [{**ALICE, "rpm": 2, "budget": {"usd_per_day": spent[0] * 1.5}}],
                  store_prompts=False, routes=["a"])
            gw.reload()
            assert gw.parts.running is run and gw.budgets is run.budgets
            assert gw.budgets.used("key", key_id, "day") == spent
            with pytest.raises(APIError) as e:
                await gw.handle(request("sk-alice"))
            assert e.value.code == "budget_exceeded"
            # room in the budget again: the minute's two requests, across both reloads, fill the rpm
            write(path, stub.port, [{**ALICE, "rpm": 2}], store_prompts=False, routes=["a"])
            gw.reload()
            with pytest.raises(APIError) as e:
                await gw.handle(request("sk-alice"))
            assert e.value.code == "rate_limit_exceeded"
            await gw.close()

        asyncio.run(scenario())


@pytest.mark.slow
def test_a_model_added_while_serving_is_routed_kept_by_a_reload_and_removed(tmp_path: Path) -> None:
    """Gateway.add_model (what an Ollama pull does): the model is served and loads on its first request, a reload of
    the unchanged file keeps it, and remove_model stops serving it."""
    from tokenomy.config import EmbeddedModelSpec

    path = tmp_path / "tokenomy.yaml"
    with StubServer(Stub()) as stub:
        write(path, stub.port, [], store_prompts=False, routes=["a"])
        gw = Gateway(load_config(str(path)), str(path))

        async def scenario() -> None:
            try:
                gw.add_model(EmbeddedModelSpec(name="pulled", gguf="smollm2-135m-instruct", preload=False,
                                               engine={"n_ctx": 2048, "max_model_len": 512, "max_running": 2,
                                                       "max_retired": 2, "kv_tier_ram_mb": 0}))
                assert "pulled" in gw.model_names() and gw.fleet is not None
                assert gw.fleet.models["pulled"].state == "available"
                ctx = await gw.handle(request("", "pulled"))
                assert ctx.status == 200 and ctx.model == "pulled" and ctx.usage.completion_tokens >= 1
                assert gw.fleet.models["pulled"].state == "loaded"
                assert gw.reload()["reloaded"] and "pulled" in gw.model_names()   # the file did not change
                assert await gw.remove_model("pulled") and "pulled" not in gw.model_names()
                assert "pulled" not in {m["name"] for m in gw.fleet.ps()["models"]}
                with pytest.raises(APIError) as e:
                    await gw.handle(request("", "pulled"))
                assert e.value.status == 404
                assert not await gw.remove_model("a")          # a configured model stays
            finally:
                await gw.close()

        asyncio.run(scenario())


@pytest.mark.slow
def test_a_discovered_model_memory_cannot_hold_is_not_served_and_a_reload_keeps_it_out(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import httpx

    from tests.conftest import live_server
    from tokenomy.models.catalog import resolve_gguf

    folder = tmp_path / "models"
    folder.mkdir()
    (folder / "big.gguf").symlink_to(resolve_gguf("gemma3-270m"))      # its weights alone pass the limit below
    monkeypatch.setenv("TOKENOMY_MEMORY_LIMIT", "220M")
    path = tmp_path / "tokenomy.yaml"
    path.write_text(yaml.safe_dump({
        "models": [{"name": "small", "gguf": "smollm2-135m-instruct"}],
        "engine": {"max_running": 2, "max_retired": 1, "kv_tier_ram_mb": 0, "n_threads": 1},
        "fleet": {"discover": True, "models_dir": str(folder), "memory_limit_gb": 4},
        "cache": {**NO_CACHE, "path": str(tmp_path / "cache")}, "ledger": f"sqlite:///{tmp_path}/ledger.db"}))
    with live_server(config_path=str(path)) as s:
        root = f"http://127.0.0.1:{s.port}"
        assert "big" not in [m["id"] for m in httpx.get(f"{root}/v1/models").json()["data"]]
        r = httpx.post(f"{root}/v1/chat/completions", timeout=60, json={
            "model": "big", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2})
        assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found", r.text
        assert s.gateway.reload()["reloaded"] is True        # the file still finds it: still left out, not a change
        assert "big" not in s.gateway.model_names()
