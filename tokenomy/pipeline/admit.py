"""Admit stage: the request's API key (limits/keys.py), its allow-list, and its key's rate windows
(limits/rate_windows.py). With no keys configured, every request is admitted as tenant "default".

The key is hashed and looked up once per request: the API layer that authenticated the request before reading its
body hands the KeyInfo on in `ctx.key`; a batch request (ctx.batch_id, set only by tokenomy/batch/) carries the key
id it was created with. Requests per minute count here; tokens per minute are held by the reserve stage and settled
by the record (`on_record`, a record sink).
"""

from __future__ import annotations

from tokenomy.errors import APIError
from tokenomy.limits.keys import Keyring
from tokenomy.limits.rate_windows import RateWindows
from tokenomy.pipeline.chain import Next
from tokenomy.pipeline.request import RequestContext


class Admit:
    name = "admit"

    def __init__(self, keyring: Keyring, windows: RateWindows) -> None:
        self.keyring, self.windows = keyring, windows

    async def __call__(self, ctx: RequestContext, call_next: Next) -> None:
        if self.keyring.enabled:
            info = (self.keyring.by_id(ctx.key_id) if ctx.batch_id is not None
                    else ctx.key or self.keyring.lookup(ctx.headers.get("authorization")))
            ctx.key, ctx.key_id, ctx.tenant = info, info.key_id, info.tenant
            if info.allowed is not None:
                ctx.allowed_models = info.allowed
                if ctx.gen.model not in info.allowed:
                    raise APIError(403, f"This key may not use the model '{ctx.gen.model}'. It may use: "
                                   f"{', '.join(sorted(info.allowed))}.", param="model", code="model_not_allowed")
            self.windows.admit(info, ctx.request_id)
        await call_next(ctx)         # budgets: the reserve stage holds the request's worst case or refuses it

    def on_record(self, ctx: RequestContext) -> None:
        """Record sink: replace the request's tokens-per-minute hold by the tokens it used (prompt + completion)."""
        u = ctx.usage
        self.windows.settle(ctx.key, ctx.request_id, u.prompt_tokens + u.completion_tokens if u is not None else 0)
