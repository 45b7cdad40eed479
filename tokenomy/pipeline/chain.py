"""The pipeline: an ordered chain of stages over one RequestContext (Starlette-middleware style).

Each stage is `async def __call__(ctx, call_next)`. A stage may end the request early by returning without
calling `call_next` (a cache hit does). Stages never import each other; the chain is built from config.
A traced request (`ctx.trace`, telemetry/trace.py) runs each stage in its span (`enter` ... `left`); a stage with
`traced = False` (the record stage, which makes its own) runs as it is, and one whose `traced` is a method runs in a
span only for the requests it says (the reserve stage: those it holds anything for).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Protocol

from tokenomy.pipeline.request import RequestContext

Next = Callable[[RequestContext], Awaitable[None]]


class Stage(Protocol):
    name: str

    async def __call__(self, ctx: RequestContext, call_next: Next) -> None: ...


class Pipeline:
    def __init__(self, stages: Sequence[Stage]) -> None:
        self.stages = list(stages)

    async def run(self, ctx: RequestContext) -> RequestContext:
        async def end(_: RequestContext) -> None:
            return None

        call: Next = end
        for stage in reversed(self.stages):
            call = _bind(stage, call)
        await call(ctx)
        return ctx


def _bind(stage: Stage, nxt: Next) -> Next:
    if not getattr(stage, "traced", True):
        async def run(ctx: RequestContext) -> None:
            await stage(ctx, nxt)
        return run

    wants = getattr(stage, "traced", None)
    if not callable(wants):
        wants = None

    async def traced(ctx: RequestContext) -> None:
        t = ctx.trace
        if t is None:
            await stage(ctx, nxt)
            return
        if wants is not None and not wants(ctx):
            t.handed(ctx)             # the stage before it handed on: its span ends here
            await stage(ctx, nxt)
            return
        span = t.enter(stage.name, ctx)
        try:
            await stage(ctx, nxt)
        except BaseException as e:
            t.left(span, ctx, e)
            raise
        t.left(span, ctx)
    return traced
