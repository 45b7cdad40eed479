"""A purpose-built OpenAI-compatible stub for the load generator's tests: streams a fixed number of tokens with
planted delays, and fails chosen requests (HTTP 500, or a connection closed mid-stream), as a raw ASGI app."""

from __future__ import annotations

import asyncio
import json
import threading
from typing import Any

import uvicorn

from tests.conftest import free_port
from tests.helpers.upstream_stub import Stub, read_body
from tests.helpers.wait import wait_until


class BenchStub:
    """Request i (1-based) answers 500 when fail_every divides i, else closes the connection after one chunk when
    reset_every divides i, else ends after one chunk with a line that is not JSON when garbage_every divides
    i, else streams `tokens` chunks: the first after `first_delay`, the rest `token_delay`
    apart, then usage (unless `usage` is False) and [DONE]. Every body received is kept in `bodies`; `log`, which
    may be shared between stubs, gets `name` once per request."""

    def __init__(self, name: str = "stub", tokens: int = 5, first_delay: float = 0.0, token_delay: float = 0.0,
                 fail_every: int = 0, reset_every: int = 0, usage: bool = True, log: list[str] | None = None,
                 garbage_every: int = 0) -> None:
        self.name, self.tokens, self.first_delay, self.token_delay = name, tokens, first_delay, token_delay
        self.fail_every, self.reset_every, self.usage = fail_every, reset_every, usage
        self.garbage_every = garbage_every
        self.log = log if log is not None else []
        self.bodies: list[dict[str, Any]] = []

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        raw = await read_body(receive)
        if scope["path"].endswith("/models"):
            await self._json(send, 200, {"object": "list", "data": [{"id": self.name, "object": "model"}]})
            return
        body = json.loads(raw)
        self.bodies.append(body)
        self.log.append(self.name)
        i = len(self.bodies)
        if self.fail_every and i % self.fail_every == 0:
            await self._json(send, 500, {"error": {"message": f"planted failure {i}", "type": "server_error"}})
            return
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/event-stream")]})
        await asyncio.sleep(self.first_delay)
        for k in range(self.tokens):
            if k:
                await asyncio.sleep(self.token_delay)
            await self._event(send, {"choices": [{"index": 0, "delta": {"content": f"t{k} "},
                                                  "finish_reason": None}]})
            if self.reset_every and i % self.reset_every == 0:
                raise RuntimeError("planted reset")     # uvicorn closes the connection mid-stream
            if self.garbage_every and i % self.garbage_every == 0:
                await send({"type": "http.response.body", "body": b"data: {not json\n\n", "more_body": False})
                return
        await self._event(send, {"choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]})
        if self.usage and (body.get("stream_options") or {}).get("include_usage"):
            await self._event(send, {"choices": [], "usage": {"prompt_tokens": 10, "completion_tokens": self.tokens,
                                                              "total_tokens": 10 + self.tokens}})
        await send({"type": "http.response.body", "body": b"data: [DONE]\n\n", "more_body": False})

    _event = staticmethod(Stub._event)
    _json = staticmethod(Stub._json)


class Served:
    """An ASGI app on a loopback port for the duration of a with block."""

    def __init__(self, app: Any) -> None:
        self.app, self.port = app, free_port()
        self.base_url = f"http://127.0.0.1:{self.port}/v1"
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="critical"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> Served:
        self.thread.start()
        wait_until(lambda: self.server.started, what="the stub to start")
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(10)
