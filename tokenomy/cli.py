"""The `tokenomy` command: serve, plan, router, config, report, replay, bench, batch, ps, load, unload, keys, tenants,
spend."""

from __future__ import annotations

import importlib
from functools import cache
from pathlib import Path

import click
import typer
from typer.core import TyperGroup

# Commands imported only when run (or listed in --help), so that `tokenomy serve` starts its engine processes
# without first importing the reporting, load-test and training code: name -> (module, attribute, a group's help)
LAZY: dict[str, tuple[str, str, str | None]] = {
    "plan": ("tokenomy.tools.plan.command", "plan", None),
    "report": ("tokenomy.report.command", "report", None),
    "bench": ("tokenomy.tools.bench.command", "bench", None),
    "replay": ("tokenomy.tools.replay.command", "replay", None),
    "router": ("tokenomy.tools.router_training.command", "app", "Train, calibrate and evaluate a learned router."),
    "batch": ("tokenomy.batch.command", "app", "Submit batches (OpenAI's Batch API), follow them, fetch results."),
    "ps": ("tokenomy.tools.fleet_client", "ps", None),
    "load": ("tokenomy.tools.fleet_client", "load", None),
    "unload": ("tokenomy.tools.fleet_client", "unload", None),
    "keys": ("tokenomy.api.admin_command", "keys", "Make, list, change, revoke and rotate API keys (admin API)."),
    "tenants": ("tokenomy.api.admin_command", "tenants", "Make, list, change and delete tenants (admin API)."),
    "spend": ("tokenomy.api.admin_command", "spend", None),
}


@cache
def lazy_command(name: str) -> click.Command:
    """The click command for one of LAZY's names, its module imported now."""
    module, attr, help_text = LAZY[name]
    target = getattr(importlib.import_module(module), attr)
    if isinstance(target, typer.Typer):
        group = typer.main.get_group(target)
        group.name, group.help = name, help_text
        return group
    single = typer.Typer()
    single.command(name)(target)
    return typer.main.get_command(single)


class LazyGroup(TyperGroup):
    """The top-level group: LAZY's commands first, then those defined below."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return [*LAZY, *super().list_commands(ctx)]

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name in LAZY:
            return lazy_command(cmd_name)
        return super().get_command(ctx, cmd_name)


app = typer.Typer(cls=LazyGroup, no_args_is_help=True, add_completion=False, help=__doc__)


@app.command()
def serve(
    models: list[str] | None = typer.Argument(None, metavar="MODEL", help="Models to serve: a packaged "
                                              "name, a .gguf path or a hub model (hf:ORG/REPO:QUANT, "
                                              "hf:ORG/REPO:FILE.gguf); NAME=MODEL serves it as NAME. Added to "
                                              "--config's models (docs/models.md)."),
    host: str | None = typer.Option(None, help="Address to bind (default 127.0.0.1, or the config's)."),
    port: int | None = typer.Option(None, help="Port to bind (default 8000, or the config's)."),
    config: Path | None = typer.Option(None, "--config", "-c", help="YAML config file (optional)."),
    workers: int | None = typer.Option(None, min=1, max=256, help="API processes on the port, in front of one "
                                       "engine process per embedded model (default 1, or the config's "
                                       "server.workers; docs/workers.md)."),
    ollama_port: int | None = typer.Option(None, min=1, max=65535, help="Serve on this port too (11434: "
                                           "Ollama's, where Ollama clients look by default; docs/ollama.md)."),
) -> None:
    """Start the OpenAI-compatible server on the models named (default: the packaged smollm2-135m-instruct, or
    the models in --config)."""
    from tokenomy.config import ConfigError
    from tokenomy.engine.client import EngineStartError
    from tokenomy.models.hub import HubError
    from tokenomy.models.memory import DoesNotFit
    from tokenomy.server.command import run
    from tokenomy.server.workers import WorkerStartError

    try:
        run(host=host, port=port, config_path=config, models=models or [], workers=workers,
            ollama_port=ollama_port)
    except (ConfigError, HubError, DoesNotFit, FileNotFoundError, EngineStartError,
            WorkerStartError) as e:   # a bad file or model, a download that
        typer.echo(f"tokenomy: {e}", err=True)      # failed, a model too big, a key's variable unset
        raise typer.Exit(1) from None


@app.command()
def pull(models: list[str] = typer.Argument(..., metavar="MODEL", help="hub models (hf:ORG/REPO:QUANT), "
                                            "packaged names or .gguf paths")) -> None:
    """Download models into the Hugging Face cache (as `serve` would) and print each one's local path."""
    from tokenomy.models.catalog import resolve_gguf
    from tokenomy.models.hub import HubError

    try:
        for model in models:
            typer.echo(resolve_gguf(model))
    except (HubError, FileNotFoundError) as e:
        typer.echo(f"tokenomy: {e}", err=True)
        raise typer.Exit(1) from None


config_app = typer.Typer(no_args_is_help=True, help="Check configuration files; print their schema and reference.")
app.add_typer(config_app, name="config")


@config_app.command("check")
def config_check(path: Path = typer.Argument(..., help="YAML config file")) -> None:
    """Validate a config file without starting anything; exit 1 with the bad fields named."""
    from tokenomy.config import ConfigError, load_config

    try:
        cfg = load_config(path)
    except ConfigError as e:
        typer.echo(str(e), err=True)
        raise typer.Exit(1) from None
    typer.echo(f"{path}: ok ({len(cfg.models)} models, {len(cfg.routes)} routes, {len(cfg.keys)} keys)")


@config_app.command("schema")
def config_schema() -> None:
    """Print the config file's JSON Schema, for editors to complete and check the YAML with."""
    import json

    from tokenomy.config.docs import schema

    typer.echo(json.dumps(schema(), indent=2))


@config_app.command("docs")
def config_docs() -> None:
    """Print the configuration reference made from the config's models (docs/config.md)."""
    from tokenomy.config.docs import markdown

    typer.echo(markdown(), nl=False)


if __name__ == "__main__":
    app()
