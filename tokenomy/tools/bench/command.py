"""`tokenomy bench`: load an OpenAI-compatible endpoint with a workload, closed or open loop, and report vLLM's
serving figures (TTFT, TPOT, ITL, E2EL, throughput, goodput) as a table, JSON and an offline HTML page;
with --compare, the same workload against a second endpoint in alternating rounds, and the ratios.

Bad input (options, SLOs, workloads, an unset key variable) exits 2 with one line; an endpoint that cannot be
reached, an output file that cannot be written, or a sweep in which no request completed, exits 1.
"""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from tokenomy.tools.bench.loadgen import Load, Options, Target
from tokenomy.tools.bench.results import RequestResult, SLOError, parse_slo
from tokenomy.tools.bench.sweep import RATIO_KEYS, Run, ratios, sweep
from tokenomy.tools.bench.workload import BUILTINS, WorkloadError, load_workload, write_file


def parse_levels(text: str, kind: str) -> list[float]:
    """'1,4,8' -> [1.0, 4.0, 8.0]: whole numbers >= 1 for concurrency, numbers > 0 for rate."""
    hint = "--concurrency" if kind == "closed" else "--rate"
    out = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        try:
            value = float(part)
        except ValueError:
            raise typer.BadParameter(f"{part!r} is not a number", param_hint=hint) from None
        if kind == "closed" and (value < 1 or value != int(value)):
            raise typer.BadParameter(f"{part!r}: concurrency is a whole number >= 1", param_hint=hint)
        if kind == "open" and not value > 0:
            raise typer.BadParameter(f"{part!r}: rate must be > 0 requests/s", param_hint=hint)
        out.append(value)
    if not out:
        raise typer.BadParameter("give at least one level, e.g. 1,4,8", param_hint=hint)
    return out


def normalize_base_url(url: str, hint: str) -> str:
    """'http://host:8000' -> 'http://host:8000/v1'; a URL with a path is kept as given (without a trailing /)."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise typer.BadParameter(f"{url!r} is not an http(s) URL (e.g. http://127.0.0.1:8000/v1)", param_hint=hint)
    url = url.rstrip("/")
    return url if parts.path.strip("/") else url + "/v1"


def _api_key(var: str | None, hint: str) -> str | None:
    if var is None:
        return None
    key = os.environ.get(var)
    if not key:
        raise typer.BadParameter(f"environment variable {var} is not set", param_hint=hint)
    return key


def check_reachable(target: Target) -> None:
    """Exit 1 with one line when nothing answers at the target's base URL (any HTTP answer counts)."""
    headers = {"authorization": f"Bearer {target.api_key}"} if target.api_key else {}
    try:
        httpx.get(target.base_url + "/models", headers=headers, timeout=10)
    except httpx.HTTPError as e:
        typer.echo(f"cannot reach {target.base_url}: {type(e).__name__}: {e}", err=True)
        raise typer.Exit(1) from None


def _ms(x: float) -> str:
    return f"{x:,.0f}" if x >= 100 else f"{x:.1f}"


def runs_table(summaries: list[dict[str, Any]]) -> Table:
    table = Table(title="tokenomy bench")
    for col in ("endpoint", "load", "ok", "failed", "req/s", "out tok/s", "goodput", "TTFT p50/p99 ms",
                "TPOT p50/p99 ms", "ITL p50 ms", "E2EL p50 ms"):
        table.add_column(col, justify="left" if col in ("endpoint", "load") else "right")
    for s in summaries:
        load = (f"c={s['max_concurrency']}" if s["load"] == "closed" else
                f"{s['request_rate']:g}/s" if s["load"] == "open" else "trace")
        table.add_row(s["endpoint"], load, str(s["completed"]), str(s["failed"]) if not s["failed"] else
                      f"[red]{s['failed']}[/]", f"{s['request_throughput']:.2f}", f"{s['output_throughput']:.1f}",
                      "-" if s["request_goodput"] is None else f"{s['request_goodput']:.2f}",
                      f"{_ms(s['median_ttft_ms'])} / {_ms(s['p99_ttft_ms'])}",
                      f"{_ms(s['median_tpot_ms'])} / {_ms(s['p99_tpot_ms'])}", _ms(s["median_itl_ms"]),
                      _ms(s["median_e2el_ms"]))
    return table


RATIO_HEADERS = {"request_throughput": "req/s", "output_throughput": "out tok/s", "total_token_throughput": "tok/s",
                 "request_goodput": "goodput", "median_ttft_ms": "TTFT p50", "p99_ttft_ms": "TTFT p99",
                 "median_tpot_ms": "TPOT p50", "p99_tpot_ms": "TPOT p99", "median_itl_ms": "ITL p50",
                 "median_e2el_ms": "E2EL p50"}


def ratio_table(comparisons: list[dict[str, Any]], a: str, b: str) -> Table:
    table = Table(title=f"{a} / {b} (throughputs: higher favours {a}; latencies: lower favours {a})")
    table.add_column("load")
    for key in RATIO_KEYS:
        table.add_column(RATIO_HEADERS[key], justify="right")
    for c in comparisons:
        table.add_row(c["load"], *("-" if c["ratios"][k] is None else f"{c['ratios'][k]:.2f}x" for k in RATIO_KEYS))
    return table


def compare_runs(runs: list[Run], summaries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Pair the runs of the two endpoints at each load level: {"load", "max_concurrency", "request_rate",
    "ratios"}, ratios = base / compare."""
    out = []
    for i in range(0, len(runs), 2):
        a, b = summaries[i], summaries[i + 1]
        out.append({"load": runs[i].load.label, "max_concurrency": a["max_concurrency"],
                    "request_rate": a["request_rate"], "ratios": ratios(a, b)})
    return out


def bench(
    base_url: str = typer.Option(..., "--base-url", help="Endpoint up to /v1, e.g. http://127.0.0.1:8000/v1."),
    model: str = typer.Option(..., "--model", "-m", help="Model name sent in every request."),
    api_key_env: str | None = typer.Option(None, "--api-key-env", help="Environment variable holding a bearer key."),
    workload: str = typer.Option(
        "fixed", "--workload", "-w",
        help=f"Builtin ({', '.join(BUILTINS)}), optionally name:key=value,...; or a JSONL workload file."),
    concurrency: str | None = typer.Option(None, "--concurrency", help="Closed loop levels, e.g. 1,4,8."),
    rate: str | None = typer.Option(None, "--rate", help="Open loop Poisson arrival rates (req/s), e.g. 0.5,1,2."),
    requests: int | None = typer.Option(None, "--requests", "-n", min=1,
                                        help="Requests per level and round (default: the workload's size)."),
    duration: float | None = typer.Option(None, "--duration", min=0.001,
                                          help="Seconds per level and round instead of a request count."),
    slo: str | None = typer.Option(None, "--slo", help="Goodput SLOs, e.g. ttft=500ms,tpot=50ms (ttft tpot itl e2el)."),
    json_out: Path | None = typer.Option(None, "--json", help="Write the results as JSON (vLLM field names)."),
    html_out: Path | None = typer.Option(None, "--html", help="Write an offline HTML report (plotly inline)."),
    compare: str | None = typer.Option(None, "--compare", help="A second endpoint to run the same workload against."),
    compare_model: str | None = typer.Option(None, "--compare-model", help="Model name there (default: --model)."),
    compare_api_key_env: str | None = typer.Option(None, "--compare-api-key-env",
                                                   help="Key variable for --compare (default: --api-key-env)."),
    rounds: int = typer.Option(1, "--rounds", min=1, help="Rounds per level; the endpoints alternate going first."),
    max_tokens: int = typer.Option(128, "--max-tokens", min=1, help="max_tokens where the workload sets none."),
    temperature: float = typer.Option(0.0, "--temperature", min=0.0, help="temperature where the workload sets none."),
    ignore_eos: bool = typer.Option(False, "--ignore-eos", help="Send ignore_eos: true (answers run to max_tokens)."),
    response_cache: bool = typer.Option(False, "--response-cache/--no-response-cache",
                                        help="Let response caches answer (default: cache-control no-cache)."),
    seed: int = typer.Option(0, "--seed", help="Seed for generated workloads and Poisson arrivals."),
    timeout: float = typer.Option(600.0, "--timeout", min=0.001, help="Seconds before a request counts as failed."),
    warmup: int = typer.Option(1, "--warmup", min=0, help="Unrecorded requests per endpoint before the sweep."),
    save_workload: Path | None = typer.Option(None, "--save-workload",
                                              help="Also write the workload as a JSONL file (to edit or replay)."),
) -> None:
    """Benchmark an OpenAI-compatible endpoint: TTFT, TPOT, ITL, end-to-end latency, throughput and goodput."""
    if concurrency is not None and rate is not None:
        raise typer.BadParameter("give --concurrency or --rate, not both", param_hint="--concurrency/--rate")
    if requests is not None and duration is not None:
        raise typer.BadParameter("give --requests or --duration, not both", param_hint="--requests/--duration")
    try:
        slos = parse_slo(slo) if slo is not None else None
    except SLOError as e:
        raise typer.BadParameter(str(e), param_hint="--slo") from None
    try:
        reqs = load_workload(workload, seed)
    except WorkloadError as e:
        raise typer.BadParameter(str(e), param_hint="--workload") from None
    targets = [("base", Target(normalize_base_url(base_url, "--base-url"), model, _api_key(api_key_env,
                                                                                             "--api-key-env")))]
    if compare is not None:
        key_var = compare_api_key_env or api_key_env
        targets.append(("compare", Target(normalize_base_url(compare, "--compare"), compare_model or model,
                                          _api_key(key_var, "--compare-api-key-env"))))
    if concurrency is not None:
        loads = [Load("closed", v) for v in parse_levels(concurrency, "closed")]
    elif rate is not None:
        loads = [Load("open", v) for v in parse_levels(rate, "open")]
    elif reqs[0].arrival_s is not None:
        loads = [Load("trace")]
    else:
        loads = [Load("closed", 1)]
    if save_workload is not None:
        _write(save_workload, lambda p: write_file(p, reqs))
    for _, target in targets:
        check_reachable(target)

    opts = Options(max_tokens=max_tokens, temperature=temperature, ignore_eos=ignore_eos,
                   response_cache=response_cache, timeout_s=timeout)
    n = requests if requests is not None or duration is not None else len(reqs)
    console = Console(stderr=True)
    runs = _run_live(console, targets, reqs, loads, opts, rounds, n, duration, seed, warmup)

    summaries = [r.summary(slos) for r in runs]
    comparisons = compare_runs(runs, summaries) if compare is not None else []
    out = Console()
    if not out.is_terminal:            # a file or a pipe: don't squeeze the tables into 80 columns
        out = Console(width=160)
    out.print(runs_table(summaries))
    if comparisons:
        out.print(ratio_table(comparisons, "base", "compare"))
    for s in summaries:
        if s["token_counts"] != "usage":
            out.print(f"[yellow]note[/] {s['endpoint']} ({s['base_url']}) sent no usage in "
                      f"{'some' if s['token_counts'] == 'mixed' else 'its'} streams: output tokens there are "
                      "counted as content chunks and input tokens as 0")
        for e in s["error_samples"]:
            out.print(f"[red]failed[/] {s['endpoint']}: {e['count']} x {e['message']}")

    if json_out is not None:
        doc = {"tool": "tokenomy bench", "workload": workload, "seed": seed, "rounds": rounds, "warmup": warmup,
               "slo_ms": {k: v * 1000 for k, v in (slos or {}).items()}, "runs": summaries,
               "comparisons": comparisons}
        _write(json_out, lambda p: p.write_text(json.dumps(doc, indent=1), encoding="utf-8"))
        console.print(f"wrote {json_out}")
    if html_out is not None:
        from tokenomy.tools.bench.html import write_html

        _write(html_out, lambda p: write_html(summaries, p, f"tokenomy bench: {workload}"))
        console.print(f"wrote {html_out}")
    if not any(s["completed"] for s in summaries):
        typer.echo("no request completed", err=True)
        raise typer.Exit(1)


def _write(path: Path, write: Any) -> None:
    try:
        write(path)
    except OSError as e:
        typer.echo(f"cannot write {path}: {e.strerror or e}", err=True)
        raise typer.Exit(1) from None


def _run_live(console: Console, targets: list[tuple[str, Target]], reqs: list, loads: list[Load], opts: Options,
              rounds: int, n: int | None, duration: float | None, seed: int, warmup: int) -> list[Run]:
    """The sweep under a live progress display: one bar per round, with completed and failed counts."""
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
               TextColumn("[red]{task.fields[failed]} failed"), TimeElapsedColumn())
    with Progress(*columns, console=console) as progress:
        current: dict[str, Any] = {}

        def on_start(name: str, load: Load, r: int) -> None:
            total = n if duration is None else None
            label = f"{name} {load.label}" + (f" round {r + 1}/{rounds}" if rounds > 1 else "")
            current["task"] = progress.add_task(label, total=total, failed=0)
            current["failed"] = 0

        def on_record(rec: RequestResult) -> None:
            current["failed"] += not rec.ok
            progress.update(current["task"], advance=1, failed=current["failed"])

        try:
            return asyncio.run(sweep(targets, reqs, loads, opts, rounds, n, duration, seed, on_start, on_record,
                                     warmup))
        except KeyboardInterrupt:
            progress.stop()
            typer.echo("interrupted: no results written", err=True)
            raise typer.Exit(130) from None
