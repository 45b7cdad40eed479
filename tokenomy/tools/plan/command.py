"""`tokenomy plan`: size a deployment from the hard limits before buying hardware."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import typer

from tokenomy.models.shape import ModelShape
from tokenomy.tools.plan.inputs import HardwareSpec, Workload
from tokenomy.tools.plan.planner import Plan, PlanInputError, make_plan
from tokenomy.tools.plan.presets import PresetError, hardware_names, model_names, resolve_hardware, resolve_model

# --compare keys and how each one changes a setting: model and hardware by name, the rest in the Workload.
_WORKLOAD_KEYS = {"weights": str, "kv": str, "batch": int, "prompt": int, "output": int, "context": int,
                  "gpus": int, "price-per-hour": float, "tdp-watts": float, "memory-utilization": float,
                  "measured-tps": float}
_FIELD = {"price-per-hour": "price_per_hour", "tdp-watts": "tdp_w", "memory-utilization": "memory_utilization",
          "measured-tps": "measured_tps"}


def parse_compare(text: str) -> dict[str, str]:
    """'weights=int4,kv=fp8' -> {'weights': 'int4', 'kv': 'fp8'}; keys: model, hardware and the workload flags."""
    out: dict[str, str] = {}
    for part in filter(None, (s.strip() for s in text.split(","))):
        key, sep, value = part.partition("=")
        key = key.strip().lstrip("-").replace("_", "-")
        if not sep or not value.strip():
            raise typer.BadParameter(f"{part!r} is not key=value (e.g. weights=int4)", param_hint="--compare")
        if key not in _WORKLOAD_KEYS and key not in ("model", "hardware"):
            valid = ", ".join(["model", "hardware", *_WORKLOAD_KEYS])
            raise typer.BadParameter(f"unknown setting {key!r}; valid: {valid}", param_hint="--compare")
        out[key] = value.strip()
    if not out:
        raise typer.BadParameter("empty comparison; give key=value pairs, e.g. weights=int4", param_hint="--compare")
    return out


def _apply(workload: Workload, overrides: dict[str, str]) -> Workload:
    changes: dict[str, object] = {"measured_tps": None}  # a measurement belongs to the setting it was taken in
    for key, value in overrides.items():
        if key in _WORKLOAD_KEYS:
            try:
                changes[_FIELD.get(key, key)] = _WORKLOAD_KEYS[key](value)
            except ValueError:
                raise typer.BadParameter(f"{key}={value!r} is not a number", param_hint="--compare") from None
    return replace(workload, **changes)


def _resolve(model: str, hardware: str) -> tuple[ModelShape, HardwareSpec]:
    try:
        return resolve_model(model), resolve_hardware(hardware)
    except PresetError as e:
        hint = "--hardware" if str(e).startswith("unknown hardware") else "--model"
        raise typer.BadParameter(str(e), param_hint=hint) from None


def _plan(model: ModelShape, chip: HardwareSpec, workload: Workload, label: str) -> Plan:
    try:
        return make_plan(model, chip, workload, label)
    except PlanInputError as e:
        raise typer.BadParameter(str(e)) from None


def batch_sweep(model: ModelShape, chip: HardwareSpec, workload: Workload) -> list[Plan]:
    """The same plan at batch 1, 2, 4, ... up to the memory's capacity (at least the asked batch, at most 4096)."""
    first = make_plan(model, chip, replace(workload, batch=1))
    top = max(workload.batch, min(first.max_sequences, 4096) if first.weights_fit else 256)
    batches, b = [], 1
    while b < top:
        batches.append(b)
        b *= 2
    batches.append(top)
    return [make_plan(model, chip, replace(workload, batch=b)) for b in batches]


def plan(
    model: str = typer.Option(..., "--model", "-m",
                              help=f"Preset ({', '.join(model_names())}) or a path to a config.json or .gguf."),
    hardware: str = typer.Option(..., "--hardware", help=f"One of: {', '.join(hardware_names())}."),
    weights: str | None = typer.Option(
        None, "--weights", help="fp16|bf16|fp8|int8|int4 (default: the model's native format, or a GGUF's bytes)."),
    kv: str = typer.Option("fp16", "--kv", help="KV cache format: fp16|bf16|fp8|q8|q4."),
    batch: int = typer.Option(1, "--batch", min=1, help="Concurrent sequences decoded per step."),
    prompt: int = typer.Option(1024, "--prompt", min=0, help="Prompt tokens per sequence."),
    output: int = typer.Option(256, "--output", min=1, help="Output tokens per sequence."),
    context: int | None = typer.Option(None, "--context", min=1,
                                       help="Tokens each sequence holds in KV (default: prompt + output)."),
    gpus: int = typer.Option(1, "--gpus", min=1, help="Chips in ideal tensor parallel."),
    price_per_hour: float | None = typer.Option(None, "--price-per-hour", min=0.0, help="USD per chip-hour."),
    memory_utilization: float = typer.Option(0.9, "--memory-utilization", min=0.01, max=1.0,
                                             help="Share of memory usable for weights + KV."),
    tdp_watts: float | None = typer.Option(None, "--tdp-watts", min=0.0,
                                           help="Board power per chip (needed for `local`)."),
    measured_tps: float | None = typer.Option(None, "--measured-tps", min=0.0,
                                              help="A measured decode rate (tokens/s) to set against the ceiling."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object instead of the table."),
    plot: Path | None = typer.Option(None, "--plot", help="Write the roofline chart: .png, .svg, .pdf or .html."),
    compare: list[str] | None = typer.Option(
        None, "--compare", help="Another setting side by side, e.g. 'weights=int4' or 'kv=fp8,batch=8'; repeatable."),
) -> None:
    """Roofline, memory and capacity planner: decode floors, KV cache, concurrency, energy and cost."""
    from tokenomy.tools.plan.roofline import FORMATS

    if plot is not None and plot.suffix.lower() not in FORMATS:
        raise typer.BadParameter(f"use one of {', '.join(FORMATS)}", param_hint="--plot")
    workload = Workload(weights=weights, kv=kv, batch=batch, prompt=prompt, output=output, context=context,
                        gpus=gpus, price_per_hour=price_per_hour, memory_utilization=memory_utilization,
                        tdp_w=tdp_watts, measured_tps=measured_tps)
    settings = [(model, hardware, workload, "base" if compare else "")]
    for text in compare or []:
        overrides = parse_compare(text)
        settings.append((overrides.get("model", model), overrides.get("hardware", hardware),
                         _apply(workload, overrides), text))

    resolved = [(*_resolve(m, h), w, label) for m, h, w, label in settings]
    plans = [_plan(m, h, w, label) for m, h, w, label in resolved]

    if plot is not None:
        from tokenomy.tools.extras import MissingExtra
        from tokenomy.tools.plan.roofline import write_roofline

        sweeps = [batch_sweep(m, h, w) for m, h, w, _ in resolved]
        try:
            write_roofline(plans, sweeps, plot)
        except OSError as e:
            raise typer.BadParameter(f"cannot write {plot}: {e.strerror or e}", param_hint="--plot") from None
        except MissingExtra as e:
            raise typer.BadParameter(str(e), param_hint="--plot") from None

    if as_json:
        out = plans[0].to_dict()
        if len(plans) > 1:
            out["compare"] = [p.to_dict() for p in plans[1:]]
        typer.echo(json.dumps(out, indent=2))
        return

    from rich.console import Console

    from tokenomy.tools.plan.report import plan_table

    console = Console()
    console.print(plan_table(plans))
    for p in plans:
        for note in p.notes:
            console.print(f"[yellow]note[/] ({p.label or p.model}): {note}")
    if plot is not None:
        console.print(f"roofline chart written to {plot}")
