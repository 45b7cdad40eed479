"""Ledger URLs for tests: a fresh SQLite file, and a fresh schema on the session's PostgreSQL
(tests/conftest.py's postgres_url: $TOKENOMY_TEST_POSTGRES_URL, else a server from the pgserver wheel); the
`ledger_url` fixture over both is in tests/conftest.py."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from urllib.parse import quote


def pg_schema_url(base: str) -> Iterator[str]:
    """A URL whose search_path is a new, empty schema (dropped afterwards), so tests never touch public.ledger."""
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
