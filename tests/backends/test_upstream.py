"""The upstream client (tokenomy/backends/upstream.py): every failure status of a real HTTP upstream on 127.0.0.1,
for both backend kinds (an OpenAI-compatible server, tests/helpers/upstream_stub.py; a Messages server,
tests/helpers/messages_stub.py), seen at the backend and by a client through the gateway in both dialects: the same
table (docs/upstreams.md, "Failures") whatever the kind. Backoff is set to a millisecond, so retries take no time
worth waiting for; nothing here sleeps or times anything."""

from __future__ import annotations

import asyncio
import email.utils
import json
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from tests.conftest import NO_CACHE, live_server
from tests.helpers.messages_stub import Failure, MessagesStub, text
from tests.helpers.upstream_stub import Stub
from tests.pipeline.test_gateway_upstream import StubServer
from tokenomy.backends.anthropic import AnthropicBackend
from tokenomy.backends.base import BackendError, InvalidRequest
from tokenomy.backends.openai import OpenAIBackend
from tokenomy.backends.pool import Pool
from tokenomy.backends.upstream import RetryPolicy, retry_after, sse_data
from tokenomy.config import AnthropicModelSpec, OpenAIModelSpec
from tokenomy.generation import Delta, GenRequest

RETRIES = 1
FAST = {"max_retries": RETRIES, "retry_backoff_s": 0.001, "timeout_s": 30}
HI = [{"role": "user", "content": "Say hi."}]
ANTHROPIC_KINDS = {"invalid_request_error": (400, 413, 422), "authentication_error": (401,),
                   "permission_error": (403,), "not_found_error": (404,), "rate_limit_error": (429,),
                   "api_error": (500, 502), "overloaded_error": (503, 529)}


@dataclass(frozen=True)
class Case:
    """An upstream's failure and what it must become."""

    status: int
    retry_after: str | None       # the upstream's Retry-After header
    client_status: int            # what the client gets when no other model can serve
    tries: int                    # sends to the upstream for one request
    fallback: bool                # whether the route's next model serves instead
    client_retry_after: str | None = None

    def __str__(self) -> str:
        return f"{self.status}-ra={self.retry_after}"


CASES = [
    Case(400, None, 400, 1, False), Case(413, None, 413, 1, False), Case(422, None, 422, 1, False),
    Case(401, None, 502, 1, True), Case(403, None, 502, 1, True), Case(404, None, 502, 1, True),
    Case(429, "0", 503, RETRIES + 1, True, "1"),          # retried; a wait of 0 s is said as 1 (whole seconds)
    Case(429, None, 503, RETRIES + 1, True, None),        # no Retry-After from the upstream: none invented
    Case(429, "30", 503, 1, True, "30"),                  # longer than max_retry_wait_s: handed up at once
    Case(500, None, 503, RETRIES + 1, True), Case(502, None, 503, RETRIES + 1, True),
    Case(503, "2", 503, RETRIES + 1, True, "2"), Case(529, "0", 503, RETRIES + 1, True, "1"),
]


class Upstream:
    """One stub upstream of either kind, behind a common face: fail with a status, count the sends."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.stub: Any = Stub() if kind == "openai" else MessagesStub()
        self.server = StubServer(self.stub)

    def __enter__(self) -> Upstream:
        self.server.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.__exit__(*exc)

    @property
    def sends(self) -> int:
        return self.stub.hits if self.kind == "openai" else len(self.stub.requests)

    def fail(self, status: int | None, retry_after: str | None = None) -> None:
        """Answer every request with `status` (None: answer normally again)."""
        if self.kind == "openai":
            self.stub.fail_status, self.stub.fail_times, self.stub.fail_retry_after = status, 10**9, retry_after
        else:
            kind = next((k for k, v in ANTHROPIC_KINDS.items() if status in v), "api_error")
            self.stub.failing = None if status is None else Failure(status, kind, retry_after)

    def cut_mid_answer(self) -> None:
        """The next streamed answer's connection breaks after its first text."""
        if self.kind == "openai":
            self.stub.cut_after = 1
        else:
            self.stub.replies.append(text(cut_after_text=True))

    def model(self, name: str) -> dict[str, Any]:
        """The model's config entry."""
        if self.kind == "openai":
            return {"name": name, "backend": "openai", "base_url": f"http://127.0.0.1:{self.server.port}/v1",
                    "model": "stub", **FAST}
        return {"name": name, "backend": "anthropic", "base_url": f"http://127.0.0.1:{self.server.port}",
                "model": "claude-stub", "api_key_env": None, **FAST}

    def backend(self) -> OpenAIBackend | AnthropicBackend:
        entry = self.model("m")
        if self.kind == "openai":
            return OpenAIBackend(OpenAIModelSpec(**entry))
        return AnthropicBackend(AnthropicModelSpec(**entry))


def run(backend: Any, req: GenRequest | None = None) -> list[Delta]:
    async def go() -> list[Delta]:
        try:
            return [d async for d in backend.stream(req or GenRequest(model="m", messages=HI))]
        finally:
            await backend.close()
    return asyncio.run(go())


# ---- the policy and the parts --------------------------------------------------------------------------------------

def test_retry_after_reads_seconds_and_dates() -> None:
    assert retry_after("12") == 12 and retry_after("0.5") == 0.5 and retry_after(None) is None
    assert retry_after("Wed, 21 Oct 2015 07:28:00 GMT") == 0.0                  # a date in the past: now
    later = email.utils.formatdate(time.time() + 3600, usegmt=True)
    assert 3000 < retry_after(later) <= 3600                                    # type: ignore[operator]
    assert retry_after("soon") is None and retry_after("-3") == 0.0


def test_the_policy_backs_off_with_jitter_and_honours_retry_after_up_to_its_cap() -> None:
    p = RetryPolicy(retries=3, backoff_s=0.2, max_wait_s=5.0)
    for attempt, (low, high) in enumerate([(0.1, 0.2), (0.2, 0.4), (0.4, 0.8)]):
        waits = {p.wait(attempt, None) for _ in range(50)}
        assert all(low <= w <= high for w in waits) and len(waits) > 1     # type: ignore[operator]
    assert p.wait(3, None) is None                                          # the retries are spent
    assert p.wait(0, 4.0) == 4.0                                            # at least what the upstream said
    assert p.wait(0, 5.5) is None                                           # more than the cap: hand it up
    assert RetryPolicy(retries=9, backoff_s=1.0, max_wait_s=2.0).wait(8, None) <= 2.0   # type: ignore[operator]


def test_the_event_stream_reader_joins_data_lines_and_every_line_end() -> None:
    body = [b"data: {\"a\": 1}\r", b"\n\r\n: a comment\n\nevent: x\ndata: one\ndata: two\n\n", b"data: [DONE]\r\r",
            b"data: last"]

    async def go() -> list[bytes]:
        async def chunks() -> AsyncIterator[bytes]:
            for c in body:
                yield c
        return [d async for d in sse_data(httpx.Response(200, content=chunks()))]
    assert asyncio.run(go()) == [b'{"a": 1}', b"one\ntwo", b"[DONE]", b"last"]


# ---- each status, at the backend -----------------------------------------------------------------------------------

@pytest.fixture(params=["openai", "anthropic"])
def upstream(request: pytest.FixtureRequest) -> Iterator[Upstream]:
    with Upstream(request.param) as u:
        yield u


@pytest.mark.parametrize("case", CASES, ids=str)
def test_each_status_means_the_same_from_either_kind_of_upstream(upstream: Upstream, case: Case) -> None:
    upstream.fail(case.status, case.retry_after)
    with pytest.raises((InvalidRequest, BackendError)) as e:
        run(upstream.backend())
    err = e.value
    assert upstream.sends == case.tries
    if case.status in (400, 413, 422):
        assert isinstance(err, InvalidRequest) and err.status == case.status and "stub failure" in str(err)
        return
    assert isinstance(err, BackendError) and err.retryable and "stub failure" in str(err)
    assert err.lasting == (case.status in (401, 403, 404))
    if err.lasting:
        assert err.status == 502 and "misconfigured" in str(err)
    elif case.status in (429, 503, 529):
        assert err.status == 503 and "overloaded" in str(err)
        assert err.retry_after == (None if case.retry_after is None else float(case.retry_after))
    else:
        assert err.status == 502
    upstream.fail(None)
    assert "".join(d.text for d in run(upstream.backend()))           # and it serves again


def test_a_stream_that_breaks_after_its_first_byte_is_not_retried(upstream: Upstream) -> None:
    upstream.cut_mid_answer()
    got: list[Delta] = []

    async def go() -> None:
        backend = upstream.backend()
        try:
            async for d in backend.stream(GenRequest(model="m", messages=HI)):
                got.append(d)
        finally:
            await backend.close()
    with pytest.raises(BackendError, match="connection lost mid-answer"):
        asyncio.run(go())
    assert got and got[0].text and upstream.sends == 1


def test_a_pool_fails_over_a_misconfigured_or_busy_replica_and_hands_the_client_fault_up() -> None:
    with StubServer(Stub(fail_status=401, fail_times=10**9)) as bad, \
            StubServer(Stub(fail_status=429, fail_times=10**9, fail_retry_after="9")) as busy, \
            StubServer(Stub()) as good:
        urls = [f"http://127.0.0.1:{s.port}/v1" for s in (bad, busy, good)]
        spec = OpenAIModelSpec(name="p", backend="openai", model="stub", replicas=urls,
                               balance={"policy": "round_robin", "check_interval_s": 0}, **FAST)
        for _ in range(3):      # whichever replica comes first, the good one answers; the others once each at most
            assert "".join(d.text for d in run(Pool(spec))) == "Hello from the stub."
        assert good.stub.hits == 3 and bad.stub.hits <= 3 and busy.stub.hits <= 3
        assert bad.stub.hits + busy.stub.hits > 0
        # every replica out: busy wins (503 with the soonest Retry-After), the misconfigured one is named
        good.stub.fail_status, good.stub.fail_times = 503, 10**9
        good.stub.fail_retry_after = "4"
        with pytest.raises(BackendError) as e:
            run(Pool(spec))
        assert (e.value.status, e.value.retry_after, e.value.lasting) == (503, 4.0, False)
        assert "misconfigured" in str(e.value)
        # the client's own fault is not tried on another replica
        good.stub.fail_status = bad.stub.fail_status = busy.stub.fail_status = 422
        before = bad.stub.hits + busy.stub.hits + good.stub.hits
        with pytest.raises(InvalidRequest) as bad_request:
            run(Pool(spec))
        assert bad_request.value.status == 422 and bad.stub.hits + busy.stub.hits + good.stub.hits == before + 1


# ---- each status, through the gateway, in both dialects ------------------------------------------------------------

@pytest.fixture(params=["openai", "anthropic"])
def gateway(request: pytest.FixtureRequest) -> Iterator[tuple[Upstream, Stub, Any]]:
    """A gateway whose model `a` is the upstream under test and `b` a healthy OpenAI-compatible one; the route
    `chat` asks a, then b. Failures never cool a model down here, so every request sees the upstream."""
    with Upstream(request.param) as u, StubServer(Stub()) as other:
        b = {"name": "b", "backend": "openai", "base_url": f"http://127.0.0.1:{other.port}/v1", "model": "stub"}
        config = {"cache": NO_CACHE, "models": [u.model("a"), b],
                  "routes": {"chat": {"strategy": "fixed", "models": ["a", "b"]}},
                  "cooldown": {"failures": 10**6, "window_s": 1, "cooldown_s": 1}}
        with live_server(config) as gw:
            yield u, other.stub, gw


def openai_error(r: httpx.Response) -> dict[str, Any]:
    body = r.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}
    return body["error"]


def anthropic_error(r: httpx.Response) -> dict[str, Any]:
    body = r.json()
    assert body["type"] == "error" and set(body["error"]) == {"type", "message"}
    return body["error"]


def test_what_a_client_sees_of_each_status_in_both_dialects(gateway: tuple[Upstream, Stub, Any]) -> None:
    u, other, gw = gateway
    for case in CASES:
        u.fail(case.status, case.retry_after)
        sent = u.sends
        r = httpx.post(gw.base_url + "/chat/completions", json={"model": "a", "messages": HI}, timeout=60)
        assert (r.status_code, u.sends - sent) == (case.client_status, case.tries), (case, r.text)
        assert r.headers.get("retry-after") == case.client_retry_after, case
        err = openai_error(r)
        m = gw.root + "/v1/messages"
        a = httpx.post(m, json={"model": "a", "max_tokens": 8, "messages": HI}, timeout=60)
        assert a.status_code == case.client_status and a.headers.get("retry-after") == case.client_retry_after
        aerr = anthropic_error(a)
        if case.client_status < 500:        # the client's request: its status and the upstream's message
            assert err["type"] == aerr["type"].replace("request_too_large", "invalid_request_error") == \
                "invalid_request_error" and "stub failure" in err["message"] and "stub failure" in aerr["message"]
        elif case.client_status == 502:     # the deployment's fault, said so; never the client's invalid request
            assert (err["type"], aerr["type"]) == ("server_error", "api_error")
            assert "misconfigured" in err["message"] and "misconfigured" in aerr["message"]
        else:                               # busy or failing: come back later
            assert (err["type"], aerr["type"]) == ("service_unavailable", "overloaded_error")
            assert err["code"] == "no_backend"
        # through a route: the next model serves what another model can; the client's fault goes back as is
        served = other.hits
        r = httpx.post(gw.base_url + "/chat/completions", json={"model": "chat", "messages": HI}, timeout=60)
        if case.fallback:
            assert r.status_code == 200 and r.json()["model"] == "b" and other.hits == served + 1, case
        else:
            assert r.status_code == case.status and other.hits == served, case
    u.fail(None)
    r = httpx.post(gw.base_url + "/chat/completions", json={"model": "a", "messages": HI}, timeout=60)
    assert r.status_code == 200


def test_a_stream_cut_after_its_first_byte_ends_with_an_error_and_is_neither_retried_nor_fallen_back(
        gateway: tuple[Upstream, Stub, Any]) -> None:
    u, other, gw = gateway
    for path, body in (("/v1/chat/completions", {"model": "chat", "messages": HI, "stream": True}),
                       ("/v1/messages", {"model": "chat", "max_tokens": 8, "messages": HI, "stream": True})):
        u.cut_mid_answer()
        sent, served = u.sends, other.hits
        with httpx.stream("POST", gw.root + path, json=body, timeout=60) as r:
            assert r.status_code == 200
            events = [json.loads(line[5:]) for line in r.iter_lines() if line.startswith("data:")
                      and line[5:].strip() != "[DONE]"]
        texts = [e for e in events if (e.get("choices") or [{}])[0].get("delta", {}).get("content")
                 or e.get("delta", {}).get("type") == "text_delta"]
        assert texts, events                               # the first text reached the client ...
        assert events[-1].get("error"), events             # ... then the stream ends with an error event,
        assert (u.sends - sent, other.hits - served) == (1, 0)    # ... and there is no second send, no other model
