"""`tokenomy serve`: load the config, build the gateway, run uvicorn."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console

from tokenomy.config import Config, ConfigError, EmbeddedModelSpec, load_config
from tokenomy.models.catalog import resolve_gguf
from tokenomy.models.hub import is_hub_ref
from tokenomy.server import process

# The gateway, the web app, uvicorn and the ledger are imported inside the functions, after the engine processes
# are launched: their imports are seconds of a start that the engines' model loading then overlaps.


def state_line(config: Config) -> str:
    """Where a server with this config keeps its state: the ledger and the response caches."""
    from tokenomy.ledger.ledger import normalize_url, safe_url

    ledger = safe_url(normalize_url(config.ledger.url)) if config.ledger is not None else "off"
    c = config.cache
    if not (c.exact.enabled or c.semantic.enabled):
        cache = "off"
    elif c.store == "local":
        cache = str(c.directory())
    else:
        cache = safe_url(c.store) + (f" (semantic index in {c.directory()})" if c.semantic.enabled else "")
    return f"ledger: {ledger}; response cache: {cache}"


def run(host: str | None = None, port: int | None = None, config_path: Path | None = None,
        models: list[str] | None = None, workers: int | None = None, ollama_port: int | None = None) -> None:
    """Serve the config's models and those named in `models` (config.with_models), in `workers` API processes
    (default: the config's server.workers; more than one: server/workers.py), on the port and, with `ollama_port`
    (else the config's server.ollama_port), on that port too."""
    console = Console(stderr=True)
    process.configure_logging()
    config = load_config(config_path, models)
    if ollama_port is not None:
        config = config.model_copy(update={"server": config.server.model_copy(update={"ollama_port": ollama_port})})
    workers = workers or config.server.workers
    problem = config.workers_problem(workers)
    if problem:
        raise ConfigError(problem)
    for spec in config.models:      # downloads first, with their progress bars, before the spinner
        if isinstance(spec, EmbeddedModelSpec) and spec.gguf and is_hub_ref(spec.gguf):
            console.print(f"{spec.name}: {spec.gguf}", markup=False, highlight=False)
            resolve_gguf(spec.gguf)
    host = host or config.server.host
    port = port or config.server.port
    if workers > 1:
        from tokenomy.server import workers as supervisor

        def ready(sup: supervisor.Supervisor) -> None:
            names = ", ".join(m.name for m in config.models)
            pids = sup.pids()
            console.print(f"[bold green]tokenomy[/] serving {names} on http://{host}:{port}/v1 with {workers} "
                          f"API workers (pids {pids['workers']}); engine processes of the loaded models "
                          f"{pids['engines']}, the others loaded when asked for")
            console.print(state_line(config), markup=False, highlight=False)

        console.print(f"starting {workers} API workers for {', '.join(m.name for m in config.models)} (the preloaded "
                      "models load meanwhile)", markup=False, highlight=False)
        supervisor.serve(config, str(config_path) if config_path else None, models or [], host, port, workers,
                         ready=ready)
        return
    with console.status("loading models: " + ", ".join(m.name for m in config.models)):
        # the engine processes are launched first and load their models while the gateway and the app are
        # imported and built, and only then is the wait for them: docs/install.md has the phases of a start
        from tokenomy.backends.embedded_launch import launch_engines

        launched = launch_engines(config)
        from tokenomy.api.app import create_app
        from tokenomy.gateway import Gateway

        gateway = Gateway(config, str(config_path) if config_path else None, models=models, wait=False,
                          launched=launched)

        app = create_app(gateway)      # ready now: the preloaded models finish loading in the background
    also = config.server.ollama_port
    console.print(f"[bold green]tokenomy[/] serving {', '.join(gateway.model_names())} on http://{host}:{port}/v1"
                  + (f" and on http://{host}:{also} (Ollama's API at /api)" if also else ""))
    console.print(state_line(config), markup=False, highlight=False)
    import uvicorn

    from tokenomy.server.workers import listen

    socks = [listen(host, p) for p in ([port, also] if also else [port])]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=5,
                                           **process.uvicorn_options()))
    server.run(sockets=socks)
