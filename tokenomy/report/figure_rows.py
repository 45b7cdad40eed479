"""What the report shows, in order: one row per figure, as (label, path into a group's figures, kind).

The kind says how the value reads: int, pct, ratio, usd, sec or num. The terminal table (report.py) and the
HTML page (page.py, whose script formats values the same way) both lay the figures out from this list.
"""

from __future__ import annotations

ROWS: list[tuple[str, str, str]] = [
    ("requests", "requests", "int"),
    ("success rate", "success_rate", "pct"),
    ("prompt tokens", "tokens.prompt", "int"),
    ("  cached prompt tokens", "tokens.cached", "int"),
    ("  written to prompt cache", "tokens.cache_write", "int"),
    ("completion tokens", "tokens.completion", "int"),
    ("tokens billed", "tokens.billed", "int"),
    ("completion tokens delivered", "tokens.delivered", "int"),
    ("token efficiency (delivered/billed)", "token_efficiency", "ratio"),
    ("tokens/s (billed)", "tokens_per_s", "num"),
    ("completion tokens/s", "completion_tokens_per_s", "num"),
    ("cost USD", "cost_usd.total", "usd"),
    ("  input", "cost_usd.input", "usd"),
    ("  cached input", "cost_usd.cached_input", "usd"),
    ("  cache writes", "cost_usd.cache_write", "usd"),
    ("  output", "cost_usd.output", "usd"),
    ("tokens per USD", "tokens_per_usd", "num"),
    ("cost per 1K tokens", "cost_per_1k_tokens_usd", "usd"),
    ("cost per request", "cost_per_request_usd", "usd"),
    ("energy J", "energy.joules", "num"),
    ("tokens per joule", "energy.tokens_per_joule", "num"),
    ("exact cache hit rate", "cache.exact.hit_rate", "pct"),
    ("semantic cache hit rate", "cache.semantic.hit_rate", "pct"),
    ("prefix cache hit rate (tokens)", "cache.prefix.hit_rate", "pct"),
    ("tokens saved", "saved.tokens", "int"),
    ("USD saved", "saved.usd", "usd"),
    ("TTFT p50 s", "latency.ttft_s.p50", "sec"),
    ("TTFT p95 s", "latency.ttft_s.p95", "sec"),
    ("TPOT p50 s", "latency.tpot_s.p50", "sec"),
    ("TPOT p95 s", "latency.tpot_s.p95", "sec"),
    ("over context budget", "over_budget.context", "int"),
    ("prompt tokens before context stage", "context.tokens_before", "int"),
    ("  after it", "context.tokens_after", "int"),
    ("refused over spend budget", "over_budget.spend", "int"),
    ("feedback mean (n)", "feedback.mean", "num"),
]
