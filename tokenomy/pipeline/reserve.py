"""Reserve stage: before a request reaches a backend, hold the most it can cost against its key's and tenant's
budgets (limits/budget.py) and its key's tokens-per-minute window (limits/rate_windows.py); the record settles the holds
with what the request actually used, whatever way it ended.

The most a request can cost is its prompt plus its output bound:
    tokens = prompt + choices x output bound
    usd    = prompt x max(input, cache_write) + choices x output bound x output          (per 1M tokens)
- prompt: the context stage's count. That is what the embedded engine bills; an upstream bills its own chat
  template and system prompt besides, so an upstream's count gets a margin: the most any of its last 256 answers
  billed beyond the count (`on_record` learns it), and at least 10% + 16 tokens;
- output bound: `max_tokens` (the dialects map max_completion_tokens and max_output_tokens to it), else what the
  model's window leaves after the prompt, else `limits.reserve_output_tokens`, which is then sent as the request's
  max_tokens so the bound holds (an upstream whose window tokenomy does not know);
- choices: `n`, or `best_of` when larger;
- priced at the model the route chose (the first candidate; a token route, whose answer both its models write,
  at the dearer). Generate calls `ctx.cover(ctx, model)` before it falls back to another candidate: a dearer one
  reserves the difference first, and the fallback is refused (429) when that does not fit. A cascade runs this
  stage once per answer it asks for, so each reserves its own.
An embeddings request holds its inputs' tokens: UTF-8 bytes + 2 per text, a bound for any tokenizer.

The `x-tokenomy-reserved` response header says what was held (tokens, USD, the model priced at). Requests that no
budget or tpm applies to pass through untouched. With `limits.shrink_to_fit`, a request refused
by a token or USD budget is instead served with the largest max_tokens that fits (at least 1), and says so in the
`x-tokenomy-max-tokens` response header; off by default, since an answer cut short is not what the client asked.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections import deque
from collections.abc import Callable

from tokenomy.config import LimitsSettings
from tokenomy.ledger.pricing import PriceLike, cache_write_rate
from tokenomy.limits.budget import BudgetExceeded, Budgets, WindowFull
from tokenomy.limits.rate_windows import RateWindows
from tokenomy.pipeline.chain import Next
from tokenomy.pipeline.request import RequestContext

log = logging.getLogger("tokenomy.reserve")

PER = 1e6


class Reserve:
    name = "reserve"

    def __init__(self, budgets: Budgets, windows: RateWindows | None, price: Callable[[str, bool], PriceLike | None],
                 window: Callable[[str], int | None], settings: LimitsSettings | None = None,
                 default_max_tokens: dict[str, int] | None = None) -> None:
        """`windows`: the keys' rate windows (their tpm holds; None: no tpm limits); `price(model, batch)`: a
        model's price, None without one; `window(model)`: a model's context window in tokens, None when unknown."""
        self.budgets, self.windows = budgets, windows
        self.price, self.window = price, window
        self.default_max_tokens = default_max_tokens or {}    # model -> its defaults' max_tokens (generate applies)
        self.settings = settings or LimitsSettings()
        self._renewal: asyncio.Task[None] | None = None
        self.extra: dict[str, deque[int]] = {}     # model -> prompt tokens an upstream billed beyond the count
        self._extra_max: dict[str, int] = {}       # model -> max(self.extra[model]), kept as it changes

    def traced(self, ctx: RequestContext) -> bool:
        """Whether the request has anything to hold (a trace shows this stage only then)."""
        return self._tpm(ctx) or self.budgets.applies(ctx.key_id, ctx.tenant)

    def _tpm(self, ctx: RequestContext) -> bool:
        """Whether the request's key has a tokens-per-minute limit (else there is nothing to hold in its window)."""
        return self.windows is not None and ctx.key is not None and ctx.key.tpm is not None

    async def __call__(self, ctx: RequestContext, call_next: Next) -> None:
        tpm = self._tpm(ctx)
        if not (tpm or self.budgets.applies(ctx.key_id, ctx.tenant)):
            await call_next(ctx)
            return
        self._renew_in_background()
        model = self.priced_model(ctx)
        tokens, usd = self.bound(ctx, model)
        try:
            held = self._reserve(ctx, tpm, usd, tokens)
        except BudgetExceeded as e:
            if not self.settings.shrink_to_fit or not self._shrink(ctx, model, e):
                raise
            tokens, usd = self.bound(ctx, model)
            held = self._reserve(ctx, tpm, usd, tokens)
        if tpm and not held:
            assert self.windows is not None
            self.windows.reserve_tokens(ctx.key, ctx.request_id, int(tokens))
        ctx.reserved = (model, usd)
        ctx.response_headers["x-tokenomy-reserved"] = f"tokens={int(tokens)}; usd={usd:.8f}; model={model}"
        ctx.cover = self.cover       # called with ctx: no closure over it, so no reference cycle
        await call_next(ctx)

    def _reserve(self, ctx: RequestContext, tpm: bool, usd: float, tokens: float) -> bool:
        """Hold the budgets, and with them (one Redis round trip) the tpm window when both live in the shared store;
        whether the tpm hold was taken here."""
        windows = self.windows if tpm else None
        window = windows.window(ctx.key, int(tokens)) if windows is not None else None
        try:
            ample = self.budgets.reserve(ctx.key_id, ctx.tenant, ctx.request_id, usd, tokens, window=window)
        except WindowFull as e:
            assert windows is not None and ctx.key is not None
            raise windows.full(ctx.key, e.used, int(tokens), e.wait_s) from None
        if ample is None or windows is None:
            return False
        windows.held_with_budgets(ctx.key, ctx.request_id, ample)
        return True

    # ---- what a request may cost --------------------------------------------------------------------------
    def priced_model(self, ctx: RequestContext) -> str:
        """The model a request is priced at: the route's chosen model, the dearer of a token route's two."""
        if ctx.gen.kind == "embedding" or not ctx.candidates:
            return ctx.gen.model
        if ctx.token_router is not None:
            return max(ctx.candidates, key=lambda m: self._usd(ctx, m, 1, 1))
        return ctx.candidates[0]

    def bound(self, ctx: RequestContext, model: str) -> tuple[float, float]:
        """(tokens, USD) the request may cost at most on `model`; fixes max_tokens where it had none and the
        model's window is unknown."""
        gen = ctx.gen
        if gen.kind == "embedding":
            tokens = sum(len(x) if isinstance(x, list) else len(str(x).encode()) + 2 for x in gen.inputs or [])
            return float(tokens), self._usd(ctx, model, tokens, 0)
        prompt = self.prompt_bound(ctx, model)
        out = gen.params.get("max_tokens")
        if out is None:
            out = self.default_max_tokens.get(model)
        if out is None:
            window = self.window(model)
            if window is not None:
                out = max(window - prompt, 0)
            else:
                out = gen.params["max_tokens"] = self.settings.reserve_output_tokens
        choices = max(gen.params.get("n") or 1, gen.params.get("best_of") or 1)
        return float(prompt + choices * out), self._usd(ctx, model, prompt, choices * out)

    def prompt_bound(self, ctx: RequestContext, model: str) -> int:
        """The prompt tokens `model` may bill for the request: the context stage's count, with an upstream's
        margin."""
        counted = ctx.prompt_tokens or 0
        if self.window(model) is not None and ctx.prompt_tokens_exact:
            return counted                   # the embedded engine: the count is what it renders and bills
        return counted + max(math.ceil(counted * 0.1) + 16, self._extra_max.get(model, 0))

    def on_record(self, ctx: RequestContext) -> None:
        """Record sink (after the meter's, which settles): free a hold the meter could not settle (its row failed,
        logged there), and learn how many prompt tokens an upstream billed beyond the count."""
        if ctx.request_id in self.budgets.holding and ctx.request_id not in self.budgets.settling:
            log.warning("request %s ended without its budget hold settled: released", ctx.request_id)
            self.budgets.release(ctx.request_id)
        u = ctx.usage
        if ctx.reserved is None or u is None or ctx.model is None or ctx.prompt_tokens is None or u.parts \
                or ctx.cache in ("exact", "semantic") or self.window(ctx.model) is not None:
            return
        seen = self.extra.get(ctx.model)
        if seen is None:
            seen = self.extra[ctx.model] = deque(maxlen=256)
        extra = max(u.prompt_tokens - ctx.prompt_tokens, 0)
        top = self._extra_max.get(ctx.model, 0)
        dropped = seen[0] if len(seen) == seen.maxlen else -1
        seen.append(extra)
        # the max changes only by what came in, or when the one that left held it
        self._extra_max[ctx.model] = max(seen) if dropped >= top > extra else max(top, extra)

    def _usd(self, ctx: RequestContext, model: str, prompt: float, completion: float) -> float:
        p = self.price(model, ctx.batch_id is not None)
        if p is None:
            return 0.0
        return (prompt * max(p.input, cache_write_rate(p)) + completion * p.output) / PER

    def cover(self, ctx: RequestContext, model: str) -> None:
        """Before `model` serves the request (a fallback): reserve what it may cost beyond what is held."""
        held_model, held_usd = ctx.reserved or (None, 0.0)
        if model == held_model:
            return
        _, usd = self.bound(ctx, model)
        if usd > held_usd:
            self.budgets.reserve(ctx.key_id, ctx.tenant, ctx.request_id, usd - held_usd, 0.0)
            ctx.reserved = (model, usd)

    def _shrink(self, ctx: RequestContext, model: str, e: BudgetExceeded) -> bool:
        """Lower max_tokens to what the refusing budget leaves (limits.shrink_to_fit); False when nothing does."""
        if ctx.gen.kind == "embedding":
            return False
        tokens, usd = self.bound(ctx, model)
        out = ctx.gen.params.get("max_tokens") or 0
        choices = max(ctx.gen.params.get("n") or 1, ctx.gen.params.get("best_of") or 1)
        prompt_tokens = tokens - choices * out
        if e.unit == "tokens":
            fit = math.floor((e.left - prompt_tokens) / choices)
        else:
            p = self.price(model, ctx.batch_id is not None)
            per_token = p.output / PER if p is not None else 0.0
            fit = math.floor((e.left - (usd - choices * out * per_token)) / (choices * per_token)) if per_token \
                else 0
        if fit < 1 or fit >= out:
            return False
        ctx.gen.params["max_tokens"] = fit
        ctx.response_headers["x-tokenomy-max-tokens"] = f"{fit}; lowered from {out} to fit the budget"
        return True

    # ---- leases -------------------------------------------------------------------------------------------
    def _renew_in_background(self) -> None:
        if self._renewal is None or self._renewal.done():
            self._renewal = asyncio.get_running_loop().create_task(self._renew(), name="reserve-renewal")

    async def _renew(self) -> None:
        every = self.settings.lease_s / 3
        while self.budgets.holding or (self.windows is not None and self.windows.holding):
            await asyncio.sleep(every)
            try:          # snapshots taken here, on the loop that changes them; Redis answers off it
                await asyncio.to_thread(self.budgets.renew, list(self.budgets.holding.items()))
                if self.windows is not None:
                    await asyncio.to_thread(self.windows.renew, list(self.windows.holding.items()))
            except Exception:           # never let renewal die silently: log and go on
                log.exception("renewing holds failed")

    async def close(self) -> None:
        if self._renewal is not None:
            self._renewal.cancel()
            with contextlib.suppress(asyncio.CancelledError, RuntimeError):
                await self._renewal
