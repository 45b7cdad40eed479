"""Pools of replicas: balancing policies, prefix index, health and failover, against stub upstreams; then two real
tokenomy engines as replicas behind one gateway."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.conftest import NO_CACHE, SMALL_ENGINE, free_port, live_server
from tests.helpers.upstream_stub import Stub
from tests.helpers.wait import wait_until_async
from tests.pipeline.test_gateway_upstream import StubServer
from tokenomy.backends.load_signals import parse_prometheus, parse_slots
from tokenomy.backends.pool import Pool
from tokenomy.backends.prefix_index import PrefixIndex, render
from tokenomy.config import Config, OpenAIModelSpec
from tokenomy.generation import GenRequest

pytestmark = pytest.mark.slow       # a real engine, client or process (docs/testing.md)

SYSTEMS = {t: f"You are the assistant of {t}. " + " ".join(f"{t} rule {i}: be brief and exact." for i in range(40))
           for t in ("acme", "globex", "initech")}


def spec(urls: list[str], **balance: Any) -> OpenAIModelSpec:
    return OpenAIModelSpec(name="m", backend="openai", replicas=urls, model="stub", tokenizer="smollm2-135m-instruct",
                           timeout_s=5, balance={"check_interval_s": 0, **balance})


def chat(tenant: str, question: str = "Hi?", **kw: Any) -> GenRequest:
    return GenRequest(model="m", messages=[{"role": "system", "content": SYSTEMS[tenant]},
                                           {"role": "user", "content": question}], params={"max_tokens": 4}, **kw)


async def ask(pool: Pool, req: GenRequest) -> str | None:
    last = None
    async for d in pool.stream(req):
        last = d
    assert last is not None and last.usage is not None
    return last.usage.replica


@contextlib.contextmanager
def stubs(*made: Stub) -> Iterator[list[StubServer]]:
    with contextlib.ExitStack() as stack:
        yield [stack.enter_context(StubServer(s)) for s in made]


def urls(servers: list[StubServer]) -> list[str]:
    return [f"http://127.0.0.1:{s.port}/v1" for s in servers]


# --- config ---------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("model, message", [
    ({"replicas": []}, "`replicas` is empty"),
    ({"replicas": ["http://a:1/v1", "http://b:1/v1"], "base_url": "http://c:1/v1"}, "not both"),
    ({"replicas": ["http://a:1/v1", "http://a:1/v1/"]}, "listed twice"),
    ({"replicas": ["http://a:1/v1"], "balance": {"policy": "random"}}, "least_outstanding"),
    ({"replicas": ["http://a:1/v1"], "backend": "embedded", "gguf": "smollm2-135m-instruct"}, "openai"),
])
def test_bad_pool_config_is_refused_clearly(model: dict[str, Any], message: str) -> None:
    data = {"name": "m", "backend": "openai", **model}
    with pytest.raises(ValueError, match=message):
        Config.model_validate({"models": [data]})


def test_base_url_is_one_replica() -> None:
    m = OpenAIModelSpec(name="m", backend="openai", base_url="http://a:1/v1/", replicas=["http://a:1/v1"])
    assert m.replicas == ["http://a:1/v1"]


# --- prefix index and load signals ----------------------------------------------------------------------------------

def test_prefix_index_matches_longest_prefix_and_stays_bounded() -> None:
    idx = PrefixIndex(block_chars=4, max_blocks=4)
    a, b = idx.blocks("aaaabbbbcccc"), idx.blocks("aaaabbbbdddd")
    assert len(a) == 3 and a[:2] == b[:2] and a[2] != b[2]
    assert idx.blocks("aaa") == []
    idx.insert(a, "r1")
    idx.insert(b[:2], "r2")
    assert idx.match(a) == {"r1": 3, "r2": 2}
    assert idx.match(b) == {"r1": 2, "r2": 2}
    idx.insert(idx.blocks("xxxxyyyyzzzz"), "r3")     # 3 new blocks push the 2 least recently used out
    assert len(idx) == 4 and idx.match(a) == {}
    idx.forget("r3")
    assert len(idx) == 1


def test_reading_the_prefix_index_to_route_is_not_a_use() -> None:
    idx = PrefixIndex(block_chars=4, max_blocks=4)
    a, b = idx.blocks("aaaabbbb"), idx.blocks("ccccdddd")
    idx.insert(a, "r1")
    idx.insert(b, "r2")
    assert idx.match(a) == {"r1": 2}
    idx.forget("r9")                                  # a replica that held nothing: nothing changes
    idx.insert(idx.blocks("eeee"), "r3")              # the least recently inserted block goes, matched or not
    assert idx.match(a) == {} and idx.match(b) == {"r2": 2} and len(idx) == 4


def test_render_keeps_roles_apart() -> None:
    one = render("chat", [{"role": "system", "content": "ab"}, {"role": "user", "content": "c"}], None)
    two = render("chat", [{"role": "system", "content": "a"}, {"role": "user", "content": "bc"}], None)
    assert one != two and render("completion", None, "hello") == "hello"


def test_load_signals_from_vllm_sglang_llamacpp_and_tokenomy() -> None:
    vllm = ('# HELP vllm:num_requests_waiting x\nvllm:num_requests_waiting{model_name="a"} 3.0\n'
            'vllm:num_requests_running{model_name="a"} 5.0\nvllm:kv_cache_usage_perc{model_name="a"} 0.42\n'
            'vllm:num_requests_waiting_total 99\n')
    s = parse_prometheus(vllm)
    assert (s.waiting, s.running, s.kv_usage) == (3.0, 5.0, 0.42)
    s = parse_prometheus("sglang:num_queue_reqs{a=\"1\"} 2\nsglang:num_running_reqs 4\nsglang:token_usage 0.1\n")
    assert (s.waiting, s.running, s.kv_usage) == (2.0, 4.0, 0.1)
    # a tokenomy server publishes vLLM's names for its engines (two engines: summed, KV their max) and is read
    # through them alone: its own tokenomy_ gauges of the same facts count nothing twice
    s = parse_prometheus('vllm:num_requests_waiting{engine="0",model_name="a"} 1.0\n'
                         'vllm:num_requests_waiting{engine="0",model_name="b"} 2.0\n'
                         'vllm:kv_cache_usage_perc{engine="0",model_name="a"} 0.3\n'
                         'tokenomy_queue_depth{model="a"} 1.0\ntokenomy_engine_kv_usage_ratio{model="a"} 0.9\n')
    assert (s.waiting, s.kv_usage) == (3.0, 0.3)
    assert parse_slots([{"is_processing": True}, {"is_processing": False}]).running == 1.0
    assert not parse_prometheus("other_metric 1\n").known


# --- balancing ------------------------------------------------------------------------------------------------------

def test_prefix_policy_keeps_each_tenant_on_one_replica() -> None:
    async def go(pool: Pool) -> dict[str, set[str | None]]:
        seen: dict[str, set[str | None]] = {t: set() for t in SYSTEMS}
        for i in range(4):
            for t in SYSTEMS:
                seen[t].add(await ask(pool, chat(t, f"question {i}?")))
        await pool.close()
        return seen

    with stubs(Stub(), Stub(), Stub()) as servers:
        seen = asyncio.run(go(Pool(spec(urls(servers), policy="prefix"))))
    assert all(len(s) == 1 for s in seen.values()), seen
    assert len(set.union(*seen.values())) >= 2          # tenants spread over the replicas


def test_prefix_policy_leaves_a_replica_loaded_beyond_the_margin() -> None:
    with stubs(Stub(), Stub()) as servers:
        pool = Pool(spec(urls(servers), policy="prefix", margin=1))
        hashes = pool.index.blocks(render("chat", chat("acme").messages, None))
        pool.index.insert(hashes, pool.replicas[0].name)
        assert pool.order(chat("acme"), hashes)[0][0] is pool.replicas[0]
        pool.replicas[0].outstanding = 2
        order, by = pool.order(chat("acme"), hashes)
        assert order[0] is pool.replicas[1] and by == "load"
        asyncio.run(pool.close())


def test_least_outstanding_spreads_concurrent_requests() -> None:
    async def go(pool: Pool) -> list[str | None]:
        got = await asyncio.gather(*(ask(pool, chat("acme", f"q{i}")) for i in range(6)))
        await pool.close()
        return list(got)

    with stubs(Stub(delay=0.3), Stub(delay=0.3), Stub(delay=0.3)) as servers:
        served = asyncio.run(go(Pool(spec(urls(servers)))))
        assert [s.stub.hits for s in servers] == [2, 2, 2]
    assert len(set(served)) == 3


def test_session_affinity_by_header_or_user() -> None:
    async def go(pool: Pool) -> None:
        by_header = {await ask(pool, chat("acme", f"q{i}", headers={"x-session-id": "s-1"})) for i in range(4)}
        by_user = {await ask(pool, chat("globex", f"q{i}", user="alice")) for i in range(4)}
        assert len(by_header) == 1 and len(by_user) == 1
        many = {await ask(pool, chat("acme", headers={"x-session-id": f"s-{i}"})) for i in range(12)}
        assert len(many) >= 2
        await pool.close()

    with stubs(Stub(), Stub(), Stub()) as servers:
        asyncio.run(go(Pool(spec(urls(servers), policy="session"))))


# --- health and failover --------------------------------------------------------------------------------------------

def test_dead_and_failing_replicas_fail_over_and_are_ejected() -> None:
    dead = f"http://127.0.0.1:{free_port()}/v1"

    async def go(pool: Pool) -> list[str | None]:
        served = [await ask(pool, chat("acme", f"q{i}")) for i in range(9)]
        await pool.close()
        return served

    with stubs(Stub(), Stub(fail_status=500, fail_times=100)) as servers:
        pool = Pool(spec([dead, *urls(servers)], eject_after=2, eject_s=60, policy="round_robin"))
        served = asyncio.run(go(pool))
        assert set(served) == {pool.replicas[1].name}              # every request answered by the live one
        dead_r, _, failing = pool.replicas
        assert dead_r.ejected_until > 0 and failing.ejected_until > 0
        assert dead_r.failed == 2 and failing.failed == 2           # ejected after two failures, then left alone
        assert servers[1].stub.hits == 2


def test_a_replica_that_stalls_before_its_first_byte_fails_over() -> None:
    async def go(pool: Pool) -> str | None:
        try:
            return await ask(pool, chat("acme"))
        finally:
            await pool.close()

    with stubs(Stub(stall_after=0), Stub()) as servers:
        s = spec(urls(servers), policy="round_robin").model_copy(update={"timeout_s": 0.5})
        pool = Pool(s)
        assert asyncio.run(go(pool)) == pool.replicas[1].name


def test_active_check_marks_a_dead_replica_down_and_scrapes_load() -> None:
    dead = f"http://127.0.0.1:{free_port()}/v1"

    async def go(pool: Pool) -> None:
        await pool.check()
        assert [r.up for r in pool.replicas] == [False, True]
        assert pool.order(chat("acme"))[0][0] is pool.replicas[1]
        await pool.close()

    with stubs(Stub()) as servers:
        asyncio.run(go(Pool(spec([dead, *urls(servers)]))))


def test_every_replica_out_still_tries_them() -> None:
    with stubs(Stub()) as servers:
        pool = Pool(spec(urls(servers)))
        pool.replicas[0].up = False

        async def go() -> str | None:
            try:
                return await ask(pool, chat("acme"))
            finally:
                await pool.close()

        assert asyncio.run(go()) == pool.replicas[0].name


def test_pool_metrics_name_each_replica() -> None:
    from tokenomy.metrics.prometheus import Metrics

    with stubs(Stub(), Stub()) as servers:
        m = Metrics()
        pool = Pool(spec(urls(servers), policy="round_robin"), m)
        m.watch_pools(lambda: [pool])

        async def go() -> None:
            for _ in range(4):
                await ask(pool, chat("acme"))
            await pool.close()

        asyncio.run(go())
        text = m.render().decode()
    for r in pool.replicas:
        assert f'tokenomy_replica_requests_total{{by="turn",model="m",replica="{r.name}"}} 2.0' in text
        assert f'tokenomy_replica_up{{model="m",replica="{r.name}"}} 1.0' in text


# --- real tokenomy engines as replicas --------------------------------------------------------------------------------

REPLICA = {"engine": {**SMALL_ENGINE, "n_threads": 1}, "cache": NO_CACHE, "ledger": None}


@pytest.fixture(scope="module")
def engines() -> Iterator[dict[str, Any]]:
    """Two tokenomy engine processes as replicas of one pooled model behind a gateway (prefix-aware)."""
    with contextlib.ExitStack() as stack:
        reps = [stack.enter_context(contextlib.closing(_Closable(live_server(REPLICA)))) for _ in range(2)]
        gw = stack.enter_context(live_server({"cache": NO_CACHE, "models": [{
            "name": "pooled", "backend": "openai", "replicas": [r.server.base_url for r in reps],
            "model": "smollm2-135m-instruct", "tokenizer": "smollm2-135m-instruct", "timeout_s": 60,
            "balance": {"policy": "prefix", "check_interval_s": 0}}]}))
        yield {"replicas": reps, "gateway": gw, "pool": gw.gateway.registry.get("pooled")}


class _Closable:
    """A live_server that a test may stop before the module ends (killing a replica)."""

    def __init__(self, cm: Any) -> None:
        self.cm, self.server = cm, cm.__enter__()
        self.stopped = False

    def close(self) -> None:
        if not self.stopped:
            self.stopped = True
            self.cm.__exit__(None, None, None)


def _body(tenant: str, question: str, max_tokens: int = 2, stream: bool = False) -> dict[str, Any]:
    return {"model": "pooled", "max_tokens": max_tokens, "temperature": 0, "stream": stream,
            "messages": [{"role": "system", "content": SYSTEMS[tenant]}, {"role": "user", "content": question}]}


def test_prefix_aware_pool_sends_each_tenant_to_the_replica_holding_its_prefix(engines: dict[str, Any]) -> None:
    gw = engines["gateway"]
    ids: dict[str, list[str]] = {"acme": [], "globex": []}
    cached = []
    with httpx.Client(base_url=gw.base_url, timeout=120) as c:
        for i in range(3):
            for t in ids:
                r = c.post("/chat/completions", json=_body(t, f"Question {i}?"))
                assert r.status_code == 200, r.text
                ids[t].append(r.headers["x-tokenomy-request-id"])
                if i:
                    cached.append(r.json()["usage"]["prompt_tokens_details"]["cached_tokens"])
    ledger = gw.gateway.ledger
    ledger.flush()
    served = {t: {ledger.get(i).replica for i in rids} for t, rids in ids.items()}
    names = {r.name for r in engines["pool"].replicas}
    assert all(len(s) == 1 and s <= names for s in served.values()), served
    assert served["acme"] != served["globex"]          # an idle pool spreads tenants, then keeps each on its own
    assert min(cached) > 100                           # the replica that holds the prefix reuses it


def test_a_tokenomy_replica_is_read_through_vllms_names(engines: dict[str, Any]) -> None:
    """A replica that is a tokenomy server on its embedded engine: a pool's check reads its load from the vllm:
    families, with nothing special for tokenomy; a stream in flight at the replica shows as running there."""
    server = engines["replicas"][1].server
    pool = Pool(spec([server.base_url]))          # a pool of another gateway, on this test's event loop
    replica = pool.replicas[0]
    text = httpx.get(server.root + "/metrics", timeout=30).text
    vllm_only = "\n".join(line for line in text.splitlines() if not line.startswith("tokenomy_"))
    without_vllm = "\n".join(line for line in text.splitlines() if not line.startswith("vllm:"))
    assert parse_prometheus(vllm_only) == parse_prometheus(text) and parse_prometheus(text).known
    assert not parse_prometheus(without_vllm).known
    assert 'vllm:num_requests_running{engine="0",model_name="smollm2-135m-instruct"}' in text

    async def go() -> None:
        async with httpx.AsyncClient(base_url=server.base_url, timeout=120) as c:
            body = {"model": "smollm2-135m-instruct", "max_tokens": 400, "ignore_eos": True, "stream": True,
                    "messages": [{"role": "user", "content": "Count slowly."}]}
            async with c.stream("POST", "/chat/completions", json=body) as r:
                lines = r.aiter_lines()     # kept: a dropped iterator is closed (and the stream with it) at the break
                async for line in lines:
                    if line.startswith("data: {"):
                        break                           # decoding now

                async def running() -> bool:
                    await pool.check()
                    return (replica.signal.running or 0) >= 1

                await wait_until_async(running, what="the replica's stream shown as running")
        # the client left: the replica's engine frees the sequence, and the next check sees it idle
        await wait_until_async(lambda: server.gateway.engines()[0][1].running == 0, what="the replica idle")
        await pool.check()
        assert (replica.signal.running, replica.signal.waiting) == (0.0, 0.0)
        assert 0.0 < (replica.signal.kv_usage or 0.0) <= 1.0   # its cached prefixes hold KV
        await pool.close()

    asyncio.run(go())


def test_killing_a_replica_loses_no_request_that_had_not_started_streaming(engines: dict[str, Any]) -> None:
    gw, pool = engines["gateway"], engines["pool"]
    victim = next(r for r in engines["replicas"])
    victim_name = pool.replicas[0].name

    async def one(c: httpx.AsyncClient, i: int) -> tuple[bool, int]:
        """(finished well, content chunks received before the end)."""
        chunks, ok = 0, False
        async with c.stream("POST", "/chat/completions", json=_body(("acme", "globex")[i % 2], f"Tell me {i}.",
                                                                      max_tokens=12, stream=True)) as r:
            if r.status_code != 200:
                return False, 0
            async for line in r.aiter_lines():
                if line.startswith("data: {"):
                    chunk = json.loads(line[6:])
                    if "error" in chunk:
                        return False, chunks
                    if chunk["choices"] and chunk["choices"][0]["delta"].get("content"):
                        chunks += 1
                    if chunk["choices"] and chunk["choices"][0].get("finish_reason") in ("stop", "length"):
                        ok = True
        return ok, chunks

    async def go() -> list[tuple[bool, int]]:
        async with httpx.AsyncClient(base_url=gw.base_url, timeout=120) as c:
            tasks = [asyncio.create_task(one(c, i)) for i in range(6)]
            await wait_until_async(lambda: pool.replicas[0].outstanding > 0, what="requests at the victim")
            await asyncio.to_thread(victim.close)           # the replica's server stops mid-run
            during = list(await asyncio.gather(*tasks))
            after = list(await asyncio.gather(*(one(c, i) for i in range(4))))
            return during + after

    results = asyncio.run(go())
    assert all(ok or chunks > 0 for ok, chunks in results), results   # only a started stream may fail
    assert all(ok for ok, _ in results[6:]), results                 # after the kill every request is served
    assert pool.replicas[0].name == victim_name and pool.replicas[0].failed >= 1


def test_queued_is_the_least_queued_eligible_replica_and_holds_batch_work(tmp_path) -> None:
    from tokenomy.backends.load_signals import LoadSignal
    from tokenomy.gateway import Gateway

    pool = Pool(spec(["http://127.0.0.1:9/v1", "http://127.0.0.1:10/v1"]))
    a, b = pool.replicas
    assert pool.queued() is None                                  # nothing scraped yet
    a.signal, b.signal = LoadSignal(waiting=3), LoadSignal(waiting=1)
    assert pool.queued() == 1
    b.ejected_until = time.monotonic() + 60                       # an ejected replica takes nothing
    assert pool.queued() == 3
    cfg = Config.model_validate({
        "models": [spec(["http://127.0.0.1:9/v1", "http://127.0.0.1:10/v1"]).model_dump()],
        "ledger": f"sqlite:///{tmp_path / 'l.db'}", "cache": {"path": str(tmp_path / "c"), "exact": {"enabled": False},
                                                            "semantic": {"enabled": False}},
        "batch": {"upstream_max_queued": 2}})
    gw = Gateway(cfg)
    try:
        p = gw.registry.get("m")
        p.replicas[0].signal, p.replicas[1].signal = LoadSignal(waiting=3), LoadSignal(waiting=5)
        assert gw.hold_batch("m")                                # every replica has more than 2 waiting
        p.replicas[1].signal = LoadSignal(waiting=0)
        assert not gw.hold_batch("m")
    finally:
        gw.ledger.close()
