"""A minimal OpenAI-compatible upstream for tests and the gateway benchmark: answers instantly (or slowly, or
with errors, as told), as a raw ASGI app so that its own overhead is as small as it can be.

    python -m tests.upstream_stub --port 9000 [--delay 0] [--fail-status 429 --fail-times 2] [--no-usage]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from typing import Any

WORDS = ["Hello", " from", " the", " stub", "."]


async def read_body(receive: Any) -> bytes:
    """An ASGI request's whole body."""
    body = b""
    while True:
        msg = await receive()
        body += msg.get("body", b"")
        if not msg.get("more_body"):
            return body


class Stub:
    def __init__(self, delay: float = 0.0, fail_status: int | None = None, fail_times: int = 0,
                 no_usage: bool = False, stall_after: int | None = None, json_for_stream: bool = False) -> None:
        self.delay, self.fail_status, self.fail_times = delay, fail_status, fail_times
        self.no_usage, self.stall_after = no_usage, stall_after
        self.json_for_stream = json_for_stream   # answer a streamed request with one JSON body, as some servers do
        self.hits = 0
        self.bodies: list[dict[str, Any]] = []       # every request body, in order
        self.peers: set[tuple[str, int]] = set()   # client (host, port) of each connection that sent a request

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while True:
                msg = await receive()
                if msg["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif msg["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        path = scope["path"]
        if path.endswith("/models"):
            await self._json(send, 200, {"object": "list", "data": [{"id": "stub", "object": "model"}]})
            return
        body = await read_body(receive)
        self.hits += 1
        if scope.get("client"):
            self.peers.add(tuple(scope["client"]))
        if self.fail_status and self.hits <= self.fail_times:
            await self._json(send, self.fail_status, {"error": {"message": "stub failure", "type": "x"}},
                             {"retry-after": "0"})
            return
        if self.delay:
            await asyncio.sleep(self.delay)
        req = json.loads(body or b"{}")
        self.bodies.append(req)
        chat = path.endswith("/chat/completions")
        n = int(req.get("n") or 1)                        # every choice says the same WORDS
        usage: dict[str, Any] = {"prompt_tokens": 7, "completion_tokens": n * len(WORDS),
                                 "total_tokens": 7 + n * len(WORDS)}
        if req.get("prediction"):                         # as OpenAI reports a prediction's tokens
            usage["completion_tokens_details"] = {"accepted_prediction_tokens": 3, "rejected_prediction_tokens": 1}
        if not req.get("stream") or self.json_for_stream:
            choices = []
            for i in range(n):
                choice: dict[str, Any] = {"index": i, "finish_reason": "stop", "logprobs": None}
                if chat:
                    choice["message"] = {"role": "assistant", "content": "".join(WORDS)}
                else:
                    choice["text"] = "".join(WORDS)
                choices.append(choice)
            out = {"id": "stub-1", "object": "chat.completion" if chat else "text_completion",
                   "created": int(time.time()), "model": req.get("model", "stub"), "choices": choices}
            if not self.no_usage:
                out["usage"] = usage
            await self._json(send, 200, out)
            return
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/event-stream")]})
        for i, w in enumerate(WORDS):
            if self.stall_after is not None and i >= self.stall_after:
                await asyncio.sleep(3600)
            for index in range(n):
                delta = {"content": w} if chat else None
                choice = {"index": index, "delta": delta, "finish_reason": None} if chat else \
                    {"index": index, "text": w, "finish_reason": None}
                await self._event(send, {"id": "stub-1", "object": "chat.completion.chunk", "choices": [choice]})
        for index in range(n):
            last = {"index": index, "delta": {}, "finish_reason": "stop"} if chat else \
                {"index": index, "text": "", "finish_reason": "stop"}
            await self._event(send, {"id": "stub-1", "object": "chat.completion.chunk", "choices": [last]})
        if not self.no_usage and (req.get("stream_options") or {}).get("include_usage"):
            await self._event(send, {"id": "stub-1", "object": "chat.completion.chunk", "choices": [],
                                     "usage": usage})
        await send({"type": "http.response.body", "body": b"data: [DONE]\n\n", "more_body": False})

    @staticmethod
    async def _event(send: Any, obj: dict[str, Any]) -> None:
        await send({"type": "http.response.body", "body": b"data: " + json.dumps(obj).encode() + b"\n\n",
                    "more_body": True})

    @staticmethod
    async def _json(send: Any, status: int, obj: dict[str, Any], headers: dict[str, str] | None = None) -> None:
        raw = json.dumps(obj).encode()
        hs = [(b"content-type", b"application/json"), (b"content-length", str(len(raw)).encode())]
        hs += [(k.encode(), v.encode()) for k, v in (headers or {}).items()]
        await send({"type": "http.response.start", "status": status, "headers": hs})
        await send({"type": "http.response.body", "body": raw})


def main() -> None:
    import uvicorn

    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--delay", type=float, default=0.0)
    ap.add_argument("--fail-status", type=int)
    ap.add_argument("--fail-times", type=int, default=0)
    ap.add_argument("--no-usage", action="store_true")
    a = ap.parse_args()
    uvicorn.run(Stub(a.delay, a.fail_status, a.fail_times, a.no_usage), host="127.0.0.1", port=a.port,
                log_level="warning", access_log=False)


if __name__ == "__main__":
    main()
