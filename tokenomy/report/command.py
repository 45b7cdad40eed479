"""`tokenomy report`: efficiency figures from the ledger, as a table, JSON or an offline HTML page."""

from __future__ import annotations

from pathlib import Path

import typer

from tokenomy.ledger.ledger import Ledger, LedgerError, normalize_url
from tokenomy.report.figures import BY, FORMATS, build, parse_time, render
from tokenomy.report.output import emit


def _sqlite_path(url: str) -> Path | None:
    if url.startswith("sqlite:///") and url not in ("sqlite:///:memory:",):
        return Path(url[len("sqlite:///"):])
    return None


def report(
    ledger: str | None = typer.Option(None, "--ledger", help="Ledger URL: sqlite:///FILE or postgresql://... "
                                      "(default: ledger.db in the data directory, $TOKENOMY_HOME)."),
    since: str | None = typer.Option(None, help="Start: ISO date/time (UTC if no zone), or 30m, 24h, 7d ago."),
    until: str | None = typer.Option(None, help="End (exclusive), same forms; default now."),
    by: str | None = typer.Option(None, help="Group by key, tenant, model or route."),
    format: str = typer.Option("table", "--format", "-f", help="table, json or html (offline, plotly inline)."),
    out: Path | None = typer.Option(None, "--out", "-o", help="Write to this file instead of standard output."),
    verify: bool = typer.Option(False, "--verify", help="Recompute every figure from the raw rows by a separate "
                                "code path (tokenomy/report/crosscheck.py); exit 1 naming each mismatch."),
) -> None:
    """Tokens per second, per USD and per joule, cost per 1K tokens and per request, cache hit rates and
    savings per layer, token efficiency, TTFT/TPOT percentiles and over-budget counts, from the ledger."""
    if by is not None and by not in BY:
        raise typer.BadParameter(f"{by!r} is not one of: {', '.join(BY)}", param_hint="--by")
    if format not in FORMATS:
        raise typer.BadParameter(f"{format!r} is not one of: {', '.join(FORMATS)}", param_hint="--format")
    try:
        lo, hi = parse_time(since), parse_time(until)
    except ValueError as e:
        raise typer.BadParameter(str(e), param_hint="--since/--until") from None
    if lo is not None and hi is not None and lo > hi:
        raise typer.BadParameter("--since is after --until", param_hint="--since")
    try:
        url = normalize_url(ledger)
    except LedgerError as e:
        raise typer.BadParameter(str(e), param_hint="--ledger") from None
    path = _sqlite_path(url)
    if path is not None and not path.exists():     # don't create an empty ledger just to report on it
        typer.echo(f"no ledger at {path}: run `tokenomy serve` first, or pass --ledger URL", err=True)
        raise typer.Exit(1)
    try:
        with Ledger(url) as led:
            data = build(led.query(since=lo, until=hi), lo, hi, by)
            if verify:
                from tokenomy.report.crosscheck import verify as check

                checked, problems = check(data, led.engine, lo, hi, by)
    except LedgerError as e:
        typer.echo(str(e), err=True)
        raise typer.Exit(1) from None
    if verify:
        if problems:
            for line in problems:
                typer.echo(f"verify: {line}", err=True)
            typer.echo(f"verify FAILED: {len(problems)} mismatches", err=True)
            raise typer.Exit(1)
        typer.echo(f"verify: {checked:,} figures recomputed from the raw rows agree with the report", err=True)
    emit(render(data, format), out)
