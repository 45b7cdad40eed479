"""Ledger URLs for the meter tests: a fresh SQLite file, and a fresh PostgreSQL schema when
TOKENOMY_TEST_POSTGRES_URL is set (.ci/run sets it to postgresql+psycopg://postgres@127.0.0.1:5433/postgres)."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import pytest

PG_ENV = "TOKENOMY_TEST_POSTGRES_URL"


def pg_schema_url() -> Iterator[str]:
    """A URL whose search_path is a new, empty schema (dropped afterwards), so tests never touch public.ledger."""
    base = os.environ.get(PG_ENV)
    if not base:
        pytest.skip(f"{PG_ENV} is not set: no PostgreSQL server to test the ledger on")
    import sqlalchemy as sa

    schema = "tokenomy_test_" + uuid.uuid4().hex[:10]
    admin = sa.create_engine(base)
    with admin.begin() as conn:
        conn.exec_driver_sql(f"CREATE SCHEMA {schema}")
    sep = "&" if "?" in base else "?"
    try:
        yield f"{base}{sep}options={quote(f'-csearch_path={schema}')}"
    finally:
        with admin.begin() as conn:
            conn.exec_driver_sql(f"DROP SCHEMA {schema} CASCADE")
        admin.dispose()


@pytest.fixture(params=["sqlite", "postgresql"])
def ledger_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'ledger.db'}"
    else:
        yield from pg_schema_url()
