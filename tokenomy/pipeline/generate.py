"""Generate stage: ask the candidates in order; fall back to the next on a retryable failure.

Non-streamed requests can fall back at any point (nothing has reached the client). Streamed requests fall back
until their first delta exists; after that a failure ends the stream with an error event, never a silent cut.
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator

from tokenomy.backends.base import BackendError, Delta, InvalidRequest, Overloaded
from tokenomy.backends.registry import Registry
from tokenomy.errors import APIError
from tokenomy.pipeline.chain import Next
from tokenomy.pipeline.request import RequestContext, Result


class Generate:
    name = "generate"

    def __init__(self, registry: Registry) -> None:
        self.registry = registry

    async def __call__(self, ctx: RequestContext, call_next: Next) -> None:
        failures: list[str] = []
        overloaded: Overloaded | None = None
        for name in ctx.candidates:
            if self.registry.cooling(name):
                ctx.attempts.append({"model": name, "outcome": "cooling"})
                continue
            backend = self.registry.get(name)
            req = dataclasses.replace(ctx.gen, model=name, request_id=ctx.request_id)
            stream = backend.stream(req, **ctx.extras.get("backend_kwargs", {}))
            try:
                if ctx.stream:
                    first = await anext(stream)
                    ctx.deltas = _continue(first, stream, ctx)
                else:
                    ctx.result = await _collect(stream)
                    ctx.usage = ctx.result.usage
                    ctx.finish_reason = ctx.result.finish_reason
                    ctx.text = ctx.result.text
            except InvalidRequest as e:
                raise APIError(400, str(e), param=e.param, code=e.code) from e
            except Overloaded as e:
                ctx.attempts.append({"model": name, "outcome": "overloaded"})
                overloaded = e
                continue
            except BackendError as e:
                await stream.aclose()
                ctx.attempts.append({"model": name, "outcome": "error", "error": str(e)})
                failures.append(f"{name}: {e}")
                self.registry.failed(name)
                if not e.retryable:
                    raise APIError(e.status if 400 <= e.status < 500 else 502, str(e)) from e
                continue
            self.registry.succeeded(name)
            ctx.attempts.append({"model": name, "outcome": "ok"})
            ctx.model = name
            if len(ctx.attempts) > 1:
                ctx.route_reason += f"; fell back to {name}"
            await call_next(ctx)
            return
        if overloaded is not None and not failures:
            raise APIError(429, f"Server overloaded: {overloaded}. Retry later.", code="queue_full",
                           headers={"retry-after": str(max(1, int(overloaded.retry_after)))})
        detail = "; ".join(failures) or "all candidates are cooling down after failures"
        raise APIError(503, f"No backend could serve the request ({detail}).", code="no_backend")


async def _collect(stream: AsyncIterator[Delta]) -> Result:
    parts, lps, tool_calls, conf = [], [], None, []
    last = Delta()
    async for d in stream:
        parts.append(d.text)
        lps += d.logprobs
        conf += d.confidence
        if d.tool_calls:
            tool_calls = (tool_calls or []) + d.tool_calls
        last = d
    assert last.usage is not None and last.finish_reason is not None, "a backend stream ended without usage"
    return Result(text="".join(parts), finish_reason=last.finish_reason, usage=last.usage, logprobs=lps,
                  tool_calls=merge_tool_calls(tool_calls) if tool_calls else None, confidence=conf)


def merge_tool_calls(deltas: list[dict]) -> list[dict]:
    """Streamed tool_call deltas (OpenAI shape: index, then id/type/name once, then arguments fragments) ->
    whole calls."""
    calls: dict[int, dict] = {}
    for d in deltas:
        c = calls.setdefault(d.get("index", 0), {"id": None, "type": "function",
                                                 "function": {"name": "", "arguments": ""}})
        if d.get("id"):
            c["id"] = d["id"]
        fn = d.get("function") or {}
        if fn.get("name"):
            c["function"]["name"] = fn["name"]
        c["function"]["arguments"] += fn.get("arguments") or ""
    return [calls[i] for i in sorted(calls)]


async def _continue(first: Delta, rest: AsyncIterator[Delta], ctx: RequestContext) -> AsyncIterator[Delta]:
    """Replay the first delta, then the rest; a failure mid-stream becomes an error delta."""
    try:
        for d in (first,):
            yield _seen(d, ctx)
        if first.finish_reason is not None:
            return
        async for d in rest:
            yield _seen(d, ctx)
    except BackendError as e:
        ctx.finish_reason = "error"
        yield Delta(error=f"the upstream failed mid-stream: {e}", finish_reason="error")
    finally:
        await rest.aclose()


def _seen(d: Delta, ctx: RequestContext) -> Delta:
    ctx.text += d.text
    if d.usage is not None:
        ctx.usage = d.usage
    if d.finish_reason is not None:
        ctx.finish_reason = d.finish_reason
    return d
