"""A minimal OpenAI-compatible upstream for tests and the gateway benchmark: answers instantly (or slowly, or
with errors, as told), as a raw ASGI app so that its own overhead is as small as it can be. Its /v1/embeddings
answers STUB_DIMENSIONS-dimensional vectors that `stub_vector` computes from each input.

    python -m tests.helpers.upstream_stub --port 9000 [--delay 0] [--fail-status 429 --fail-times 2] [--no-usage]
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import hashlib
import json
import time
from typing import Any

import numpy as np

WORDS = ["Hello", " from", " the", " stub", "."]
STUB_DIMENSIONS = 8


def stub_vector(item: str | list[int], dimensions: int = STUB_DIMENSIONS) -> np.ndarray:
    """The stub's embedding of one input: unit-length float32, fixed by the input, shortened to `dimensions`."""
    seed = hashlib.sha256(json.dumps(item).encode()).digest()
    v = np.frombuffer(seed, dtype=np.uint8)[:STUB_DIMENSIONS].astype(np.float32) - 127.5
    v = v[:dimensions]
    return (v / np.linalg.norm(v)).astype(np.float32)


def answer(stop: str | list[str] | None) -> tuple[list[str], str | None]:
    """The stub's answer in pieces, cut before the first of the request's stop strings it contains, and that stop
    string (reported as vLLM reports it, in the choice's `stop_reason`)."""
    text = "".join(WORDS)
    stops = [stop] if isinstance(stop, str) else list(stop or [])
    hits = [(text.find(s), s) for s in stops if s and s in text]
    if not hits:
        return list(WORDS), None
    cut, matched = min(hits)
    words, at = [], 0
    for w in WORDS:
        if at + len(w) > cut:
            words.append(w[:cut - at])
            break
        words.append(w)
        at += len(w)
    return [w for w in words if w], matched


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
                 no_usage: bool = False, stall_after: int | None = None, json_for_stream: bool = False,
                 tool_arguments: str | None = None, texts: list[str | list[str]] | None = None,
                 finish: str = "stop", fail_retry_after: str | None = "0", cut_after: int | None = None) -> None:
        self.delay, self.fail_status, self.fail_times = delay, fail_status, fail_times
        self.fail_retry_after = fail_retry_after   # the Retry-After of a failure (None: none sent)
        self.cut_after = cut_after   # a streamed answer's connection breaks after this many chunks of text
        self.no_usage, self.stall_after = no_usage, stall_after
        self.json_for_stream = json_for_stream   # answer a streamed request with one JSON body, as some servers do
        # a chat request with tools is answered with a call of its first tool with these arguments (a JSON text)
        self.tool_arguments = tool_arguments
        # chat and completion answers in turn (the last one again once they run out), with this finish_reason; a
        # turn given as a list says one text per choice (n > 1)
        self.texts, self.finish = texts, finish
        self.hits = 0
        self.bodies: list[dict[str, Any]] = []       # every request body, in order
        self.headers: list[dict[str, str]] = []      # ... and its headers (lower-cased names), in order
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
        self.headers.append({k.decode().lower(): v.decode() for k, v in scope.get("headers", [])})
        self.hits += 1
        if scope.get("client"):
            self.peers.add(tuple(scope["client"]))
        if self.fail_status and self.hits <= self.fail_times:
            headers = {"retry-after": self.fail_retry_after} if self.fail_retry_after is not None else {}
            await self._json(send, self.fail_status, {"error": {"message": "stub failure", "type": "x"}}, headers)
            return
        if self.delay:
            await asyncio.sleep(self.delay)
        req = json.loads(body or b"{}")
        self.bodies.append(req)
        if path.endswith("/embeddings"):
            await self._embeddings(send, req)
            return
        chat = path.endswith("/chat/completions")
        if chat and self.tool_arguments is not None and req.get("tools"):
            await self._tool_call(send, req, bool(req.get("stream")) and not self.json_for_stream)
            return
        words, matched = answer(req.get("stop"))
        n = int(req.get("n") or 1)                        # every choice says the same words...
        said: list[list[str]] = []                        # ... unless a turn of `texts` is a list: one per choice
        if self.texts:
            turn = self.texts[min(len(self.bodies), len(self.texts)) - 1]
            said = [[t[i:i + 4] for i in range(0, len(t), 4)] for t in ([turn] if isinstance(turn, str) else turn)]
            words, matched = said[0], None
        said = [said[min(i, len(said) - 1)] for i in range(n)] if len(said) > 1 else [words] * n
        usage: dict[str, Any] = {"prompt_tokens": 7, "completion_tokens": n * len(words),
                                 "total_tokens": 7 + n * len(words)}
        if req.get("prediction"):                         # as OpenAI reports a prediction's tokens
            usage["completion_tokens_details"] = {"accepted_prediction_tokens": 3, "rejected_prediction_tokens": 1}
        if not req.get("stream") or self.json_for_stream:
            choices = []
            for i in range(n):
                choice: dict[str, Any] = {"index": i, "finish_reason": self.finish, "logprobs": None,
                                          "stop_reason": matched}
                if chat:
                    choice["message"] = {"role": "assistant", "content": "".join(said[i])}
                else:
                    choice["text"] = "".join(said[i])
                choices.append(choice)
            out = {"id": "stub-1", "object": "chat.completion" if chat else "text_completion",
                   "created": int(time.time()), "model": req.get("model", "stub"), "choices": choices}
            if not self.no_usage:
                out["usage"] = usage
            await self._json(send, 200, out)
            return
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/event-stream")]})
        for i in range(max(len(ws) for ws in said)):
            if self.stall_after is not None and i >= self.stall_after:
                await asyncio.sleep(3600)
            if self.cut_after is not None and i >= self.cut_after:
                raise ConnectionAbortedError("the stub breaks the connection mid-answer")
            for index in range(n):
                if i >= len(said[index]):
                    continue
                w = said[index][i]
                delta = {"content": w} if chat else None
                choice = {"index": index, "delta": delta, "finish_reason": None} if chat else \
                    {"index": index, "text": w, "finish_reason": None}
                await self._event(send, {"id": "stub-1", "object": "chat.completion.chunk", "choices": [choice]})
        for index in range(n):
            last = {"index": index, "delta": {}, "finish_reason": self.finish, "stop_reason": matched} if chat else \
                {"index": index, "text": "", "finish_reason": self.finish, "stop_reason": matched}
            await self._event(send, {"id": "stub-1", "object": "chat.completion.chunk", "choices": [last]})
        if not self.no_usage and (req.get("stream_options") or {}).get("include_usage"):
            await self._event(send, {"id": "stub-1", "object": "chat.completion.chunk", "choices": [],
                                     "usage": usage})
        await send({"type": "http.response.body", "body": b"data: [DONE]\n\n", "more_body": False})

    async def _embeddings(self, send: Any, req: dict[str, Any]) -> None:
        """OpenAI's embeddings answer: floats or base64 as asked; a 400 for more dimensions than it has."""
        dims = req.get("dimensions") or STUB_DIMENSIONS
        if dims > STUB_DIMENSIONS:
            await self._json(send, 400, {"error": {"message": f"this model has only {STUB_DIMENSIONS} dimensions",
                                                   "type": "invalid_request_error"}})
            return
        items = req["input"] if isinstance(req["input"], list) else [req["input"]]
        if items and all(isinstance(t, int) for t in items):
            items = [items]
        data = []
        for i, item in enumerate(items):
            v = stub_vector(item, dims)
            e: Any = base64.b64encode(v.astype("<f4").tobytes()).decode() if req.get("encoding_format") == "base64" \
                else v.tolist()
            data.append({"object": "embedding", "index": i, "embedding": e})
        tokens = sum(len(x.split()) if isinstance(x, str) else len(x) for x in items)
        out: dict[str, Any] = {"object": "list", "data": data, "model": req.get("model", "stub")}
        if not self.no_usage:
            out["usage"] = {"prompt_tokens": tokens, "total_tokens": tokens}
        await self._json(send, 200, out)

    async def _tool_call(self, send: Any, req: dict[str, Any], stream: bool) -> None:
        """A call of the request's first tool, whole or streamed as OpenAI streams one: id and name first, then
        the arguments in two fragments, then finish_reason tool_calls."""
        name, args = req["tools"][0]["function"]["name"], self.tool_arguments or "{}"
        call = {"id": "call_stub1", "type": "function", "function": {"name": name, "arguments": args}}
        usage = {"prompt_tokens": 7, "completion_tokens": 9, "total_tokens": 16}
        if not stream:
            message = {"role": "assistant", "content": None, "tool_calls": [call]}
            await self._json(send, 200, {"id": "stub-1", "object": "chat.completion", "created": int(time.time()),
                                         "model": req.get("model", "stub"), "usage": usage,
                                         "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls"}]})
            return
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/event-stream")]})
        half = len(args) // 2
        pieces = [{"index": 0, "id": "call_stub1", "type": "function", "function": {"name": name, "arguments": ""}},
                  {"index": 0, "function": {"arguments": args[:half]}},
                  {"index": 0, "function": {"arguments": args[half:]}}]
        for piece in pieces:
            choice = {"index": 0, "delta": {"tool_calls": [piece]}, "finish_reason": None}
            await self._event(send, {"id": "stub-1", "object": "chat.completion.chunk", "choices": [choice]})
        await self._event(send, {"id": "stub-1", "object": "chat.completion.chunk",
                                 "choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]})
        await self._event(send, {"id": "stub-1", "object": "chat.completion.chunk", "choices": [], "usage": usage})
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
