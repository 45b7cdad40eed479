"""The file's keys, tenants, budgets and the `limits:` section (where rate windows and budgets are kept)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from tokenomy.config.section import Section


class BudgetLimits(Section):
    """Spend limits for one key or tenant, over UTC days and calendar months; any left out is unlimited. A request
    is refused (429) unless its worst case (prompt + output bound, priced) fits beside what is spent and held by
    requests in flight, so concurrent requests never spend past a limit together (limits/budget.py)."""

    usd_per_day: float | None = Field(None, gt=0, description="USD a day (response-cache hits cost nothing); "
                                      "null: no daily USD limit")
    usd_per_month: float | None = Field(None, gt=0, description="USD a calendar month; null: no monthly USD limit")
    tokens_per_day: int | None = Field(None, gt=0, description="billed tokens (prompt + completion of generated "
                                       "answers) a day; null: no daily token limit")
    tokens_per_month: int | None = Field(None, gt=0, description="billed tokens a calendar month; null: no "
                                         "monthly token limit")
    warn_at: float = Field(0.8, gt=0, le=1, description="share of a limit that logs a warning and counts "
                           "tokenomy_budget_warnings_total, once per limit and period")

    def limit(self, unit: str, period: str) -> float | None:
        return getattr(self, f"{unit}_per_{period}")


class KeySpec(Section):
    """An API key: with any keys configured, every request needs one (server.public paths aside)."""

    key: str | None = Field(None, description="the key in plain text (hashed at load) ...")
    key_sha256: str | None = Field(None, description="... or its sha256 in hex, so the file holds no key")
    name: str = Field("key", description="a label for logs and rate-limit errors")
    tenant: str = Field("default", description="the tenant the key's spend and rows count for")
    admin: bool = Field(False, description="may call /admin/keys, /admin/reload and the dashboard, and "
                       "rate any request's answer")
    rpm: int | None = Field(None, ge=1, description="requests per minute; null: unlimited")
    tpm: int | None = Field(None, ge=1, description="tokens per minute; null: unlimited")
    budget: BudgetLimits | None = Field(None, description="this key's spend limits; null: none")
    models: list[str] | None = Field(None, description="model and route names this key may ask for; null: all")

    @model_validator(mode="after")
    def _one(self) -> KeySpec:
        if bool(self.key) == bool(self.key_sha256):
            raise ValueError(f"key {self.name!r}: give exactly one of `key` or `key_sha256`")
        return self


class TenantSpec(Section):
    """Limits shared by all keys of one tenant."""

    budget: BudgetLimits | None = Field(None, description="the tenant's spend limits, all its keys together; "
                                        "null: none")
    models: list[str] | None = Field(None, description="model and route names the tenant's keys may ask for; "
                                     "null: all")
    rpm: int | None = Field(None, ge=1, description="requests per minute, all the tenant's keys together; null: "
                            "unlimited")
    tpm: int | None = Field(None, ge=1, description="tokens per minute used, all the tenant's keys together "
                            "(checked at admission; each key's own tpm also holds a request's bound before it "
                            "runs); null: unlimited")


class LimitsSettings(Section):
    """Where rate limits, budget spend and the holds of requests in flight are counted: `local` (this process) or
    a Redis that every gateway replica shares. What happens while Redis does not answer: `open` admits unchecked,
    `closed` refuses (503). Before a request reaches a backend its worst case is held against every budget and
    tpm limit that applies (pipeline/reserve.py); the record replaces the hold by what it used."""

    store: str = Field("local", description="local (this process) or redis://host:port/db (all replicas)")
    rates_on_store_down: Literal["open", "closed"] = Field("open", description="rate limits while Redis does not "
                                                           "answer: open admits, closed refuses (503)")
    budgets_on_store_down: Literal["open", "closed"] = Field("closed", description="budgets while Redis does not "
                                                             "answer: open admits unchecked, closed refuses (503)")
    timeout_s: float = Field(0.25, gt=0, description="Redis socket timeout, in seconds")
    lease_s: float = Field(300.0, ge=3, description="seconds a request's budget and tpm hold outlives its last "
                           "renewal (a live gateway renews every lease_s/3): what a gateway killed while serving "
                           "holds is freed after this")
    reserve_output_tokens: int = Field(4096, gt=0, description="output bound reserved for a request with no "
                                       "max_tokens on a model whose window tokenomy does not know (an upstream), "
                                       "then sent as its max_tokens so the bound holds")
    allowances: bool = Field(True, description="with a Redis store, while a budget is far from its limit each "
                             "gateway holds a chunk of it (a leased allowance) and admits requests against it "
                             "without a round trip to Redis; near the limit every request is held in Redis")
    shrink_to_fit: bool = Field(False, description="a request whose output bound does not fit a token or USD "
                                "budget is served with the largest max_tokens that fits (header "
                                "x-tokenomy-max-tokens) instead of a 429")

    @model_validator(mode="after")
    def _store(self) -> LimitsSettings:
        if self.store != "local" and not self.store.startswith(("redis://", "rediss://", "unix://")):
            raise ValueError("limits.store must be 'local' or a redis:// URL")
        return self
