"""Embed stage: an embeddings request's model embeds all its inputs in one call.

It stands where context, cache, route and generate stand for a generation (gateway.py runs admit -> embed inside
record), since none of them applies: there is no prompt to budget or compact, no answer to cache, and a request
names its embedding model itself. A model is the packaged MiniLM or a configured OpenAI-compatible upstream; a
model that generates text, or a route, is refused with a 400 that names the embedding models, a name nobody
configured with a 404, as the route stage answers.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Collection, Mapping

from tokenomy.backends.base import BackendError, EmbeddingBackend, InvalidRequest, Overloaded
from tokenomy.backends.deployments import Registry
from tokenomy.errors import APIError
from tokenomy.pipeline.chain import Next
from tokenomy.pipeline.request import RequestContext


class Embed:
    name = "embed"

    def __init__(self, embedders: Mapping[str, EmbeddingBackend], registry: Registry, generators: Collection[str],
                 routes: Collection[str]) -> None:
        """`embedders`: the embedding models by name; `registry`: the configured models' backends (an upstream's
        failures count towards its cool-down as a generation's do); `generators`, `routes`: the other names a
        client may give, refused with a 400."""
        self.embedders = embedders
        self.registry = registry
        self.generators = generators
        self.routes = routes

    async def __call__(self, ctx: RequestContext, call_next: Next) -> None:
        name = ctx.gen.model
        backend = self.embedders.get(name)
        if backend is None:
            raise self._not_an_embedder(ctx, name)
        ctx.candidates, ctx.serving, ctx.route_reason = [name], name, "pinned model"
        ctx.cache_bypass = "embeddings are not cached"
        upstream = name in self.registry
        if upstream and self.registry.cooling(name):
            ctx.attempts.append({"model": name, "outcome": "cooling"})
            raise APIError(503, f"No backend could serve the request ({name} is cooling down after failures).",
                           code="no_backend")
        req = dataclasses.replace(ctx.gen, request_id=ctx.request_id, stream=False, headers=ctx.headers)
        try:
            out = await backend.embed(req)
        except InvalidRequest as e:
            raise APIError(e.status, str(e), param=e.param, code=e.code) from e
        except Overloaded as e:
            ctx.attempts.append({"model": name, "outcome": "overloaded"})
            raise APIError(429, f"Server overloaded: {e}. Retry later.", code="queue_full",
                           headers={"retry-after": str(max(1, int(e.retry_after)))}) from e
        except BackendError as e:
            ctx.attempts.append({"model": name, "outcome": "error", "error": str(e)})
            if not e.retryable:
                raise APIError(e.status if 400 <= e.status < 500 else 502, str(e)) from e
            if upstream:
                self.registry.failed(name)
            headers = {"retry-after": str(max(1, math.ceil(e.retry_after)))} if e.retry_after is not None else {}
            raise APIError(502 if e.lasting else 503, f"No backend could serve the request ({name}: {e}).",
                           code="no_backend", headers=headers) from e
        if upstream:
            self.registry.succeeded(name)
        ctx.attempts.append({"model": name, "outcome": "ok"})
        ctx.model, ctx.usage, ctx.embeddings = name, out.usage, out.vectors
        await call_next(ctx)

    def _not_an_embedder(self, ctx: RequestContext, name: str) -> APIError:
        allowed = ctx.allowed_models    # a key with an allow-list learns only its own names
        known = ", ".join(n for n in self.embedders if allowed is None or n in allowed) or "none"
        if name in self.generators or name in self.routes:
            what = "a route" if name in self.routes else "a model that generates text"
            return APIError(400, f"'{name}' is {what}, not an embedding model. Models that may embed: {known}.",
                            param="model", code="not_an_embedding_model")
        return APIError(404, f"The model '{name}' does not exist. Models that may embed: {known}.", param="model",
                        code="model_not_found")
