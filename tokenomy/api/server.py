"""`tokenomy serve`: load the config, build the gateway, run uvicorn."""

from __future__ import annotations

import logging
from pathlib import Path

import uvicorn
from rich.console import Console

from tokenomy.api.app import create_app
from tokenomy.config import load_config
from tokenomy.gateway import Gateway


def run(host: str | None = None, port: int | None = None, config_path: Path | None = None) -> None:
    console = Console(stderr=True)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    config = load_config(config_path)
    with console.status("loading models: " + ", ".join(m.name for m in config.models)):
        gateway = Gateway(config, str(config_path) if config_path else None)
    host = host or config.server.host
    port = port or config.server.port
    console.print(f"[bold green]tokenomy[/] serving {', '.join(gateway.model_names())} on http://{host}:{port}/v1")
    uvicorn.run(create_app(gateway), host=host, port=port, log_level="warning", timeout_graceful_shutdown=5)
