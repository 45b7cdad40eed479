"""Fixtures for the cache tests: a real redis-server (started here if none answers) and fresh namespaces."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator
from urllib.parse import urlparse

import pytest

REDIS_URL = os.environ.get("TOKENOMY_TEST_REDIS_URL", "redis://127.0.0.1:6390/0")


def _ping(url: str) -> bool:
    import redis

    try:
        return bool(redis.Redis.from_url(url, socket_connect_timeout=0.5, socket_timeout=0.5).ping())
    except (redis.RedisError, OSError):
        return False


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    """The test Redis URL; starts `redis-server --port P --save '' --daemonize yes` when nothing answers, and
    shuts down (only) the server it started when the session ends."""
    if _ping(REDIS_URL):
        yield REDIS_URL
        return
    server = shutil.which("redis-server")
    if server is None:
        pytest.fail("redis-server is not installed (apt-get install -y redis-server) and "
                    f"nothing answers at {REDIS_URL}")
    port = urlparse(REDIS_URL).port or 6379
    subprocess.run([server, "--port", str(port), "--save", "", "--appendonly", "no", "--daemonize", "yes"],
                   check=True, capture_output=True)
    for _ in range(50):
        if _ping(REDIS_URL):
            break
        time.sleep(0.1)
    else:
        pytest.fail(f"redis-server did not come up at {REDIS_URL}")
    yield REDIS_URL
    import redis

    try:
        redis.Redis.from_url(REDIS_URL).shutdown(nosave=True)
    except (redis.RedisError, OSError):
        pass  # shutdown closes the connection under us


@pytest.fixture
def namespace() -> Iterator[str]:
    yield f"test-{uuid.uuid4().hex[:12]}"
