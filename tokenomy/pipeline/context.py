"""Context stage: exact prompt token count with the target model's tokenizer, checked against the route's
context budget. Over-budget requests are flagged; with `enforce: true` they are refused (400 with the numbers)."""

from __future__ import annotations

from collections.abc import Callable

from tokenomy.backends.base import InvalidRequest
from tokenomy.config import RouteSpec
from tokenomy.context.tokens import TokenCount
from tokenomy.errors import APIError
from tokenomy.pipeline.chain import Next
from tokenomy.pipeline.request import RequestContext

Counter = Callable[[str, RequestContext], TokenCount]


class Context:
    name = "context"

    def __init__(self, count: Counter, routes: dict[str, RouteSpec]) -> None:
        self.count = count
        self.routes = routes

    async def __call__(self, ctx: RequestContext, call_next: Next) -> None:
        route = self.routes.get(ctx.gen.model)
        target = route.models[0] if route is not None else ctx.gen.model
        try:
            tc = self.count(target, ctx)
        except KeyError:            # unknown model: the route stage answers 404
            await call_next(ctx)
            return
        except InvalidRequest as e:
            raise APIError(400, str(e), param=e.param, code=e.code) from e
        ctx.prompt_tokens, ctx.prompt_tokens_exact = tc.tokens, tc.exact
        if route is not None and route.context_budget is not None and tc.tokens > route.context_budget:
            ctx.over_budget = True
            if route.enforce:
                kind = "" if tc.exact else " (estimated)"
                raise APIError(400, f"The prompt is {tc.tokens} tokens{kind}; route '{ctx.gen.model}' allows "
                               f"{route.context_budget}.", param="messages", code="context_budget_exceeded")
        await call_next(ctx)
