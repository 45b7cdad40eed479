"""An upstream that speaks Anthropic's Messages API (Anthropic's own, or any Messages server) over httpx.

The request is translated by anthropic_request.py and always streamed; the answer's events become OpenAI-shaped
deltas:
    text_delta                         -> Delta.text
    tool_use start, input_json_delta   -> Delta.tool_calls (index, id, name; then arguments fragments)
    the JSON-answer tool's input       -> Delta.text (a request with response_format)
    stop_reason                        -> end_turn, stop_sequence: stop; max_tokens: length; tool_use: tool_calls
                                          (stop when the only tool called was the JSON answer); refusal:
                                          content_filter
    usage                              -> prompt = input + cache_read + cache_creation input tokens;
                                          cached = cache_read; cache_write = cache_creation
A server that answers the streamed request with one JSON message is read the same way. Stop strings Messages
refuses (whitespace only, such as "\n") are matched here (engine/stops.py): the answer is cut before the first,
the response closed (which ends the generation upstream) and its output tokens counted, as the final count never
comes.

Sending, retries, what each failure status means and the event-stream reader are the upstream client's
(upstream.py), the same as for an OpenAI-compatible upstream. After the first byte, an `error` event or a lost
connection is a BackendError.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx

from tokenomy.backends.anthropic_request import Asked, messages_request
from tokenomy.backends.base import BackendError
from tokenomy.backends.upstream import Upstream, sse_data
from tokenomy.config import AnthropicModelSpec
from tokenomy.context.tokens import TokenCount, TokenCounter
from tokenomy.engine.stops import StopScan
from tokenomy.generation import Delta, GenRequest, Usage
from tokenomy.metrics.prometheus import Metrics
from tokenomy.telemetry import trace

FINISH = {"end_turn": "stop", "stop_sequence": "stop", "max_tokens": "length", "tool_use": "tool_calls",
          "pause_turn": "stop", "refusal": "content_filter", "model_context_window_exceeded": "length"}


class AnthropicBackend(Upstream):
    HEALTH_PATH = "/v1/models"

    def __init__(self, spec: AnthropicModelSpec, metrics: Metrics | None = None,
                 counter: TokenCounter | None = None) -> None:
        headers = {"anthropic-version": spec.anthropic_version}
        key = spec.api_key()                 # ConfigError when its variable is unset
        if key:                              # as the anthropic SDK sends a key (2.x); vLLM and llama-server read it too
            headers["authorization"] = f"Bearer {key}"
        super().__init__(spec.name, spec, metrics, spec.base_url, headers)
        self.spec: AnthropicModelSpec = spec
        self.counter = counter or TokenCounter.for_model(spec.model or spec.name, spec.tokenizer)

    def __repr__(self) -> str:          # never print the key
        return f"AnthropicBackend({self.name!r}, {self.spec.base_url!r})"

    def count_tokens(self, req: GenRequest) -> TokenCount:
        return self.counter.count_prompt(req.messages if req.kind == "chat" else None, req.prompt)

    def stream(self, req: GenRequest) -> AsyncIterator[Delta]:
        """The answer's deltas; a traced request's call is a CLIENT span whose traceparent the upstream gets."""
        return trace.client_stream(req.trace, lambda headers: self._stream(req, headers), req, "anthropic",
                                   self.spec.model or self.name, self.spec.base_url)

    async def _stream(self, req: GenRequest, headers: dict[str, str] | None) -> AsyncIterator[Delta]:
        t0 = time.perf_counter()
        s = self.spec
        asked = messages_request(req, s.model or self.name, s.max_tokens, s.cache_control, s.sampling)
        resp = await self.send("/v1/messages", asked.body, headers)
        answer = Answer(asked, self.name)
        scan = StopScan(asked.local_stops) if asked.local_stops else None
        ttft: float | None = None
        cut = False
        try:
            if "application/json" in resp.headers.get("content-type", ""):
                events = _aiter(_events_of_message(await self._whole(resp)))
            else:
                events = self._sse(resp)
            async for event in events:
                for d in answer.read(event):
                    if scan is not None and d.text:
                        d.text, cut = scan.feed(d.text)
                    if d.text or d.tool_calls:
                        ttft = time.perf_counter() - t0 if ttft is None else ttft
                        yield d
                    if cut:
                        break
                if cut:         # closing the response ends the generation upstream
                    break
        except httpx.HTTPError as e:
            raise self.lost(e) from e
        finally:
            await resp.aclose()
        if scan is not None and not cut:
            rest, _ = scan.feed("", final=True)
            if rest:
                yield Delta(text=rest)
        usage = answer.usage() or Usage(prompt_tokens=self.count_tokens(req).tokens, counted=True)
        if cut or usage.counted:    # the output count never came (a cut stream closes before it): count what was kept
            usage.completion_tokens = self.counter.count_text(scan.text if scan is not None else answer.text()).tokens
            usage.counted = True
        usage.e2e_s = time.perf_counter() - t0
        usage.ttft_s = ttft
        yield Delta(finish_reason="stop" if cut else answer.finish_reason(), usage=usage)

    async def _sse(self, resp: httpx.Response) -> AsyncIterator[dict[str, Any]]:
        """The stream's events (their `data`), read to the end even after message_stop (upstream.sse_data)."""
        async for data in sse_data(resp):
            try:
                yield json.loads(data)
            except json.JSONDecodeError as e:
                raise BackendError(f"{self.name} sent a malformed stream event") from e

    async def _whole(self, resp: httpx.Response) -> dict[str, Any]:
        try:
            data = json.loads(await resp.aread())
        except json.JSONDecodeError as e:
            raise BackendError(f"{self.name} sent an unreadable answer: {e}") from e
        if not isinstance(data, dict):
            raise BackendError(f"{self.name} sent an answer that is not a message")
        return data


@dataclass
class _Block:
    kind: str                      # text | call (a client's tool) | answer (the JSON-answer tool) | other
    call: int = 0                  # a call's index among the answer's tool calls
    start_input: Any = None        # a tool_use block's input as it started (Anthropic sends {} and then deltas)
    json: str = ""                 # the input received so far, for a wrapped answer
    got_input: bool = False


class Answer:
    """One answer's stream events -> deltas, and at the end its finish reason and usage."""

    def __init__(self, asked: Asked, name: str) -> None:
        self.asked, self.name = asked, name
        self.blocks: dict[int, _Block] = {}
        self.calls = 0
        self.counts: dict[str, int] = {}
        self.stop_reason: str | None = None
        self.parts: list[str] = []

    def read(self, event: dict[str, Any]) -> list[Delta]:
        kind = event.get("type")
        if kind == "message_start":
            self._count((event.get("message") or {}).get("usage"))
        elif kind == "content_block_start":
            return self._start(event.get("index", 0), event.get("content_block") or {})
        elif kind == "content_block_delta":
            return self._delta(self.blocks.get(event.get("index", 0)), event.get("delta") or {})
        elif kind == "content_block_stop":
            return self._stop(self.blocks.get(event.get("index", 0)))
        elif kind == "message_delta":
            self.stop_reason = (event.get("delta") or {}).get("stop_reason") or self.stop_reason
            self._count(event.get("usage"))
        elif kind == "error":
            err = event.get("error") or {}
            raise BackendError(f"{self.name} stream error: {err.get('type', 'error')}: {err.get('message', '')}",
                               status=502)
        return []

    def _start(self, index: int, block: dict[str, Any]) -> list[Delta]:
        if block.get("type") == "text":
            self.blocks[index] = _Block("text")
            return self._text(block.get("text") or "")
        if block.get("type") != "tool_use":
            self.blocks[index] = _Block("other")     # thinking, server tools: not part of an OpenAI answer
            return []
        if block.get("name") == self.asked.json_tool:
            self.blocks[index] = _Block("answer", start_input=block.get("input"))
            return []
        b = self.blocks[index] = _Block("call", call=self.calls, start_input=block.get("input"))
        self.calls += 1
        return [Delta(tool_calls=[{"index": b.call, "id": block.get("id"), "type": "function",
                                   "function": {"name": block.get("name") or "", "arguments": ""}}])]

    def _delta(self, b: _Block | None, delta: dict[str, Any]) -> list[Delta]:
        if b is None:
            return []
        if delta.get("type") == "text_delta" and b.kind == "text":
            return self._text(delta.get("text") or "")
        if delta.get("type") != "input_json_delta" or b.kind not in ("call", "answer"):
            return []
        b.got_input = True
        return self._input(b, delta.get("partial_json") or "")

    def _stop(self, b: _Block | None) -> list[Delta]:
        if b is None or b.kind not in ("call", "answer"):
            return []
        out = [] if b.got_input or not b.start_input else self._input(b, json.dumps(b.start_input))
        if b.kind == "answer" and self.asked.wrapped:
            try:
                text = json.dumps(json.loads(b.json)["answer"])
            except (json.JSONDecodeError, KeyError, TypeError):
                text = b.json                   # cut short (max_tokens): what came, as it came
            out += self._text(text)
        return out

    def _input(self, b: _Block, fragment: str) -> list[Delta]:
        if not fragment:
            return []
        if b.kind == "call":
            return [Delta(tool_calls=[{"index": b.call, "function": {"arguments": fragment}}])]
        if self.asked.wrapped:
            b.json += fragment                  # unwrapped when the block ends
            return []
        return self._text(fragment)

    def _text(self, text: str) -> list[Delta]:
        if not text:
            return []
        self.parts.append(text)
        return [Delta(text=text)]

    def _count(self, usage: dict[str, Any] | None) -> None:
        for k, v in (usage or {}).items():
            if isinstance(v, int) and not isinstance(v, bool):
                self.counts[k] = v

    def text(self) -> str:
        return "".join(self.parts)

    def finish_reason(self) -> str:
        if self.stop_reason is None:
            raise BackendError(f"{self.name} ended the stream without a stop_reason", status=502)
        finish = FINISH.get(self.stop_reason, "stop")
        if finish == "tool_calls" and not self.calls:
            return "stop"                       # the JSON answer was the only tool called
        return "tool_calls" if self.calls and finish == "stop" else finish

    def usage(self) -> Usage | None:
        """The upstream's usage, None when it sent none."""
        c = self.counts
        if "input_tokens" not in c:
            return None
        read, write = c.get("cache_read_input_tokens", 0), c.get("cache_creation_input_tokens", 0)
        return Usage(prompt_tokens=c["input_tokens"] + read + write, completion_tokens=c.get("output_tokens", 0),
                     cached_tokens=read, cache_write_tokens=write)


def _events_of_message(message: dict[str, Any]) -> list[dict[str, Any]]:
    """A whole (non-streamed) message as the events that would have streamed it."""
    if message.get("type") == "error":
        return [message]
    events: list[dict[str, Any]] = [{"type": "message_start", "message": {"usage": message.get("usage")}}]
    for i, block in enumerate(message.get("content") or []):
        if block.get("type") == "tool_use":
            events.append({"type": "content_block_start", "index": i, "content_block": block})
        else:
            events.append({"type": "content_block_start", "index": i, "content_block": {**block, "text": ""}})
            events.append({"type": "content_block_delta", "index": i,
                           "delta": {"type": "text_delta", "text": block.get("text") or ""}})
        events.append({"type": "content_block_stop", "index": i})
    events.append({"type": "message_delta", "delta": {"stop_reason": message.get("stop_reason")}})
    return events


async def _aiter(items: list[dict[str, Any]]) -> AsyncIterator[dict[str, Any]]:
    for x in items:
        yield x

