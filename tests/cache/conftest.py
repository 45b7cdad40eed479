"""Fixtures for the cache tests: fresh namespaces (the Redis server itself is tests/conftest.py's redis_url)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest


@pytest.fixture
def namespace() -> Iterator[str]:
    yield f"test-{uuid.uuid4().hex[:12]}"
