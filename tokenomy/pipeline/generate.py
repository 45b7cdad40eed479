"""Generate stage: ask the candidates in order; fall back to the next on a retryable failure.

Non-streamed requests can fall back at any point (nothing has reached the client). Streamed requests fall back
until their first delta exists; after that a failure ends the stream with an error event, never a silent cut.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import AsyncIterator
from typing import Any

from tokenomy.backends.base import BackendError, InvalidRequest, Overloaded
from tokenomy.backends.registry import Registry
from tokenomy.errors import APIError
from tokenomy.generation import Delta, Usage
from tokenomy.pipeline.chain import Next
from tokenomy.pipeline.request import RequestContext, Result


class Generate:
    name = "generate"

    def __init__(self, registry: Registry, schema_policy: dict[str, str] | None = None, metrics: Any = None) -> None:
        self.registry = registry
        self.schema_policy = schema_policy or {}      # upstream model -> flag | repair
        self.metrics = metrics                        # meter.metrics.Metrics (None: nothing counted)

    async def __call__(self, ctx: RequestContext, call_next: Next) -> None:
        failures: list[str] = []
        overloaded: Overloaded | None = None
        retry_after: float | None = None     # the soonest a failed backend said it may serve again
        for name in ctx.candidates:
            if self.registry.cooling(name):
                ctx.attempts.append({"model": name, "outcome": "cooling"})
                continue
            backend = self.registry.get(name)
            if ctx.token_router is not None and name == ctx.token_router.name:
                backend = ctx.token_router      # the small model's turn of a token route (router/token_routing.py)
            if ctx.cover is not None:
                ctx.cover(name)       # a dearer fallback holds the difference first (pipeline/reserve.py)
            req = dataclasses.replace(ctx.gen, model=name, request_id=ctx.request_id, stream=ctx.stream,
                                      headers=ctx.headers)
            ctx.serving = name
            stream = backend.stream(req)
            try:
                if ctx.stream:
                    first = await anext(stream)
                    ctx.deltas = _continue(first, stream, ctx)
                else:
                    ctx.result = await _collect(stream)
                    if name in self.schema_policy:
                        ctx.result = await self._check_schema(ctx, name, backend, req, ctx.result)
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
                if not e.retryable:   # this request's failure, not the deployment's: it never counts
                    raise APIError(e.status if 400 <= e.status < 500 else 502, str(e)) from e
                if e.retry_after is not None:
                    retry_after = min(retry_after or e.retry_after, e.retry_after)
                self.registry.failed(name)
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
        headers = {"retry-after": str(max(1, round(retry_after)))} if retry_after is not None else {}
        raise APIError(503, f"No backend could serve the request ({detail}).", code="no_backend", headers=headers)


    async def _check_schema(self, ctx: RequestContext, name: str, backend: Any, req: Any, result: Result) -> Result:
        """Upstreams are not constrained: validate their answer, then flag it or make one bounded repair."""
        problem = schema_problem(req, result)
        if problem is None:
            return result
        policy = self.schema_policy[name]
        if policy == "repair" and req.kind == "chat":
            fix = dataclasses.replace(req, messages=list(req.messages or []) + [
                {"role": "assistant", "content": result.text},
                {"role": "user", "content": f"That answer is invalid: {problem}. Reply again with only the "
                                            "corrected answer."}])
            repaired = await _collect(backend.stream(fix))
            ctx.escalations.append((name, result.usage))   # the first try is paid
            if schema_problem(req, repaired) is None:
                if self.metrics is not None:
                    self.metrics.schema_invalid.labels(name, "repaired").inc()
                ctx.response_headers["x-tokenomy-schema"] = "repaired"
                return repaired
            result, problem = repaired, schema_problem(req, repaired)
        if self.metrics is not None:
            self.metrics.schema_invalid.labels(name, "flagged").inc()
        ctx.response_headers["x-tokenomy-schema"] = "invalid"
        ctx.schema_problem = problem
        return result


def schema_problem(req: Any, result: Result) -> str | None:
    """Why an answer breaks the request's response_format / tools, or None."""
    from tokenomy.structured import SchemaError, output_format
    from tokenomy.structured.validate import validate, validate_tool_calls

    try:
        fmt = output_format(req.response_format, req.tools, req.tool_choice)
    except SchemaError:
        return None
    if fmt is None:
        return None
    if result.tool_calls:
        v = validate_tool_calls(result.tool_calls, fmt.tools)
    elif not fmt.may_answer:
        return "a tool call was required"
    elif fmt.schema is not None:
        v = validate(result.text, fmt.schema)
    elif fmt.kind == "json_object":
        try:
            ok = isinstance(json.loads(result.text), dict)
        except json.JSONDecodeError:
            ok = False
        return None if ok else "not a JSON object"
    else:
        return None
    return None if v.ok else "; ".join(v.errors)[:300]


async def _collect(stream: AsyncIterator[Delta]) -> Result:
    """The whole answer of a backend's deltas: one Result, with every choice in `choices` when there are several."""
    parts: dict[int, Result] = {}
    tool_calls: dict[int, list[dict]] = {}
    last = Delta()
    async for d in stream:
        r = parts.setdefault(d.index, Result(text="", finish_reason="", usage=Usage()))
        r.text += d.text
        r.logprobs += d.logprobs
        r.confidence += d.confidence
        if d.tool_calls:
            tool_calls.setdefault(d.index, []).extend(d.tool_calls)
        if d.finish_reason is not None:
            r.finish_reason, r.stop_sequence = d.finish_reason, d.stop_sequence
        last = d
    assert last.usage is not None and last.finish_reason is not None, "a backend stream ended without usage"
    choices = [parts[i] for i in sorted(parts)]
    for i, r in zip(sorted(parts), choices, strict=True):
        r.usage, r.finish_reason = last.usage, r.finish_reason or last.finish_reason
        r.tool_calls = merge_tool_calls(tool_calls[i]) if i in tool_calls else None
    return dataclasses.replace(choices[0], choices=choices) if len(choices) > 1 else choices[0]


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
        if first.last:
            return
        async for d in rest:
            yield _seen(d, ctx)
    except BackendError as e:
        ctx.finish_reason = "error"
        ctx.stream_error = f"the upstream failed mid-stream: {e}"
        yield Delta(error=ctx.stream_error, finish_reason="error")
    finally:
        await rest.aclose()


def _seen(d: Delta, ctx: RequestContext) -> Delta:
    if d.index == 0:      # the text the answer's checks read: the first choice's (n > 1 streams the others past it)
        ctx.text += d.text
    # tokens delivered so far, for billing a stream the client cuts short: exact where the backend reports each
    # token's logprob, else one per chunk with text (upstreams send about one token a chunk)
    ctx.seen_tokens += len(d.confidence) or (1 if d.text else 0)
    if d.usage is not None:
        ctx.usage = d.usage
    if d.finish_reason is not None:
        ctx.finish_reason = d.finish_reason
    return d
