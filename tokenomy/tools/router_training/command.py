"""`tokenomy router train | calibrate | eval`: build a learned router from JSONL of {prompt, <model>_correct}.

Heavy imports (numpy, scikit-learn, the embedder) happen inside the commands so `tokenomy --help` stays fast.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import typer

app = typer.Typer(no_args_is_help=True, add_completion=False, help=__doc__)


class _UserError(Exception):
    pass


def _fail(message: str) -> typer.Exit:
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(code=2)


def _guard(fn):
    """Turn the router's own input errors into one line on stderr and exit code 2, never a traceback."""
    import functools

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        from tokenomy.config import ConfigError
        from tokenomy.router.classifier import RouterFileError
        from tokenomy.tools.extras import MissingExtra
        from tokenomy.tools.router_training.dataset import RoutingDataError
        from tokenomy.tools.router_training.evaluate import NoGapError
        from tokenomy.tools.router_training.floors import FloorError
        from tokenomy.tools.router_training.threshold import CalibrationError
        from tokenomy.tools.router_training.train import RouterTrainingError

        try:
            return fn(*args, **kwargs)
        except (RoutingDataError, RouterFileError, RouterTrainingError, CalibrationError, NoGapError, FloorError,
                ConfigError, MissingExtra, _UserError) as exc:
            raise _fail(str(exc)) from None
        except OSError as exc:
            raise _fail(f"{exc.filename or ''}: {exc.strerror or exc}") from None

    return wrapper


@app.command()
@_guard
def train(
    data: Path = typer.Option(..., "--data", help="JSONL with prompt, <weak>_correct, <strong>_correct."),
    out: Path = typer.Option(..., "--out", help="Router file to write."),
    weak: str = typer.Option("weak", help="Weak (cheaper) model: its column is <weak>_correct."),
    strong: str = typer.Option("strong", help="Strong model: its column is <strong>_correct."),
    strong_share: float = typer.Option(0.5, help="Initial threshold: this share of the training prompts go strong."),
    embedding: str = typer.Option(
        "both", help="Heads to train: both (default: minilm-static, ~1 ms, and minilm, the contextual vector, used "
        "when the semantic cache has computed it), or one of minilm-static and minilm."
    ),
) -> None:
    """Train a router on DATA and save it to OUT (recalibrate it on held-out data with `calibrate`)."""
    import time

    from tokenomy.router.features import EMBEDDINGS
    from tokenomy.tools.router_training.dataset import load_routing_data
    from tokenomy.tools.router_training.train import HEADS, train_router

    if not 0.0 <= strong_share <= 1.0:
        raise _UserError(f"--strong-share must be between 0 and 1, got {strong_share}")
    if embedding != "both" and embedding not in EMBEDDINGS:
        raise _UserError(f"--embedding must be both, {' or '.join(EMBEDDINGS)}; got {embedding!r}")
    rows = load_routing_data(data, weak, strong)
    _check_writable(out)
    started = time.perf_counter()
    router = train_router(rows, strong_share=strong_share, heads=HEADS if embedding == "both" else (embedding,))
    router.save(out)
    first = router.heads[0].meta
    lines = [f"trained on {first['rows']} prompts in {time.perf_counter() - started:.1f}s: "
             f"{weak} right {first['weak_quality']:.1%}, {strong} right {first['strong_quality']:.1%}"]
    for head in router.heads:
        lines.append(
            f"{head.embedding} head: C={head.meta['C']:g}; priors over "
            f"{len(head.prior.groups) if head.prior else 0} groups; threshold {head.threshold:.4f} on p_weak_ok "
            f"({strong_share:.0%} strong on the training data)")
    typer.echo("\n".join(lines) + f"\nwrote {out}")


@app.command()
@_guard
def calibrate(
    router_path: Path | None = typer.Option(None, "--router", help="Router file (rewritten unless --out is given)."),
    data: Path | None = typer.Option(
        None, "--data", help="JSONL of prompts (with <model>_correct for --quality-floor)."
    ),
    strong_share: float | None = typer.Option(None, help="Target share of strong-model calls, e.g. 0.3."),
    quality_floor: float | None = typer.Option(
        None, help="Keep this fraction of the strong model's quality at the least strong share, e.g. 0.95."
    ),
    out: Path | None = typer.Option(
        None, "--out", help="Router: write the calibrated router here instead. --cascade: write the YAML here too."
    ),
    cascade: bool = typer.Option(False, "--cascade", help="Calibrate a route's cascade floors instead."),
    token: bool = typer.Option(False, "--token", help="Calibrate a token route's threshold instead."),
    large_share: float | None = typer.Option(
        None, help="--token: target share of answer tokens written by the large model, e.g. 0.2."),
    rounds: int = typer.Option(3, help="--token: token-routing runs that move the threshold towards the target."),
    config: Path | None = typer.Option(None, "--config", help="--cascade/--token: the tokenomy YAML config."),
    route: str | None = typer.Option(None, "--route", help="--cascade/--token: the route to calibrate."),
    prompts: Path | None = typer.Option(
        None, "--prompts", help="--cascade/--token: JSONL of prompts like the route's traffic (string, prompt or "
        "messages)."
    ),
    escalation_share: float | None = typer.Option(None, help="--cascade: target share of escalated answers."),
    break_even: bool = typer.Option(
        False, "--break-even", help="--cascade: the largest escalation share that still costs less than "
        "always the route's most capable model."
    ),
    min_saving: float = typer.Option(0.0, help="--cascade --break-even: require this saving share, e.g. 0.1."),
    max_tokens: int = typer.Option(256, help="--cascade: max_tokens of prompts that do not set their own."),
    signals: str = typer.Option("mean,min", help="--cascade: floors to calibrate: mean, min or mean,min."),
    stream: bool = typer.Option(False, "--stream", help="--cascade: judge the first stream_buffer_tokens only."),
    threads: int | None = typer.Option(None, help="--cascade: llama.cpp threads (default: the config's)."),
    as_json: bool = typer.Option(False, "--json", help="--cascade: print JSON with every answer's signals."),
) -> None:
    """Set the router's threshold from a target on DATA (ideally prompts it was not trained on), or with
    --cascade, choose a route's cascade floors from its first model's answers to PROMPTS (printed as YAML for the
    route's `cascade:` block; the config is not edited)."""
    if token:
        if (cascade or router_path is not None or data is not None or strong_share is not None
                or quality_floor is not None or escalation_share is not None or break_even):
            raise _UserError("--token takes --config, --route, --prompts and --large-share, not --cascade/--router/"
                             "--data/--strong-share/--quality-floor/--escalation-share/--break-even")
        _calibrate_token(config, route, prompts, large_share, rounds, max_tokens, threads, out, as_json)
        return
    if large_share is not None:
        raise _UserError("--large-share goes with --token")
    if cascade:
        if router_path is not None or data is not None or strong_share is not None or quality_floor is not None:
            raise _UserError("--cascade takes --config, --route, --prompts and a target, not --router/--data/"
                             "--strong-share/--quality-floor")
        _calibrate_cascade(config, route, prompts, escalation_share, break_even, min_saving, max_tokens, signals,
                           stream, threads, out, as_json)
        return
    from tokenomy.router.classifier import TrainedRouter
    from tokenomy.tools.router_training.dataset import load_routing_data
    from tokenomy.tools.router_training.threshold import calibrate_router, operating_point

    if router_path is None or data is None:
        raise _UserError("give --router and --data (or --cascade with --config, --route and --prompts)")
    if (strong_share is None) == (quality_floor is None):
        raise _UserError("give exactly one of --strong-share and --quality-floor")
    _check_writable(out or router_path)
    router = TrainedRouter.load(router_path)
    rows = load_routing_data(data, router.weak, router.strong, require_labels=quality_floor is not None)
    results = calibrate_router(router, rows, strong_share, quality_floor, source=str(data))
    target = out or router_path
    router.save(target)
    lines = []
    for head in router.heads:
        result = results[head.embedding]
        line = (f"{head.embedding} head: threshold {result.threshold:.4f} on p_weak_ok: strong share "
                f"{result.strong_share:.1%}")
        if rows.labelled:
            share, quality = operating_point(head.p_weak_ok_many(rows.prompts), result.threshold, rows.weak_ok,
                                             rows.strong_ok)
            line += f", quality {quality:.1%} (weak {rows.weak_ok.mean():.1%}, strong {rows.strong_ok.mean():.1%})"
        lines.append(line)
    typer.echo("\n".join(lines) + f"\nwrote {target}")


def _calibrate_token(config: Path | None, route: str | None, prompts: Path | None, large_share: float | None,
                     rounds: int, max_tokens: int, threads: int | None, out: Path | None, as_json: bool) -> None:
    """Run the token route's models on the prompts and print its `token:` block
    (tools/router_training/token_threshold.py)."""
    import asyncio

    from tokenomy.config import load_config
    from tokenomy.tools.router_training.floors import load_prompts
    from tokenomy.tools.router_training.token_threshold import TokenCalibrationError, calibrate

    if config is None or route is None or prompts is None or large_share is None:
        raise _UserError("--token needs --config, --route, --prompts and --large-share")
    if not 0.0 < large_share < 1.0:
        raise _UserError(f"--large-share must be between 0 and 1, got {large_share}")
    if rounds < 1 or max_tokens < 1:
        raise _UserError("--rounds and --max-tokens must be at least 1")
    if out is not None:
        _check_writable(out)
    cfg = load_config(config)
    spec = cfg.routes.get(route)
    if spec is None or "token" not in spec.strategies:
        raise _UserError(f"route {route!r} is not a token route in {config}; routes: "
                         f"{', '.join(n for n, r in cfg.routes.items() if 'token' in r.strategies) or 'none'}")
    requests = load_prompts(prompts)
    from tokenomy.gateway import build_backend

    models = {m.name: m for m in cfg.models}
    small = build_backend(models[spec.models[0]], cfg, n_threads=threads)
    large = build_backend(models[spec.models[1]], cfg, n_threads=threads)
    base = spec.token

    def progress(i: int, trial) -> None:
        typer.echo(f"round {i}/{rounds}: threshold {trial.threshold:.6g} -> large share {trial.large_share:.1%}, "
                   f"{trial.handovers:.1f} handovers per answer", err=True)

    async def run():
        try:
            return await calibrate(small, large, base, requests, large_share, max_tokens, rounds, progress)
        finally:
            await small.close()
            await large.close()

    try:
        result = asyncio.run(run())
    except TokenCalibrationError as e:
        raise _UserError(str(e)) from None
    text = json.dumps(result.to_dict(), indent=2) if as_json else result.snippet(route, base.segment)
    if out is not None:
        out.write_text(text + ("\n" if as_json else ""), encoding="utf-8")
    typer.echo(text)


def _calibrate_cascade(config: Path | None, route: str | None, prompts: Path | None, escalation_share: float | None,
                       break_even: bool, min_saving: float, max_tokens: int, signals: str, stream: bool,
                       threads: int | None, out: Path | None, as_json: bool) -> None:
    """Run the route's first model on the prompts, then choose floors (tokenomy.tools.router_training.floors)."""
    import asyncio

    from tokenomy.config import load_config
    from tokenomy.tools.router_training.floors import answers_to_json, choose_floors, load_prompts, sample_answers

    if config is None or route is None or prompts is None:
        raise _UserError("--cascade needs --config, --route and --prompts")
    if (escalation_share is None) == (not break_even):
        raise _UserError("give exactly one of --escalation-share and --break-even")
    if not break_even and min_saving:
        raise _UserError("--min-saving goes with --break-even")
    if max_tokens < 1:
        raise _UserError(f"--max-tokens must be at least 1, got {max_tokens}")
    if threads is not None and threads < 0:
        raise _UserError(f"--threads must be 0 (all cores) or more, got {threads}")
    chosen = [s.strip() for s in signals.split(",") if s.strip()]
    if out is not None:
        _check_writable(out)
    cfg = load_config(config)
    spec = cfg.routes.get(route)
    if spec is None:
        raise _UserError(f"route {route!r} is not in {config}; routes: {', '.join(cfg.routes) or 'none'}")
    if len(spec.models) < 2:
        raise _UserError(f"route {route!r} has one model: a cascade needs a cheaper and a more capable one")
    models = {m.name: m for m in cfg.models}
    first, capable = models[spec.models[0]], models[spec.models[-1]]
    requests = load_prompts(prompts)
    from tokenomy.gateway import build_backend

    backend = build_backend(first, cfg, n_threads=threads)

    async def run() -> list:
        from tokenomy.backends.base import BackendError, InvalidRequest

        try:
            return await sample_answers(backend, requests, max_tokens,
                                        spec.cascade.stream_buffer_tokens if stream else None)
        except (BackendError, InvalidRequest) as e:
            raise _UserError(f"{first.name}: {e}") from None
        finally:
            await backend.close()

    answers = asyncio.run(run())
    assert first.price is not None and capable.price is not None   # ModelSpec fills a price
    choice = choose_floors(answers, spec.cascade, first.price, capable.price,
                           escalation_share=escalation_share, min_saving=min_saving if break_even else None,
                           signals=chosen)
    snippet = choice.snippet(route)
    if out is not None:
        out.write_text(snippet, encoding="utf-8")
    if as_json:
        body = {"route": route, "first": first.name, "capable": capable.name, **choice.to_dict(),
                "answers": answers_to_json(answers)}
        sys.stdout.write(json.dumps(body, indent=2) + "\n")
        return
    notional = " (notional prices)" if first.price.notional or capable.price.notional else ""
    reasons = ", ".join(f"{k} {v}" for k, v in sorted(choice.reasons.items())) or "none"
    typer.echo(f"{first.name} answered {choice.prompts} prompts: {choice.escalated} escalate "
               f"({choice.escalation_share:.1%}; {choice.forced} on other signals; reasons: {reasons})\n"
               f"estimated cost {choice.cost_ratio:.1%} of always {capable.name}{notional}\n")
    typer.echo(snippet + (f"wrote {out}" if out is not None else ""))


@app.command("eval")
@_guard
def evaluate(
    router_path: Path = typer.Option(..., "--router", help="Router file."),
    data: Path = typer.Option(..., "--data", help="JSONL with prompt and both models' _correct columns."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of tables."),
    plot: Path | None = typer.Option(None, "--plot", help="Write the quality-cost curve: .png or .html."),
    points: int = typer.Option(10, help="Curve points (RouteLLM uses 10 quantile bins)."),
    seeds: int = typer.Option(20, help="Random-router draws to average."),
) -> None:
    """Quality-cost curve, APGR, CPT(50%) and CPT(80%) of each of the router's heads against random and oracle
    routers."""
    from tokenomy.router.classifier import TrainedRouter
    from tokenomy.tools.router_training.dataset import load_routing_data
    from tokenomy.tools.router_training.report import evaluate_heads, print_report, write_plot

    if points < 1 or seeds < 1:
        raise _UserError("--points and --seeds must be at least 1")
    if plot is not None and plot.suffix.lower() not in (".png", ".html"):
        raise _UserError(f"--plot must end in .png or .html, got {plot.name}")
    if plot is not None:
        _check_writable(plot)
    router = TrainedRouter.load(router_path)
    rows = load_routing_data(data, router.weak, router.strong)
    report = evaluate_heads(router, rows, points=points, seeds=seeds)
    if plot is not None:
        write_plot(report, plot)
    if as_json:
        sys.stdout.write(json.dumps(report, indent=2) + "\n")
    else:
        print_report(report)
        if plot is not None:
            typer.echo(f"wrote {plot}")


def _check_writable(path: Path) -> None:
    if path.is_dir():
        raise _UserError(f"{path} is a directory")
    if not path.parent.exists():
        raise _UserError(f"{path.parent}: no such directory")
