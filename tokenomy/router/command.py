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
        from tokenomy.router.calibrate import CalibrationError
        from tokenomy.router.classifier import RouterFileError, RouterTrainingError
        from tokenomy.router.dataset import RoutingDataError
        from tokenomy.router.evaluate import NoGapError

        try:
            return fn(*args, **kwargs)
        except (RoutingDataError, RouterFileError, RouterTrainingError, CalibrationError, NoGapError,
                _UserError) as exc:
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
        "minilm-static", help="minilm-static (token vectors, ~1 ms) or minilm (contextual, tens of ms on CPU)."
    ),
) -> None:
    """Train a router on DATA and save it to OUT (recalibrate it on held-out data with `calibrate`)."""
    import time

    from tokenomy.router.classifier import Router
    from tokenomy.router.dataset import load_routing_data

    if not 0.0 <= strong_share <= 1.0:
        raise _UserError(f"--strong-share must be between 0 and 1, got {strong_share}")
    rows = load_routing_data(data, weak, strong)
    _check_writable(out)
    started = time.perf_counter()
    router = Router.train(rows, strong_share=strong_share, embedding=embedding)
    router.save(out)
    meta = router.meta
    typer.echo(
        f"trained on {meta['rows']} prompts in {time.perf_counter() - started:.1f}s: "
        f"{weak} right {meta['weak_quality']:.1%}, {strong} right {meta['strong_quality']:.1%}; "
        f"C={meta['C']:g}; {embedding} embedding; priors over {len(router.prior.groups) if router.prior else 0} "
        f"groups\nthreshold {router.threshold:.4f} on p_weak_ok ({strong_share:.0%} strong on the training data)\n"
        f"wrote {out}"
    )


@app.command()
@_guard
def calibrate(
    router_path: Path = typer.Option(..., "--router", help="Router file (rewritten unless --out is given)."),
    data: Path = typer.Option(..., "--data", help="JSONL of prompts (with <model>_correct for --quality-floor)."),
    strong_share: float | None = typer.Option(None, help="Target share of strong-model calls, e.g. 0.3."),
    quality_floor: float | None = typer.Option(
        None, help="Keep this fraction of the strong model's quality at the least strong share, e.g. 0.95."
    ),
    out: Path | None = typer.Option(None, "--out", help="Write the calibrated router here instead."),
) -> None:
    """Set the router's threshold from a target on DATA (ideally prompts it was not trained on)."""
    from tokenomy.router.calibrate import (
        operating_point,
        threshold_for_quality_floor,
        threshold_for_strong_share,
    )
    from tokenomy.router.classifier import Router
    from tokenomy.router.dataset import load_routing_data

    if (strong_share is None) == (quality_floor is None):
        raise _UserError("give exactly one of --strong-share and --quality-floor")
    _check_writable(out or router_path)
    router = Router.load(router_path)
    rows = load_routing_data(data, router.weak, router.strong, require_labels=quality_floor is not None)
    p_ok = router.p_weak_ok_many(rows.prompts)
    if strong_share is not None:
        result = threshold_for_strong_share(p_ok, strong_share)
    else:
        result = threshold_for_quality_floor(p_ok, rows.weak_ok, rows.strong_ok, quality_floor)
    router.threshold = result.threshold
    router.meta["target"] = {**result.target, "set_by": f"calibrate on {data} ({len(rows)} prompts)"}
    target = out or router_path
    router.save(target)
    line = f"threshold {result.threshold:.4f} on p_weak_ok: strong share {result.strong_share:.1%}"
    if rows.labelled:
        share, quality = operating_point(p_ok, result.threshold, rows.weak_ok, rows.strong_ok)
        line += (f", quality {quality:.1%} (weak {rows.weak_ok.mean():.1%}, strong {rows.strong_ok.mean():.1%})")
    typer.echo(f"{line}\nwrote {target}")


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
    """Quality-cost curve, APGR, CPT(50%) and CPT(80%) of the router against random and oracle routers."""
    from tokenomy.router.classifier import Router
    from tokenomy.router.dataset import load_routing_data
    from tokenomy.router.report import evaluate_router, print_report, write_plot

    if points < 1 or seeds < 1:
        raise _UserError("--points and --seeds must be at least 1")
    if plot is not None and plot.suffix.lower() not in (".png", ".html"):
        raise _UserError(f"--plot must end in .png or .html, got {plot.name}")
    if plot is not None:
        _check_writable(plot)
    router = Router.load(router_path)
    rows = load_routing_data(data, router.weak, router.strong)
    report = evaluate_router(router, rows, points=points, seeds=seeds)
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
