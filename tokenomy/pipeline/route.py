"""Route stage: pick the cheapest model that will do, and say why.

A request names a model (pinned) or a route. A route lists candidate models cheapest first; its strategies compose
in this order:
- `rules`: the first matching rule picks the model;
- `classifier`: a learned probability that the cheaper model is good enough, against a calibrated threshold; a
  router file with two heads decides with its contextual-embedding head when the semantic cache has already
  embedded the prompt (the vector is in the request's memo), else with its static-embedding head;
- `load`: when the preferred model's expected queue wait exceeds the route's SLO, the most capable cheaper model
  within the SLO serves (alone, `load` prefers the most capable model);
- `cascade`: the chosen model answers first; the answer is escalated up the list when a confidence signal fails;
- `fixed`: the first healthy model;
- `token`: the first model writes and the second takes over for the tokens the first is unsure of: the route's
  TokenRouter (router/token_routing.py, whose docstring maps a token-routed request) serves the first model's
  turn in the generate stage. Tools and response_format need one model's grammar: those requests are served
  whole by the second model.
Failures of a model fall back to the next candidate in the generate stage.

Cascade and streams: a streamed answer is judged on its first `stream_buffer_tokens` tokens (or all of it, if it
ends sooner) before the first byte reaches the client; escalation happens only then. The cost is TTFT: the client
sees nothing until the buffer is judged. Signals that need the whole answer (JSON validity, truncation) are only
judged when the answer ends inside the buffer.
"""

from __future__ import annotations

import asyncio
import copy
import logging
from collections.abc import AsyncIterator, Callable, Collection
from typing import Any

from tokenomy.config import RouteSpec
from tokenomy.errors import APIError
from tokenomy.generation import Delta, last_user_text
from tokenomy.pipeline.chain import Next
from tokenomy.pipeline.request import RequestContext, RouteDecision
from tokenomy.router.cascade import Verdict, judge
from tokenomy.router.rules import first_match
from tokenomy.router.token_routing import TokenRouter, observer

log = logging.getLogger("tokenomy.route")


class Route:
    name = "route"

    def __init__(self, models: list[str], routes: dict[str, RouteSpec], expected_wait: Callable[[str], float]
                 | None = None, metrics: Any = None, backends: Any = None,
                 embedding_models: Collection[str] = ()) -> None:
        """`metrics`: the gateway's meter.metrics.Metrics, which counts decisions, escalations and token routes
        (None: not counted); `backends`: the backends by model name (backends/deployments.py), which token routes
        route between; `embedding_models`: names that only embed (the packaged MiniLM), refused with a 400."""
        self.models = models
        self.embedding_models = embedding_models
        self.routes = routes
        self.expected_wait = expected_wait or (lambda _: 0.0)
        self.metrics = metrics
        self.backends = backends
        self._classifiers: dict[str, Any] = {}
        self._token_routers: dict[str, tuple[RouteSpec, TokenRouter]] = {}

    def with_routes(self, routes: dict[str, RouteSpec], models: list[str] | None = None) -> Route:
        """This stage over other routes (a config reload) and, when given, other models (one added while serving):
        a new stage sharing this one's classifiers and token routers (a token router is rebuilt when its route's
        spec changed)."""
        other = copy.copy(self)
        other.routes = routes
        if models is not None:
            other.models = models
        return other

    async def __call__(self, ctx: RequestContext, call_next: Next) -> None:
        asked = ctx.gen.model
        if asked in self.models and asked not in self.routes:
            ctx.candidates = [asked]
            ctx.route_reason = "pinned model"
            ctx.route_decision = RouteDecision(candidates=[asked], chosen=asked, by="pinned")
            await call_next(ctx)
            return
        spec = self.routes.get(asked)
        if spec is None and asked in self.embedding_models:
            raise APIError(400, f"'{asked}' is an embedding model: it does not generate text. Ask it at "
                           "POST /v1/embeddings.", param="model", code="not_a_generation_model")
        if spec is None:
            allowed = ctx.allowed_models    # a key with an allow-list learns only its own names
            known = ", ".join(n for n in self.models + list(self.routes) if allowed is None or n in allowed)
            raise APIError(404, f"The model '{asked}' does not exist. Available: {known}.", param="model",
                           code="model_not_found")
        ctx.route = asked
        if "classifier" in spec.strategies:   # may embed the prompt (milliseconds): off the event loop
            ladder, by, signals = await asyncio.to_thread(self.choose, spec, ctx)
        else:
            ladder, by, signals = self.choose(spec, ctx)
        decision = RouteDecision(candidates=list(spec.models), chosen=ladder[0], by=by, route=asked,
                                 strategies=list(spec.strategies), signals=signals)
        ctx.route_decision = decision
        ctx.route_reason = f"route {asked}: {by}"
        if self.metrics is not None:
            self.metrics.route_decisions.labels(asked, ladder[0], by.split(" ")[0]).inc()
        if "token" in spec.strategies:
            self._token(ctx, spec, decision)
            await call_next(ctx)
        elif "cascade" in spec.strategies and len(ladder) > 1:
            await self._cascade(ctx, call_next, spec, ladder, decision)
        else:
            ctx.candidates = ladder
            await call_next(ctx)
        decision.served = ctx.model

    # ---- choosing the first model ------------------------------------------------------------------------
    def choose(self, spec: RouteSpec, ctx: RequestContext) -> tuple[list[str], str, dict[str, Any]]:
        """The ladder (chosen model first, then the more capable ones for fallback/escalation), why, signals."""
        models = list(spec.models)
        start, by, signals = 0, "fixed: first healthy", {}
        s = spec.strategies
        gen = ctx.gen
        text = (last_user_text(gen.messages, final=False) if gen.messages else None) or gen.prompt or ""
        if "rules" in s:
            meta = {k.removeprefix("x-tokenomy-meta-"): v for k, v in ctx.headers.items()
                    if k.startswith("x-tokenomy-meta-")}
            hit = first_match(spec.rules, prompt_tokens=ctx.prompt_tokens, text=text, has_tools=bool(gen.tools),
                              has_response_format=bool(gen.response_format), tenant=ctx.tenant, metadata=meta)
            if hit is not None:
                model, i = hit
                signals["rule"] = i
                ladder = [model] + [m for m in models if m != model]
                return ladder, f"rules: rule {i} matched", signals
        if "classifier" in s and spec.classifier is not None:
            # The contextual head when the prompt's contextual vector is already at hand (the semantic cache's
            # lookup computed it), else the static one: the better head wherever its cost is already paid.
            head = self._classifier(spec.classifier.path).head_for(text in ctx.vectors)
            pred = head.predict(text, self._vector(ctx, head, text), spec.classifier.threshold)
            p, threshold = pred.probability, pred.threshold
            signals.update(p_cheap_ok=round(p, 4), threshold=round(threshold, 4), head=head.embedding)
            start = 0 if pred.model == head.weak else len(models) - 1
            by = f"classifier: p={p:.4f} {'>=' if start == 0 else '<'} {threshold:.4f} ({head.embedding} head)"
        if "load" in s:
            if not {"rules", "classifier"} & set(s):
                start = len(models) - 1           # load alone: prefer the most capable, shed to cheaper ones
                by = f"load: {models[start]} within SLO"
            wait = self.expected_wait(models[start])
            signals["expected_wait_s"] = round(wait, 3)
            if wait > spec.load.slo_queue_s and start > 0:
                cheaper = [i for i in range(start) if self.expected_wait(models[i]) <= spec.load.slo_queue_s]
                if cheaper:
                    by = f"load: {models[start]} wait {wait:.2f}s > SLO {spec.load.slo_queue_s}s"
                    start = cheaper[-1]
        if "token" in s:
            by = "token: small model writes"
        if "cascade" in s and by.startswith("fixed"):
            by = "cascade: cheapest first"
        return models[start:] + models[:start], by, signals

    def _token(self, ctx: RequestContext, spec: RouteSpec, decision: RouteDecision) -> None:
        small, large = spec.models
        gen = ctx.gen
        if gen.tools or gen.response_format:
            ctx.candidates = [large]
            decision.chosen, decision.by = large, "token: structured output served by the large model"
        elif (gen.params.get("n") or 1) > 1 or "best_of" in gen.params:
            ctx.candidates = [large]          # a token route writes one answer: several choices go to the large model
            decision.chosen, decision.by = large, "token: several choices served by the large model"
        else:
            ctx.token_router = self._token_router(ctx.route or "", spec)
            ctx.candidates = [small, large]     # the small model failing: the large serves whole
            decision.by = f"token: {spec.token.signal} < {spec.token.threshold:g} hands over to {large}"
        ctx.route_reason = f"route {ctx.route}: {decision.by}"

    def _token_router(self, route: str, spec: RouteSpec) -> TokenRouter:
        """The route's TokenRouter over its two models' backends: built on the route's first token-routed
        request, and again when a config reload gives the route a new spec."""
        built = self._token_routers.get(route)
        if built is None or built[0] is not spec:
            assert self.backends is not None, "a token route needs the backends it routes between"
            small, large = (self.backends.get(m) for m in spec.models)
            done = observer(self.metrics, route, small.name, large.name) if self.metrics is not None else None
            built = self._token_routers[route] = (spec, TokenRouter(small, large, spec.token, on_done=done))
        return built[1]

    @staticmethod
    def _vector(ctx: RequestContext, classifier: Any, text: str) -> Any:
        """The contextual MiniLM vector of `text` for a classifier trained on it, shared through the request's memo
        with the semantic cache (which may have embedded it for its lookup, or will for its add); None lets a
        classifier on another embedding compute its own."""
        if classifier.embedding != "minilm":
            return None
        if text not in ctx.vectors:
            ctx.vectors[text] = classifier.embed([text])[0]
        return ctx.vectors[text]

    def _classifier(self, path: str) -> Any:
        """The router file at `path` (tokenomy.router.classifier.TrainedRouter: one head or two), loaded once."""
        if path not in self._classifiers:
            from tokenomy.router.classifier import TrainedRouter

            self._classifiers[path] = TrainedRouter.load(path)
        return self._classifiers[path]

    # ---- cascade ------------------------------------------------------------------------------------------
    async def _cascade(self, ctx: RequestContext, call_next: Next, spec: RouteSpec, ladder: list[str],
                       decision: RouteDecision) -> None:
        for i, model in enumerate(ladder):
            last = i == len(ladder) - 1
            ctx.candidates = ladder[i:]           # errors still fall back up the ladder
            ctx.result, ctx.deltas, ctx.usage, ctx.finish_reason, ctx.text = None, None, None, None, ""
            await call_next(ctx)
            if last:
                return
            if ctx.stream:
                verdict, replay = await self._judge_stream(ctx, spec)
            else:
                r = ctx.result
                assert r is not None
                verdict = judge(r.text, r.confidence or _usage_logprobs(r.usage), r.finish_reason,
                                ctx.gen.response_format, spec.cascade)
                replay = None
            decision.signals[ctx.model or model] = verdict.signals
            if not verdict.escalate:
                if replay is not None:
                    ctx.deltas = replay
                return
            decision.escalations.append({"from": ctx.model, "reasons": verdict.reasons})
            ctx.route_reason += f"; escalated from {ctx.model} ({', '.join(verdict.reasons)})"
            ctx.escalations.append((ctx.model or model, ctx.usage))
            if self.metrics is not None:
                self.metrics.route_escalations.labels(ctx.route or "", ctx.model or model).inc()

    async def _judge_stream(self, ctx: RequestContext, spec: RouteSpec
                            ) -> tuple[Verdict, AsyncIterator[Delta] | None]:
        assert ctx.deltas is not None
        stream = ctx.deltas
        buffered: list[Delta] = []
        conf: list[float] = []
        finished = False
        finish: str | None = None
        while len(conf) < spec.cascade.stream_buffer_tokens:      # judged on the first choice (n > 1: one of them)
            try:
                d = await anext(stream)
            except StopAsyncIteration:
                finished = True
                break
            buffered.append(d)
            if d.index == 0:
                conf += d.confidence or [0.0] * (1 if d.text else 0)
                finish = d.finish_reason or finish
            if d.last:
                finished = True
                break
            if finish is not None:
                break           # the first choice is complete (n > 1): judged while the others go on
        text = "".join(d.text for d in buffered if d.index == 0)
        verdict = judge(text, conf, finish, ctx.gen.response_format, spec.cascade,
                        complete=finished or finish is not None)
        if verdict.escalate:
            await stream.aclose()           # frees the cheap model's sequence at its next step
            return verdict, None

        async def replay() -> AsyncIterator[Delta]:
            try:
                for d in buffered:
                    yield d
                if not finished:
                    async for d in stream:
                        yield d
            finally:
                await stream.aclose()
        return verdict, replay()


def _usage_logprobs(usage: Any) -> list[float]:
    """Without per-token values, judge on the summary: mean and minimum as two pseudo-tokens."""
    if usage is None or usage.mean_logprob is None:
        return []
    n = max(usage.completion_tokens, 2)
    # Reconstruct a list whose mean and minimum equal the reported ones.
    rest = (usage.mean_logprob * n - usage.min_logprob) / (n - 1)
    return [usage.min_logprob] + [rest] * (n - 1)
