"""`tokenomy replay`: re-run recorded requests through candidate cache, route and price policies, offline."""

from __future__ import annotations

from pathlib import Path

import typer

from tokenomy.report.output import emit

HELP_WHAT = "cache, route, price or all."


def _fail(message: str) -> typer.Exit:
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(code=2)


def replay(
    ledger: str | None = typer.Option(None, "--ledger", help="Ledger URL: sqlite:///FILE or postgresql://... "
                                      "(default: ledger.db in the data directory, $TOKENOMY_HOME)."),
    since: str | None = typer.Option(None, help="Start: ISO date/time (UTC if no zone), or 30m, 24h, 7d ago."),
    until: str | None = typer.Option(None, help="End (exclusive), same forms; default now."),
    what: str = typer.Option("all", "--what", help=HELP_WHAT),
    config: Path | None = typer.Option(None, "--config", help="Candidate config (YAML) whose caches, routes and "
                                       "prices are replayed; the live config reproduces the recorded figures."),
    thresholds: str = typer.Option("0.8,0.85,0.9,0.95", help="Semantic cache thresholds to try, comma-separated."),
    format: str = typer.Option("table", "--format", "-f", help="table, json or html."),
    out: Path | None = typer.Option(None, "--out", "-o", help="Write to this file instead of standard output."),
) -> None:
    """What-if on recorded traffic: requests and tokens the exact and semantic caches would serve (with the
    verifier's estimate of wrong hits), each model's share under a candidate router, and the same traffic's cost
    at other prices; each against the recorded actual."""
    from tokenomy.config import ConfigError, load_config
    from tokenomy.ledger.ledger import Ledger, LedgerError, normalize_url
    from tokenomy.report.command import _sqlite_path
    from tokenomy.report.figures import parse_time
    from tokenomy.tools.replay.report import FORMATS, WHAT, build, render
    from tokenomy.tools.replay.traffic import ReplayError, load_trace

    if what not in WHAT:
        raise _fail(f"--what {what!r} is not one of: {', '.join(WHAT)}")
    if format not in FORMATS:
        raise _fail(f"--format {format!r} is not one of: {', '.join(FORMATS)}")
    try:
        lo, hi = parse_time(since), parse_time(until)
        ts = [float(x) for x in thresholds.split(",") if x.strip()]
    except ValueError as e:
        raise _fail(str(e).splitlines()[0]) from None
    if any(not 0 < t <= 1 for t in ts):
        raise _fail(f"--thresholds {thresholds!r}: each must be in (0, 1]")
    if lo is not None and hi is not None and lo > hi:
        raise _fail("--since is after --until")
    candidate = None
    if config is not None:
        try:
            candidate = load_config(config)
        except ConfigError as e:
            lines = str(e).splitlines()
            raise _fail("; ".join(x.strip() for x in lines)) from None
    try:
        url = normalize_url(ledger)
    except LedgerError as e:
        raise _fail(str(e)) from None
    path = _sqlite_path(url)
    if path is not None and not path.exists():
        raise _fail(f"no ledger at {path}: pass --ledger URL")
    try:
        with Ledger(url) as led:
            trace = load_trace(led, lo, hi)
        text = render(build(trace, candidate, what, ts), format)
    except (LedgerError, ReplayError) as e:
        raise _fail(str(e)) from None
    emit(text, out, exit_code=2)
