"""An OpenAI-compatible upstream (vLLM, SGLang, llama.cpp server, OpenAI) over httpx: the request's OpenAI body,
and the answer's chunks read back as deltas, with the upstream's `usage`; when an upstream sends no usage we count
tokens ourselves and mark the usage `counted`. Sending, retries, the meaning of each status and the event-stream
reader are the upstream client's (upstream.py), the same for every HTTP backend.
"""

from __future__ import annotations

import base64
import binascii
import json
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
import numpy as np

from tokenomy.backends.base import BackendError, Embeddings
from tokenomy.backends.upstream import Upstream, bearer, error_message, sse_data
from tokenomy.config import OpenAIModelSpec
from tokenomy.context.tokens import TokenCount, TokenCounter
from tokenomy.generation import Delta, GenRequest, Usage
from tokenomy.metrics.prometheus import Metrics
from tokenomy.telemetry import trace


class OpenAIBackend(Upstream):
    def __init__(self, spec: OpenAIModelSpec, metrics: Metrics | None = None,
                 counter: TokenCounter | None = None) -> None:
        self.base_url = spec.base_url.rstrip("/")
        super().__init__(spec.name, spec, metrics, self.base_url, bearer(spec.api_key_env))
        self.spec: OpenAIModelSpec = spec
        self.counter = counter or TokenCounter.for_model(spec.model or spec.name, spec.tokenizer)

    def __repr__(self) -> str:          # never print the key
        return f"OpenAIBackend({self.name!r}, {self.base_url!r})"

    def count_tokens(self, req: GenRequest) -> TokenCount:
        return self.counter.count_prompt(req.messages if req.kind == "chat" else None, req.prompt)

    def _body(self, req: GenRequest) -> tuple[str, dict[str, Any]]:
        p = dict(req.params)
        body: dict[str, Any] = {"model": self.spec.model, "stream": True,
                                "stream_options": {"include_usage": True}}
        if req.kind == "chat":
            body["messages"] = _unmarked(req.messages or [])
            if p.pop("logprobs", None):
                body["logprobs"] = True
                body["top_logprobs"] = p.pop("top_logprobs", 0)
            for k in ("tool_choice", "response_format"):
                if getattr(req, k) is not None:
                    body[k] = getattr(req, k)
            if req.tools is not None:
                body["tools"] = _unmarked(req.tools)
            path = "/chat/completions"
        else:
            body["prompt"] = req.prompt
            if p.pop("logprobs", None):
                body["logprobs"] = p.pop("top_logprobs", 0)
            path = "/completions"
        p.pop("top_logprobs", None)
        p.pop("speculative", None)      # tokenomy's own engine setting: an upstream decides its own speculation
        body.update(p)                  # n, best_of and prediction pass through as the client sent them
        if (p.get("best_of") or 0) > (p.get("n") or 1):
            body["stream"] = False      # OpenAI streams no best_of: its whole answer comes back (_whole)
            del body["stream_options"]
        return path, body

    def stream(self, req: GenRequest) -> AsyncIterator[Delta]:
        """The answer's deltas; a traced request's call is a CLIENT span whose traceparent the upstream gets."""
        return trace.client_stream(req.trace, lambda headers: self._stream(req, headers), req, "openai",
                                   self.spec.model or self.name, self.base_url)

    async def _stream(self, req: GenRequest, headers: dict[str, str] | None) -> AsyncIterator[Delta]:
        t0 = time.perf_counter()
        path, body = self._body(req)
        resp = await self.send(path, body, headers)
        if "application/json" in resp.headers.get("content-type", ""):
            # some OpenAI-compatible servers answer a streamed request with the whole completion
            async for d in self._whole(resp, req, t0):
                yield d
            return
        usage: Usage | None = None
        finishes: dict[int, str] = {}       # each choice's finish_reason, by index (sent at the end, with usage)
        stops: dict[int, str | None] = {}   # ... and the stop string that ended it, where the server says
        ttft: float | None = None
        text_parts: list[str] = []
        n_chunks = 0
        sum_lp, min_lp, n_lp = 0.0, 0.0, 0
        try:
            done = False
            async for data in sse_data(resp):
                # After [DONE], read on to the end of the body instead of breaking: closing a response that
                # is not fully read drops its connection, and every request would then open a new one.
                if done:
                    continue
                if data == b"[DONE]":
                    done = True
                    continue
                try:
                    chunk = json.loads(data)
                except json.JSONDecodeError as e:
                    raise BackendError(f"{self.name} sent a malformed stream chunk") from e
                if "error" in chunk:
                    raise BackendError(f"{self.name} stream error: {error_message(json.dumps(chunk))}", status=502)
                if chunk.get("usage"):
                    usage = _usage(chunk["usage"])
                for choice in chunk.get("choices") or []:
                    index = int(choice.get("index") or 0)
                    delta = choice.get("delta") if req.kind == "chat" else None
                    text = (delta or {}).get("content") if delta is not None else choice.get("text")
                    tool_calls = (delta or {}).get("tool_calls")
                    lps = _logprobs(choice.get("logprobs"), req.kind)
                    for e in lps:
                        lp = e.get("logprob")
                        if isinstance(lp, (int, float)):
                            sum_lp, min_lp, n_lp = sum_lp + lp, min(min_lp, lp), n_lp + 1
                    if choice.get("finish_reason"):
                        finishes[index] = choice["finish_reason"]
                        stops[index] = _stop_string(choice)
                    if text or tool_calls or lps:
                        if ttft is None:
                            ttft = time.perf_counter() - t0
                        text_parts.append(text or "")
                        n_chunks += 1
                        conf = [e["logprob"] for e in lps if isinstance(e.get("logprob"), (int, float))]
                        yield Delta(text=text or "", logprobs=lps, tool_calls=tool_calls, confidence=conf,
                                    index=index)
        except httpx.HTTPError as e:
            raise self.lost(e) from e
        finally:
            await resp.aclose()
        if not finishes:
            raise BackendError(f"{self.name} ended the stream without a finish_reason", status=502)
        if usage is None:
            completion = self.counter.count_text("".join(text_parts)).tokens if text_parts else 0
            usage = Usage(prompt_tokens=self.count_tokens(req).tokens, completion_tokens=completion,
                          counted=True)
        usage.e2e_s = time.perf_counter() - t0
        usage.ttft_s = ttft
        if n_lp:
            usage.mean_logprob, usage.min_logprob = sum_lp / n_lp, min_lp
        *rest, last = sorted(finishes)
        for index in rest:
            yield Delta(finish_reason=finishes[index], index=index, stop_sequence=stops.get(index))
        yield Delta(finish_reason=finishes[last], usage=usage, index=last, stop_sequence=stops.get(last))

    async def _whole(self, resp: httpx.Response, req: GenRequest, t0: float) -> AsyncIterator[Delta]:
        """A complete (non-streamed) completion body: each choice as one delta and its final one."""
        try:
            data = json.loads(await resp.aread())
        except (json.JSONDecodeError, httpx.HTTPError) as e:
            raise BackendError(f"{self.name} sent an unreadable answer: {e}") from e
        finally:
            await resp.aclose()
        choices = sorted(data.get("choices") or [{}], key=lambda c: int(c.get("index") or 0))
        if not all(c.get("finish_reason") for c in choices):
            raise BackendError(f"{self.name} answered without a finish_reason", status=502)
        texts = [((c.get("message") or {}).get("content") if req.kind == "chat" else c.get("text")) or ""
                 for c in choices]
        u = data.get("usage")
        if u:
            usage = _usage(u)
        else:
            text = "".join(texts)
            usage = Usage(prompt_tokens=self.count_tokens(req).tokens,
                          completion_tokens=self.counter.count_text(text).tokens if text else 0, counted=True)
        usage.e2e_s = usage.ttft_s = time.perf_counter() - t0
        for k, (choice, text) in enumerate(zip(choices, texts, strict=True)):
            calls = (choice.get("message") or {}).get("tool_calls")
            if text or calls:
                yield Delta(text=text, tool_calls=[dict(c, index=i) for i, c in enumerate(calls)] if calls else None,
                            index=k)
            yield Delta(finish_reason=choice["finish_reason"], usage=usage if k == len(choices) - 1 else None,
                        index=k, stop_sequence=_stop_string(choice))

    async def embed(self, req: GenRequest) -> Embeddings:
        """The upstream's /embeddings for `req.inputs`, asked in the client's encoding_format (so a server that
        does not know base64 is asked in floats by clients that ask in floats) with its dimensions and user;
        vectors in either encoding come back as float32 rows. Without usage from the upstream, the texts' tokens
        are counted here and the usage marked `counted`. A traced request's call is a CLIENT span."""
        return await trace.client_call(req.trace, lambda headers: self._embed(req, headers), req, "openai",
                                       self.spec.model or self.name, self.base_url)

    async def _embed(self, req: GenRequest, headers: dict[str, str] | None) -> Embeddings:
        t0 = time.perf_counter()
        inputs = req.inputs or []
        body: dict[str, Any] = {"model": self.spec.model, "input": inputs,
                                "encoding_format": req.params.get("encoding_format", "float")}
        if req.params.get("dimensions") is not None:
            body["dimensions"] = req.params["dimensions"]
        if req.user is not None:
            body["user"] = req.user
        resp = await self.send("/embeddings", body, headers)
        try:
            data = json.loads(await resp.aread())
        except (json.JSONDecodeError, httpx.HTTPError) as e:
            raise BackendError(f"{self.name} sent an unreadable embeddings answer: {type(e).__name__}") from e
        finally:
            await resp.aclose()
        vectors = self._vectors(data, len(inputs))
        u = data.get("usage") if isinstance(data, dict) else None
        if isinstance(u, dict) and isinstance(u.get("prompt_tokens"), int):
            usage = Usage(prompt_tokens=u["prompt_tokens"])
        else:
            usage = Usage(prompt_tokens=sum(len(x) if isinstance(x, list) else self.counter.count_text(x).tokens
                                            for x in inputs), counted=True)
        usage.e2e_s = time.perf_counter() - t0
        return Embeddings(vectors, usage)

    def _vectors(self, data: Any, n: int) -> np.ndarray:
        """The rows of an embeddings answer, by their `index`: a float list or base64 of little-endian float32."""
        items = data.get("data") if isinstance(data, dict) else None
        try:
            if not isinstance(items, list) or len(items) != n:
                raise ValueError("not one item per input")
            rows: list[Any] = [None] * n
            for pos, item in enumerate(items):
                v = item["embedding"]
                rows[item.get("index", pos)] = (np.frombuffer(base64.b64decode(v, validate=True), dtype="<f4")
                                                if isinstance(v, str) else np.asarray(v, dtype=np.float32))
            out = np.stack(rows).astype(np.float32, copy=False)
            if out.ndim != 2 or not np.isfinite(out).all():
                raise ValueError("not finite vectors")
        except (KeyError, TypeError, ValueError, IndexError, binascii.Error):
            raise BackendError(f"{self.name} answered embeddings that are not {n} vectors of one length",
                               status=502) from None
        return out


def _unmarked(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Messages or tools without tokenomy's prompt-cache markers (`cache_control`, which a Messages client sets
    and OpenAI's API does not know); the list itself when none has one."""
    if not any("cache_control" in x for x in items):
        return items
    return [{k: v for k, v in x.items() if k != "cache_control"} for x in items]


def _stop_string(choice: dict[str, Any]) -> str | None:
    """The stop string that ended a choice, where the server says (vLLM's `stop_reason`; OpenAI does not say)."""
    reason = choice.get("stop_reason")
    return reason if choice.get("finish_reason") == "stop" and isinstance(reason, str) else None


def _usage(u: dict[str, Any]) -> Usage:
    """An upstream's usage object: tokens, cached prompt tokens, and a prediction's accepted and rejected tokens."""
    cached = (u.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
    details = u.get("completion_tokens_details") or {}
    return Usage(prompt_tokens=u.get("prompt_tokens", 0), completion_tokens=u.get("completion_tokens", 0),
                 cached_tokens=cached, accepted_prediction_tokens=details.get("accepted_prediction_tokens"),
                 rejected_prediction_tokens=details.get("rejected_prediction_tokens"))


def _logprobs(lp: Any, kind: str) -> list[dict[str, Any]]:
    if not lp:
        return []
    if kind == "chat":
        return list(lp.get("content") or [])
    out = []
    for tok, val, top in zip(lp.get("tokens") or [], lp.get("token_logprobs") or [],
                             lp.get("top_logprobs") or [], strict=False):
        out.append({"token": tok, "logprob": val,
                    "top_logprobs": [{"token": t, "logprob": v} for t, v in (top or {}).items()]})
    return out
