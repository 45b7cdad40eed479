"""Generate stage: ask the candidates in order; fall back to the next on a retryable failure.

Non-streamed requests can fall back at any point (nothing has reached the client). Streamed requests fall back
until their first delta exists; after that a failure ends the stream with an error event, never a silent cut.
What falls back: a BackendError that is `retryable` (an upstream busy, failing, unreachable or misconfigured:
backends/upstream.py) and Overloaded (the engine's queue). What does not: InvalidRequest (the client's request,
refused with its own status: 400, or an upstream's 413 or 422). When no candidate serves, the client gets a 503
`no_backend` with the soonest Retry-After any candidate gave, or a 502 when every candidate's deployment is
misconfigured (`lasting`: waiting will not mend it); only the engine's full queue alone is a 429 `queue_full`.

A `json_schema` response_format with `strict: true` is a promise: every answer the client gets parses and validates
against the schema (formats checked, every choice), or the request ends with a 422 `schema_unsatisfied` that
says why (the validator's errors, or the cut at max_tokens before the JSON closed); a stream ends with that error
event in place of its finish (a strict stream whose grammar leaves keywords out is collected first, so that it
can be repaired too, then sent). A finished answer that does not validate gets one repair first (its errors fed
back, as an upstream's `schema_policy: repair`); a cut one does not, since the same max_tokens would cut it again.
The tokens generated are billed all the same. A grammar that leaves out part of its schema (`OutputFormat.relaxed`:
keywords llguidance cannot enforce) makes even an embedded answer checkable: strict ones as above, others flagged
when they break the schema.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import AsyncIterator, Callable
from typing import Any

from tokenomy.backends.base import BackendError, InvalidRequest, Overloaded
from tokenomy.backends.deployments import Registry
from tokenomy.errors import APIError
from tokenomy.generation import Delta, Usage
from tokenomy.pipeline.chain import Next
from tokenomy.pipeline.request import RequestContext, Result


class Generate:
    name = "generate"

    def __init__(self, registry: Registry, schema_policy: dict[str, str] | None = None, metrics: Any = None,
                 defaults: dict[str, dict[str, Any]] | None = None,
                 window: Callable[[str], int | None] | None = None) -> None:
        """`defaults`: model -> the sampling its requests get where they set none (models[].defaults), a default
        max_tokens cut to what the model's `window` leaves after the prompt."""
        self.registry = registry
        self.defaults = defaults or {}
        self.window = window
        self.schema_policy = schema_policy or {}      # upstream model -> flag | repair
        self.metrics = metrics                        # meter.metrics.Metrics (None: nothing counted)

    def _params(self, ctx: RequestContext, name: str) -> dict[str, Any]:
        """The request's sampling over `name`'s defaults."""
        defaults = self.defaults.get(name)
        if not defaults:
            return ctx.gen.params
        params = {**defaults, **ctx.gen.params}
        window = self.window(name) if self.window is not None else None
        if "max_tokens" in defaults and "max_tokens" not in ctx.gen.params and window and ctx.prompt_tokens:
            params["max_tokens"] = max(min(params["max_tokens"], window - ctx.prompt_tokens), 1)
        return params

    async def __call__(self, ctx: RequestContext, call_next: Next) -> None:
        failures: list[str] = []
        overloaded: Overloaded | None = None
        retry_after: float | None = None     # the soonest a failed backend said it may serve again
        lasting = True                       # every failure so far is a misconfigured deployment
        for name in ctx.candidates:
            if self.registry.cooling(name):
                ctx.attempts.append({"model": name, "outcome": "cooling"})
                lasting = False
                continue
            backend = self.registry.get(name)
            if ctx.token_router is not None and name == ctx.token_router.name:
                backend = ctx.token_router      # the small model's turn of a token route (router/token_routing.py)
            if ctx.cover is not None:
                ctx.cover(ctx, name)  # a dearer fallback holds the difference first (pipeline/reserve.py)
            req = dataclasses.replace(ctx.gen, model=name, request_id=ctx.request_id, stream=ctx.stream,
                                      headers=ctx.headers, params=self._params(ctx, name))
            ctx.serving = name
            stream = backend.stream(req)
            try:
                strict = is_strict(req)
                # A strict stream whose grammar leaves keywords out is collected first, so that a broken answer
                # can still be repaired before anything is sent; it then goes out at once.
                held = ctx.stream and strict and relaxed_format(req)
                if ctx.stream and not held:
                    first = await anext(stream)
                    ctx.deltas = _continue(first, stream, ctx, req if strict else None)
                else:
                    result = await _collect(stream)
                    policy = "repair" if strict else self.schema_policy.get(name) or (
                        "flag" if relaxed_format(req) else None)
                    if policy is not None:
                        result = await self._check_schema(ctx, name, backend, req, result, policy)
                    problem = strict_problem(req, result) if strict else None
                    if held and problem is None:
                        replay = _deltas_of(result)
                        ctx.deltas = _continue(await anext(replay), replay, ctx)
                    else:
                        ctx.result = result
                        ctx.usage = result.usage
                        ctx.finish_reason = result.finish_reason
                        ctx.text = result.text
                    if problem is not None:
                        ctx.model = name
                        raise APIError(422, problem, param="response_format", code="schema_unsatisfied")
            except InvalidRequest as e:
                raise APIError(e.status, str(e), param=e.param, code=e.code) from e
            except Overloaded as e:
                ctx.attempts.append({"model": name, "outcome": "overloaded"})
                overloaded, lasting = e, False
                continue
            except BackendError as e:
                await stream.aclose()
                ctx.attempts.append({"model": name, "outcome": "error", "error": str(e)})
                failures.append(f"{name}: {e}")
                if not e.retryable:   # this request's failure, not the deployment's: it never counts
                    raise APIError(e.status if 400 <= e.status < 500 else 502, str(e)) from e
                if e.retry_after is not None:
                    retry_after = e.retry_after if retry_after is None else min(retry_after, e.retry_after)
                lasting = lasting and e.lasting
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
        if overloaded is not None:
            retry_after = overloaded.retry_after if retry_after is None else min(retry_after, overloaded.retry_after)
        detail = "; ".join(failures) or "all candidates are cooling down after failures"
        headers = {"retry-after": str(max(1, math.ceil(retry_after)))} if retry_after is not None else {}
        raise APIError(502 if failures and lasting else 503, f"No backend could serve the request ({detail}).",
                       code="no_backend", headers=headers)


    async def _check_schema(self, ctx: RequestContext, name: str, backend: Any, req: Any, result: Result,
                            policy: str) -> Result:
        """Validate an answer, each of its choices (n > 1) on its own (an upstream's is not constrained; a strict
        request's may be cut or break what the grammar does not enforce), then flag it or make one bounded repair
        of each broken choice (a choice of several is asked for alone: n = 1)."""
        choices = result.choices or [result]
        several = len(choices) > 1
        checked: list[Result] = []
        repaired = 0
        problems: list[str] = []
        for i, c in enumerate(choices):
            problem = schema_problem(req, c)
            if problem is not None and policy == "repair" and req.kind == "chat" and c.finish_reason != "length":
                params = {k: v for k, v in req.params.items() if k != "best_of"} if several else req.params
                fix = dataclasses.replace(req, messages=repair_messages(list(req.messages or []), c.text, problem),
                                          response_format=repair_format(req.response_format),
                                          params={**params, "n": 1} if several else params)
                again = await _collect(backend.stream(fix))
                if several:         # the choices' answer stands, billed; the repair is paid besides
                    ctx.escalations.append((name, again.usage))
                    again.usage = result.usage
                else:               # the first try is paid; the repair's answer is the one returned
                    ctx.escalations.append((name, c.usage))
                c, problem = again, schema_problem(req, again)
                repaired += problem is None
            if problem is not None:
                problems.append(f"choice {i}: {problem}" if several else problem)
            checked.append(c)
        if self.metrics is not None:
            for outcome, count in (("repaired", repaired), ("flagged", len(problems))):
                if count:
                    self.metrics.schema_invalid.labels(name, outcome).inc(count)
        if problems:
            ctx.response_headers["x-tokenomy-schema"] = "invalid"
            ctx.schema_problem = "; ".join(problems)[:300]
        elif repaired:
            ctx.response_headers["x-tokenomy-schema"] = "repaired"
        return dataclasses.replace(checked[0], choices=checked) if several else checked[0]


def repair_format(response_format: Any) -> Any:
    """The response_format a repair is made under: a json_schema's schema narrowed where a repeat would break it
    again (structured/normalize.narrow_for_repair); the answer is still checked against the request's own."""
    if not isinstance(response_format, dict) or response_format.get("type") != "json_schema":
        return response_format
    spec = response_format.get("json_schema")
    if not isinstance(spec, dict) or not isinstance(spec.get("schema"), dict):
        return response_format
    from tokenomy.structured.normalize import narrow_for_repair

    narrowed = narrow_for_repair(spec["schema"])
    return response_format if narrowed is None else {**response_format, "json_schema": {**spec, "schema": narrowed}}


def repair_messages(messages: list[dict], answer: str, problem: str) -> list[dict]:
    """The conversation of a schema repair: the invalid answer, then what is wrong with it."""
    return [*messages, {"role": "assistant", "content": answer},
            {"role": "user", "content": f"That answer is invalid: {problem}. Reply again with only the corrected "
                                        "answer."}]


def relaxed_format(req: Any) -> bool:
    """Whether the request's grammar leaves out part of its schema (structured/normalize.relax: uniqueItems, an
    overlapping oneOf...), so that even a constrained answer must be validated; a non-strict one is flagged."""
    if req.response_format is None and not req.tools:
        return False
    from tokenomy.structured import SchemaError, output_format

    try:
        fmt = output_format(req.response_format, req.tools, req.tool_choice)
    except SchemaError:
        return False
    return fmt is not None and bool(fmt.relaxed)


def is_strict(req: Any) -> bool:
    """Whether the request's response_format is a json_schema with strict: true."""
    rf = req.response_format
    return isinstance(rf, dict) and rf.get("type") == "json_schema" and isinstance(rf.get("json_schema"), dict) \
        and rf["json_schema"].get("strict") is True


def strict_problem(req: Any, result: Result) -> str | None:
    """Why a strict json_schema request's answer (each of its choices) cannot be returned, or None."""
    choices = result.choices or [result]
    for i, c in enumerate(choices):
        problem = answer_problem(req, c.text, c.finish_reason, c.tool_calls)
        if problem is not None:
            return (f"choice {i}: " if len(choices) > 1 else "") + problem
    return None


def answer_problem(req: Any, text: str, finish_reason: str | None, tool_calls: list[dict] | None = None,
                   ) -> str | None:
    """Why one finished answer to a strict json_schema request breaks its schema, in words for the client."""
    problem = schema_problem(req, Result(text=text, finish_reason=finish_reason or "", usage=Usage(),
                                         tool_calls=tool_calls))
    if problem is None:
        return None
    if finish_reason == "length":
        return (f"The answer was cut at max_tokens ({req.params.get('max_tokens')}) before its JSON was complete, "
                "so it cannot match the strict json_schema; raise max_tokens.")
    return f"The answer does not match the strict json_schema: {problem}."


def schema_problem(req: Any, result: Result) -> str | None:
    """Why an answer breaks the request's response_format / tools, or None."""
    if req.response_format is None and not req.tools:      # free text (output_format's None), found without it
        return None
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
    """Streamed tool_call deltas (OpenAI shape: index, then id/type/name once, then arguments fragments, or a
    custom call's input fragments) -> whole calls."""
    calls: dict[int, dict] = {}
    for d in deltas:
        if d.get("type") == "custom" or (d.get("custom") and d.get("index", 0) not in calls):
            calls[d.get("index", 0)] = {"id": None, "type": "custom", "custom": {"name": "", "input": ""}}
        c = calls.setdefault(d.get("index", 0), {"id": None, "type": "function",
                                                 "function": {"name": "", "arguments": ""}})
        if d.get("id"):
            c["id"] = d["id"]
        if c["type"] == "custom":       # a custom tool's call (structured/custom_tools.py): name, then input
            part = d.get("custom") or {}
            c["custom"]["name"] = part.get("name") or c["custom"]["name"]
            c["custom"]["input"] += part.get("input") or ""
            continue
        fn = d.get("function") or {}
        if fn.get("name"):
            c["function"]["name"] = fn["name"]
        c["function"]["arguments"] += fn.get("arguments") or ""
    return [calls[i] for i in sorted(calls)]


async def _deltas_of(result: Result) -> AsyncIterator[Delta]:
    """A collected answer as a stream: each choice's text, then each one's finish, the usage on the last."""
    choices = result.all_choices
    for i, c in enumerate(choices):
        calls = [{**call, "index": k} for k, call in enumerate(c.tool_calls)] if c.tool_calls else None
        yield Delta(text=c.text, logprobs=c.logprobs, confidence=c.confidence, tool_calls=calls, index=i)
    for i, c in enumerate(choices):
        yield Delta(finish_reason=c.finish_reason, stop_sequence=c.stop_sequence, index=i,
                    usage=result.usage if i == len(choices) - 1 else None)


async def _continue(first: Delta, rest: AsyncIterator[Delta], ctx: RequestContext,
                    strict: Any = None) -> AsyncIterator[Delta]:
    """Replay the first delta, then the rest; a failure mid-stream becomes an error delta. With `strict` (the
    request of a strict json_schema), each choice's finishing delta is checked before it goes out (every choice
    when n > 1): an answer that breaks its schema ends the stream with a schema_unsatisfied error delta instead of
    its finish."""
    async def deltas() -> AsyncIterator[Delta]:
        yield first
        if not first.last:
            async for d in rest:
                yield d

    texts: dict[int, str] = {}
    calls: dict[int, list[dict]] = {}
    try:
        async for d in deltas():
            if strict is not None and d.error is None:
                texts[d.index] = texts.get(d.index, "") + d.text
                if d.tool_calls:
                    calls.setdefault(d.index, []).extend(d.tool_calls)
                if d.finish_reason is not None or d.last:
                    _seen(d, ctx)
                    merged = merge_tool_calls(calls[d.index]) if d.index in calls else None
                    problem = answer_problem(strict, texts[d.index], d.finish_reason or ctx.finish_reason, merged)
                    if problem is not None:
                        if (strict.params.get("n") or 1) > 1:
                            problem = f"choice {d.index}: {problem}"
                        if d.text or d.tool_calls:
                            yield dataclasses.replace(d, finish_reason=None, usage=None)
                        ctx.finish_reason, ctx.stream_error = "error", problem
                        yield Delta(error=problem, error_code="schema_unsatisfied", finish_reason="error")
                        return
                    yield d
                    continue
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
