"""Route stage: turn the asked-for model or route name into an ordered list of candidate models."""

from __future__ import annotations

from tokenomy.config import RouteSpec
from tokenomy.errors import APIError
from tokenomy.pipeline.chain import Next
from tokenomy.pipeline.request import RequestContext


class Route:
    name = "route"

    def __init__(self, models: list[str], routes: dict[str, RouteSpec]) -> None:
        self.models = models
        self.routes = routes

    async def __call__(self, ctx: RequestContext, call_next: Next) -> None:
        asked = ctx.gen.model
        if asked in self.routes:
            ctx.route = asked
            ctx.candidates = list(self.routes[asked].models)
            ctx.route_reason = f"route {asked}: fixed, first healthy of {','.join(ctx.candidates)}"
        elif asked in self.models:
            ctx.candidates = [asked]
            ctx.route_reason = "pinned model"
        else:
            known = ", ".join(self.models + list(self.routes))
            raise APIError(404, f"The model '{asked}' does not exist. Available: {known}.", param="model",
                           code="model_not_found")
        await call_next(ctx)
