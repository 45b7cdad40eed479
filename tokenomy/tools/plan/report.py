"""Plans as a table for people: one row per figure, one column per plan."""

from __future__ import annotations

from collections.abc import Callable

from rich.table import Table

from tokenomy.tools.plan.planner import Plan


def si(value: float, unit: str) -> str:
    """3 significant figures with a decimal prefix: 141e9, 'B' -> '141 GB'."""
    for factor, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= factor:
            return f"{value / factor:.3g} {prefix}{unit}"
    return f"{value:.3g} {unit}"


def ms(value: float) -> str:
    return f"{value:.3g} ms" if value < 1000 else f"{value / 1000:.3g} s"


def _opt(value: float | None, fmt: Callable[[float], str], missing: str) -> str:
    return missing if value is None else fmt(value)


ROWS: list[tuple[str, Callable[[Plan], str]]] = [
    ("model", lambda p: p.model),
    ("hardware", lambda p: p.hardware + (" (measured)" if p.hardware_measured else "")),
    ("weights / KV / math", lambda p: f"{p.weights} / {p.kv} / {p.math_dtype}"),
    ("batch x (prompt + output), context", lambda p: f"{p.batch} x ({p.prompt} + {p.output}), {p.context}"),
    ("parameters total (active per token)", lambda p: f"{si(p.params_total, '')} ({si(p.params_active, '')})"),
    ("weight bytes total (active per token)",
     lambda p: f"{si(p.weight_bytes, 'B')} ({si(p.weight_bytes_active, 'B')})"),
    ("KV bytes per token", lambda p: si(p.kv_bytes_per_token, "B")),
    ("KV bytes per sequence at context",
     lambda p: si(p.kv_bytes_per_sequence, "B")
     + (f" (incl. {si(p.state_bytes_per_sequence, 'B')} state)" if p.state_bytes_per_sequence else "")),
    ("usable memory",  # vendors' nominal memory sizes are binary: show GiB next to GB
     lambda p: f"{si(p.memory_bytes * p.memory_utilization, 'B')} ({p.memory_utilization:.0%} of "
               f"{p.memory_bytes / 2**30:.4g} GiB)"),
    ("max concurrent sequences at context",
     lambda p: str(p.max_sequences) if p.weights_fit else f"0 (weights need --gpus {p.gpus_for_weights})"),
    ("bytes read per decode step (weights + KV)",
     lambda p: f"{si(p.weight_bytes_per_step + p.kv_bytes_per_step, 'B')} "
               f"({si(p.weight_bytes_per_step, 'B')} + {si(p.kv_bytes_per_step, 'B')})"),
    ("decode step floor: memory / compute", lambda p: f"{ms(p.tpot_floor_ms)} / {ms(p.tpot_compute_ms)}"),
    ("binding limit", lambda p: p.bound),
    ("arithmetic intensity vs ridge (FLOP/B)", lambda p: f"{p.arithmetic_intensity:.3g} vs {p.ridge_point:.3g}"),
    ("tokens/s ceiling (all / per sequence)",
     lambda p: f"{p.tokens_per_s_ceiling:,.1f} / {p.tokens_per_s_per_sequence:,.1f}"),
    ("prefill of the batch (bound)", lambda p: f"{ms(p.prefill_ms)} ({p.prefill_bound})"),
    ("request latency floor (prefill + output x step)", lambda p: f"{p.request_latency_s:.3g} s"),
    ("power, estimate", lambda p: _opt(p.power_watts_estimate, lambda w: f"{w:.0f} W of {p.tdp_w:.0f} W TDP",
                                        "unknown (--tdp-watts)")),
    ("energy per token, estimate", lambda p: _opt(p.joules_per_token_estimate, lambda j: f"{j:.3g} J",
                                                  "unknown (--tdp-watts)")),
    ("USD per 1M output tokens", lambda p: _opt(p.usd_per_million_tokens, lambda u: f"${u:.3g}",
                                                "-- (--price-per-hour)")),
]


def plan_table(plans: list[Plan]) -> Table:
    """The report table; a measured rate adds an 'achieved / predicted' row."""
    table = Table(title="tokenomy plan: roofline ceilings (lower bounds on time, upper bounds on rate)")
    table.add_column("figure", style="bold")
    for p in plans:
        table.add_column(p.label, overflow="fold")
    rows = list(ROWS)
    if any(p.measured_tps is not None for p in plans):
        rows.append(("achieved / predicted ceiling",
                     lambda p: "--" if p.achieved_ratio is None else
                     f"{p.measured_tps:.4g} / {p.tokens_per_s_ceiling:.4g} = {p.achieved_ratio:.2f}"))
    for name, cell in rows:
        table.add_row(name, *(cell(p) for p in plans))
    return table
