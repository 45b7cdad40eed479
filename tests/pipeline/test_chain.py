"""The chain itself: order, early endings, and a record for every request."""

from __future__ import annotations

import asyncio

import pytest

from tokenomy.config import RouteSpec
from tokenomy.context.tokens import TokenCount
from tokenomy.errors import APIError
from tokenomy.generation import GenRequest, Usage
from tokenomy.metrics.prometheus import Metrics
from tokenomy.pipeline.chain import Pipeline
from tokenomy.pipeline.context import Context
from tokenomy.pipeline.record import Record
from tokenomy.pipeline.request import RequestContext, Result
from tokenomy.pipeline.route import Route


class Tap:
    def __init__(self, name, log, end=False, fail=False):
        self.name, self.log, self.end, self.fail = name, log, end, fail

    async def __call__(self, ctx, call_next):
        self.log.append(self.name)
        if self.fail:
            raise APIError(429, "nope", code="x")
        if self.end:
            ctx.result = Result("cached", "stop", Usage())
            return
        await call_next(ctx)


def ctx(model="m"):
    return RequestContext(gen=GenRequest(model=model, messages=[{"role": "user", "content": "hi"}]))


def test_stages_run_in_order_and_can_end_early_with_record_still_running():
    log, seen = [], []
    p = Pipeline([Record(Metrics(), sinks=[seen.append]), Tap("admit", log), Tap("cache", log, end=True),
                  Tap("generate", log)])
    c = asyncio.run(p.run(ctx()))
    assert log == ["admit", "cache"] and c.result.text == "cached" and seen == [c]


def test_record_runs_for_errors_and_reraises():
    seen = []
    p = Pipeline([Record(Metrics(), sinks=[seen.append]), Tap("admit", [], fail=True)])
    with pytest.raises(APIError):
        asyncio.run(p.run(ctx()))
    assert seen and seen[0].status == 429


def test_a_broken_sink_never_breaks_the_request():
    def boom(_):
        raise RuntimeError("disk full")
    p = Pipeline([Record(Metrics(), sinks=[boom]), Tap("x", [], end=True)])
    assert asyncio.run(p.run(ctx())).result.text == "cached"


def test_route_resolves_models_and_routes_and_404s_the_rest():
    r = Route(["a", "b"], {"best": RouteSpec(models=["b", "a"])})
    c = ctx("best")
    asyncio.run(Pipeline([r]).run(c))
    assert c.candidates == ["b", "a"] and c.route == "best"
    with pytest.raises(APIError) as e:
        asyncio.run(Pipeline([r]).run(ctx("zzz")))
    assert e.value.status == 404 and e.value.code == "model_not_found"


def test_context_budget_flags_or_enforces():
    routes = {"soft": RouteSpec(models=["a"], context_budget=5),
              "hard": RouteSpec(models=["a"], context_budget=5, enforce=True)}
    stage = Context(lambda model, c: TokenCount(9, exact=True), routes)
    c = ctx("soft")
    asyncio.run(Pipeline([stage]).run(c))
    assert c.over_budget and c.prompt_tokens == 9
    with pytest.raises(APIError) as e:
        asyncio.run(Pipeline([stage]).run(ctx("hard")))
    assert e.value.status == 400 and "9 tokens" in e.value.message and "5" in e.value.message
