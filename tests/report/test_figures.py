"""`tokenomy report`: every figure equals an independent computation from the requests' usage and ledger rows."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
import typer
from typer.testing import CliRunner

from tests.helpers.synthetic import PRICES, Spec, mixed, rows_for
from tokenomy.ledger.ledger import Ledger
from tokenomy.report.command import report
from tokenomy.report.figures import parse_time, percentile

app = typer.Typer()
app.command()(report)
runner = CliRunner()


def usd(spec: Spec) -> float:
    """The bill of one generated request, written out independently of pricing.py."""
    p = PRICES[spec.model]
    return ((spec.prompt - spec.cached) * p.input + spec.cached * p.cached_input + spec.completion * p.output) / 1e6


def expected(specs: list[Spec], rows: list) -> dict:
    """The report's figures recomputed from what each client received (specs) and, for wall-clock figures, the
    ledger rows."""
    hit = [s.cache in ("exact", "semantic") for s in specs]
    ok = [s.status < 400 and s.finish not in ("error", "cancelled") for s in specs]
    gen = [s for s, h in zip(specs, hit, strict=True) if not h]
    billed = sum(s.prompt + s.completion for s in gen)
    delivered = sum(s.completion for s, k in zip(specs, ok, strict=True) if k)
    cost = sum(usd(s) for s in gen if s.model)
    metered = [s for s, h in zip(specs, hit, strict=True) if s.energy and not h]
    joules = sum(s.energy.joules for s in metered)
    lookups = [s for s in specs if s.status < 400]
    saved = {"exact": [0, 0.0], "semantic": [0, 0.0], "prefix": [0, 0.0]}
    for s, h in zip(specs, hit, strict=True):
        if h:
            saved[s.cache][0] += s.prompt + s.completion
            saved[s.cache][1] += usd(s)
        elif s.cached and s.model:
            p = PRICES[s.model]
            saved["prefix"][0] += s.cached
            saved["prefix"][1] += s.cached * (p.input - p.cached_input) / 1e6
    for s in specs:
        for layer, v in s.savings.items():
            t, u = (v["tokens"], v["usd"]) if isinstance(v, dict) else v
            saved.setdefault(layer, [0, 0.0])
            saved[layer][0] += t
            saved[layer][1] += u
    ttft = [s.ttft for s in gen if s.ttft is not None and (s.prompt or s.completion)]
    tpot = [(s.gen_s - s.ttft) / (s.completion - 1) for s in gen if s.ttft is not None and s.completion > 1]
    span = max(r.ts + r.e2e_s for r in rows) - min(r.ts for r in rows)
    return {
        "requests": len(specs), "ok": sum(ok), "success_rate": sum(ok) / len(specs),
        "tokens.billed": billed, "tokens.delivered": delivered,
        "tokens.cached": sum(s.cached for s in specs),
        "cost_usd.total": cost, "tokens_per_usd": billed / cost if cost else None,
        "cost_per_1k_tokens_usd": 1000 * cost / billed if billed else None,
        "cost_per_request_usd": cost / len(specs),
        "tokens_per_s": billed / span,
        "energy.joules": joules or None,
        "energy.tokens_per_joule": sum(s.prompt + s.completion for s in metered) / joules if joules else None,
        "cache.exact.hit_rate": sum(s.cache == "exact" for s in lookups) / len(lookups),
        "cache.semantic.hit_rate": sum(s.cache == "semantic" for s in lookups) / len(lookups),
        "cache.prefix.hit_rate": sum(s.cached for s in gen) / sum(s.prompt for s in gen),
        "saved.by": {k: {"tokens": v[0], "usd": v[1]} for k, v in saved.items() if v[0] or v[1]},
        "token_efficiency": delivered / billed,
        "latency.ttft_s.p50": float(np.percentile(ttft, 50)) if ttft else None,
        "latency.ttft_s.p95": float(np.percentile(ttft, 95)) if ttft else None,
        "latency.tpot_s.p50": float(np.percentile(tpot, 50)) if tpot else None,
        "latency.tpot_s.p95": float(np.percentile(tpot, 95)) if tpot else None,
        "latency.e2e_s.p95": float(np.percentile([r.e2e_s for r in rows], 95)),
        "over_budget.context": sum(s.over_budget for s in specs),
        "over_budget.spend": sum(s.error_code == "budget_exceeded" for s in specs),
    }


def get(figs: dict, path: str):
    for part in path.split("."):
        figs = figs[part]
    return figs


def check(figs: dict, want: dict) -> None:
    for path, value in want.items():
        got = get(figs, path)
        if value is None:
            assert got is None, path
        elif path == "saved.by":
            assert got.keys() == value.keys()
            for k in value:
                assert got[k]["tokens"] == value[k]["tokens"], k
                assert got[k]["usd"] == pytest.approx(value[k]["usd"], rel=1e-9), k
        else:
            assert got == pytest.approx(value, rel=1e-9), path


@pytest.fixture
def filled(ledger_url):
    specs = mixed()
    rows = rows_for(specs)
    with Ledger(ledger_url) as led:
        for r in rows:
            led.write(r)
        led.flush()
        led.feedback(rows[0].request_id, 1.0)
        led.feedback(rows[3].request_id, -0.5)
    return ledger_url, specs, rows


def test_json_report_equals_independent_figures(filled):
    url, specs, rows = filled
    res = runner.invoke(app, ["--ledger", url, "--format", "json", "--by", "model"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    total = data["total"]
    check(total, expected(specs, rows))
    assert total["energy"]["label"] == "estimate"          # one nvml row among estimates: the whole is an estimate
    assert total["energy"]["sources"] == ["estimate", "nvml"]
    assert total["notional_prices"] == ["small"]
    assert total["feedback"] == {"count": 2, "mean": 0.25}
    assert set(data["groups"]) == {"small", "large", "(none)"}
    for model in ("small", "large"):
        idx = [i for i, s in enumerate(specs) if s.model == model]
        check(data["groups"][model], expected([specs[i] for i in idx], [rows[i] for i in idx]))
    assert data["groups"]["large"]["energy"]["label"] == "measured"
    assert data["groups"]["(none)"]["requests"] == 1
    assert sum(p["requests"] for p in data["timeline"]["points"]) == len(specs)


def test_window_and_other_groupings(filled):
    url, specs, rows = filled
    cut = rows[5].ts
    res = runner.invoke(app, ["--ledger", url, "-f", "json", "--since", str(cut), "--by", "tenant"])
    data = json.loads(res.stdout)
    check(data["total"], expected(specs[5:], rows[5:]))
    assert set(data["groups"]) == {s.tenant for s in specs[5:]}
    res = runner.invoke(app, ["--ledger", url, "-f", "json", "--by", "key", "--until", "1h"])
    assert json.loads(res.stdout)["total"]["requests"] == 0      # everything is younger than an hour
    data = json.loads(runner.invoke(app, ["--ledger", url, "-f", "json", "--by", "route"]).stdout)
    assert data["groups"]["default"]["requests"] == sum(s.route == "default" for s in specs)


def test_table_and_html(filled, tmp_path):
    url, specs, rows = filled
    res = runner.invoke(app, ["--ledger", url])
    assert res.exit_code == 0, res.output
    want = expected(specs, rows)
    assert re.search(rf"requests\s.*\s{len(specs)}\s", res.stdout)
    assert f"{want['tokens.billed']:,}" in res.stdout
    assert "Prices for small are notional" in res.stdout and "Energy is an estimate" in res.stdout
    out = tmp_path / "r.html"
    res = runner.invoke(app, ["--ledger", url, "--format", "html", "--out", str(out), "--by", "model"])
    assert res.exit_code == 0, res.output
    html = out.read_text()
    assert len(html) > 1_000_000 and "Plotly" in html               # plotly.js is inline
    assert not re.search(r"<(script|link|img)[^>]+(src|href)\s*=", html)   # and nothing is loaded from elsewhere
    config = json.loads(re.search(r"const CONFIG = (.*);\n", html).group(1).replace("<\\/", "</"))
    check(config["data"]["total"], want)


@pytest.mark.parametrize("args,fragment", [
    (["--by", "user"], "--by"),
    (["--format", "pdf"], "--format"),
    (["--since", "yesterday-ish"], "not a time"),
    (["--since", "2025-02-01", "--until", "2025-01-01"], "after"),
    (["--ledger", "mysql://x/y"], "use sqlite"),
])
def test_bad_options_are_clear_errors(filled, args, fragment):
    url = filled[0]
    res = runner.invoke(app, ["--ledger", url, *args])
    assert res.exit_code == 2
    assert fragment in res.output


def test_missing_sqlite_ledger_is_not_created(tmp_path):
    path = tmp_path / "none.db"
    res = runner.invoke(app, ["--ledger", f"sqlite:///{path}"])
    assert res.exit_code == 1 and "no ledger" in res.output
    assert not path.exists()


def test_parse_time_and_percentile():
    now = 1_700_000_000.0
    assert parse_time("24h", now) == now - 86400
    assert parse_time("1.5d", now) == now - 1.5 * 86400
    assert parse_time("2025-01-31", now) == 1738281600.0
    assert parse_time("2025-01-31T01:00:00+01:00", now) == 1738281600.0
    assert parse_time("now", now) == now and parse_time("", now) is None
    xs = [3.0, 1.0, 4.0, 1.5, 9.0, 2.6]
    for q in (0.0, 0.5, 0.95, 1.0):
        assert percentile(xs, q) == pytest.approx(float(np.percentile(xs, 100 * q)))
    assert percentile([], 0.5) is None
