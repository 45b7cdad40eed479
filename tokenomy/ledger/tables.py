"""The ledger's tables and their migrations (SQLAlchemy Core, SQLite and PostgreSQL), and those of the other
stores in the ledger's database: stored prompts, stored responses, conversations and their items, and the Batch
API's files, batches and items.

`schema_version` holds one integer: how many steps of MIGRATIONS have run. A step only adds (tables, columns,
indexes); nothing is ever dropped, so an older ledger keeps its rows through every upgrade. To change the
schema, append a step and add the new columns to `ledger` below; never edit a step that has shipped.
"""

from __future__ import annotations

from collections.abc import Callable

import sqlalchemy as sa
from sqlalchemy.engine import Connection

DOUBLE = sa.Float(precision=53)
metadata = sa.MetaData()


def _v1_columns() -> list[sa.Column]:
    return [
        sa.Column("request_id", sa.String(64), primary_key=True),
        sa.Column("ts", DOUBLE, nullable=False),
        sa.Column("tenant", sa.String(128), nullable=False),
        sa.Column("key_id", sa.String(64)),
        sa.Column("route", sa.String(128)),
        sa.Column("model", sa.String(128)),
        sa.Column("backend", sa.String(32)),
        sa.Column("cache", sa.String(16), nullable=False),
        sa.Column("prompt_tokens", sa.Integer, nullable=False),
        sa.Column("cached_tokens", sa.Integer, nullable=False),
        sa.Column("completion_tokens", sa.Integer, nullable=False),
        sa.Column("queue_s", DOUBLE),
        sa.Column("ttft_s", DOUBLE),
        sa.Column("tpot_s", DOUBLE),
        sa.Column("e2e_s", DOUBLE),
        sa.Column("status", sa.Integer, nullable=False),
        sa.Column("error_code", sa.String(64)),
        sa.Column("error", sa.Text),
        sa.Column("finish_reason", sa.String(32)),
        sa.Column("price_input", DOUBLE, nullable=False),
        sa.Column("price_cached_input", DOUBLE, nullable=False),
        sa.Column("price_output", DOUBLE, nullable=False),
        sa.Column("price_notional", sa.Boolean, nullable=False),
        sa.Column("cost_input_usd", DOUBLE, nullable=False),
        sa.Column("cost_cached_input_usd", DOUBLE, nullable=False),
        sa.Column("cost_output_usd", DOUBLE, nullable=False),
        sa.Column("cost_usd", DOUBLE, nullable=False),
        sa.Column("energy_j", DOUBLE),
        sa.Column("energy_source", sa.String(16)),
        sa.Column("saved_tokens", sa.Integer, nullable=False),
        sa.Column("saved_usd", DOUBLE, nullable=False),
        sa.Column("saved_by", sa.Text, nullable=False),
        sa.Column("over_budget", sa.Boolean, nullable=False),
    ]


def _v2_columns() -> list[sa.Column]:
    """The business layer: feedback joined to its request."""
    return [sa.Column("feedback_score", DOUBLE), sa.Column("feedback_comment", sa.Text),
            sa.Column("feedback_ts", DOUBLE)]


def _v4_columns() -> list[sa.Column]:
    """The context stage: prompt tokens before and after its work, what it did and cost, and the prompt-layout
    lint's finding (layout units of the prompt, of its reusable prefix, of the prefix the advice would give)."""
    return [sa.Column("context_tokens_before", sa.Integer), sa.Column("context_tokens_after", sa.Integer),
            sa.Column("context_actions", sa.Text), sa.Column("context_cost_usd", DOUBLE),
            sa.Column("context_s", DOUBLE), sa.Column("lint_units", sa.Integer), sa.Column("lint_prefix", sa.Integer),
            sa.Column("lint_potential", sa.Integer), sa.Column("lint_breaks", sa.Text)]


def _v5_columns() -> list[sa.Column]:
    """Which replica of a pooled model served (backends/pool.py); NULL for a model that is not pooled."""
    return [sa.Column("replica", sa.String(256))]


def _prompt_columns() -> list[sa.Column]:
    """Stored request bodies and answers (ledger.store_prompts), one per request id, pruned by age."""
    return [sa.Column("request_id", sa.String(64), primary_key=True), sa.Column("ts", DOUBLE, nullable=False),
            sa.Column("tenant", sa.String(128), nullable=False), sa.Column("request", sa.Text, nullable=False),
            sa.Column("answer", sa.Text)]


def _v6_columns() -> list[sa.Column]:
    """The batch a request belonged to (NULL for interactive requests): its row is priced at the batch price."""
    return [sa.Column("batch", sa.String(64))]


def _v7_columns() -> list[sa.Column]:
    """What the engine and the router did inside one answer: speculative draft tokens fed and accepted
    (engine/spec/speculate.py), and for an answer several models wrote (token-level routing) the handovers and each
    model's usage and cost (JSON: [{"model", "prompt_tokens", "cached_tokens", "completion_tokens", "cost_usd"}])."""
    return [sa.Column("draft_tokens", sa.Integer), sa.Column("draft_accepted", sa.Integer),
            sa.Column("handovers", sa.Integer), sa.Column("parts", sa.Text)]


def _v8_columns() -> list[sa.Column]:
    """Which API the client called (chat.completions, completions, messages, responses, embeddings); NULL on rows
    written before it was recorded, which were all chat.completions or completions."""
    return [sa.Column("api", sa.String(32))]


def _response_columns() -> list[sa.Column]:
    """Stored Responses API answers (ledger/responses_store.py), one per response id, pruned by age like stored
    prompts: the tenant and key that made it, the request id of its ledger row, the conversation the next turn
    continues (internal chat messages, JSON), the input items the request sent (JSON) and the response object
    (JSON)."""
    return [sa.Column("id", sa.String(64), primary_key=True), sa.Column("ts", DOUBLE, nullable=False),
            sa.Column("tenant", sa.String(128), nullable=False), sa.Column("key_id", sa.String(64)),
            sa.Column("request_id", sa.String(64), nullable=False), sa.Column("conversation", sa.Text, nullable=False),
            sa.Column("input_items", sa.Text, nullable=False), sa.Column("response", sa.Text, nullable=False)]


def _v10_columns() -> list[sa.Column]:
    """An upstream's prompt-cache writes (Anthropic's cache_creation_input_tokens): the tokens written (part of
    prompt_tokens, apart from cached_tokens), the rate they were priced at and their cost; NULL on rows written
    before they were recorded, which had none."""
    return [sa.Column("cache_write_tokens", sa.Integer), sa.Column("price_cache_write", DOUBLE),
            sa.Column("cost_cache_write_usd", DOUBLE)]


def _v11_columns() -> list[sa.Column]:
    """The request's OpenTelemetry trace id (32 hex digits, telemetry/trace.py): its trace when tracing is on, else the
    caller's traceparent's; NULL when neither, and on rows written before it was recorded."""
    return [sa.Column("trace_id", sa.String(32))]


def _batch_file_columns() -> list[sa.Column]:
    """The Batch API's files (batch/store.py): uploaded input files (purpose batch) and the output and error files
    a batch writes."""
    return [sa.Column("id", sa.String(64), primary_key=True),
            sa.Column("owner", sa.String(64), nullable=False, index=True),
            sa.Column("purpose", sa.String(32), nullable=False), sa.Column("filename", sa.String(256), nullable=False),
            sa.Column("bytes", sa.Integer, nullable=False), sa.Column("created_at", sa.Integer, nullable=False),
            sa.Column("content", sa.LargeBinary, nullable=False)]


BATCH_TIMES = ("in_progress_at", "finalizing_at", "completed_at", "failed_at", "expired_at", "cancelling_at",
               "cancelled_at")


def _batch_columns() -> list[sa.Column]:
    """One row per batch, in OpenAI's vocabulary (status, the *_at times, file ids, metadata), and the lease of
    the worker ending it."""
    return [sa.Column("id", sa.String(64), primary_key=True),
            sa.Column("owner", sa.String(64), nullable=False, index=True),
            sa.Column("tenant", sa.String(128), nullable=False), sa.Column("endpoint", sa.String(64), nullable=False),
            sa.Column("input_file_id", sa.String(64), nullable=False),
            sa.Column("completion_window", sa.String(16), nullable=False),
            sa.Column("status", sa.String(16), nullable=False, index=True),
            sa.Column("created_at", sa.Integer, nullable=False), sa.Column("expires_at", sa.Integer, nullable=False),
            *[sa.Column(t, sa.Integer) for t in BATCH_TIMES],
            sa.Column("output_file_id", sa.String(64)), sa.Column("error_file_id", sa.String(64)),
            sa.Column("errors", sa.Text), sa.Column("metadata", sa.Text),
            sa.Column("lease_owner", sa.String(64)), sa.Column("lease_until", DOUBLE)]


def _batch_item_columns() -> list[sa.Column]:
    """One row per input line of a batch: its custom_id and body, its state (pending | done | failed), how many
    times it was started, its result line, and the lease of the worker running it."""
    return [sa.Column("batch_id", sa.String(64), primary_key=True), sa.Column("line", sa.Integer, primary_key=True),
            sa.Column("custom_id", sa.String(256)), sa.Column("body", sa.Text),
            sa.Column("state", sa.String(16), nullable=False), sa.Column("attempts", sa.Integer, nullable=False),
            sa.Column("result", sa.Text), sa.Column("lease_owner", sa.String(64)), sa.Column("lease_until", DOUBLE)]


def _conversation_columns() -> list[sa.Column]:
    """The Conversations API's conversations (ledger/conversations_store.py): the tenant that made one, when, when
    it last changed (its retention runs from then), its metadata (JSON)."""
    return [sa.Column("id", sa.String(64), primary_key=True), sa.Column("tenant", sa.String(128), nullable=False),
            sa.Column("created_at", sa.Integer, nullable=False), sa.Column("ts", DOUBLE, nullable=False),
            sa.Column("metadata", sa.Text, nullable=False)]


def _conversation_item_columns() -> list[sa.Column]:
    """A conversation's items in order: its position, the item's id and the item as the API lists it (JSON)."""
    return [sa.Column("conversation_id", sa.String(64), primary_key=True),
            sa.Column("position", sa.Integer, primary_key=True), sa.Column("id", sa.String(64), nullable=False),
            sa.Column("item", sa.Text, nullable=False)]


def _v14_columns() -> list[sa.Column]:
    """The end user a request named (OpenAI `user`, Anthropic `metadata.user_id`); NULL when it named none, and on
    rows written before it was recorded."""
    return [sa.Column("user", sa.String(256))]


def _tenant_columns() -> list[sa.Column]:
    """Tenants made through the admin API (limits/key_store.py); config-file tenants are not stored. Budget,
    models and metadata are JSON; deleted_at set: gone (kept for the audit's sake)."""
    return [sa.Column("name", sa.String(128), primary_key=True), sa.Column("budget", sa.Text),
            sa.Column("models", sa.Text), sa.Column("rpm", sa.Integer), sa.Column("tpm", sa.Integer),
            sa.Column("metadata", sa.Text), sa.Column("created_at", DOUBLE, nullable=False),
            sa.Column("updated_at", DOUBLE, nullable=False), sa.Column("deleted_at", DOUBLE)]


def _api_key_columns() -> list[sa.Column]:
    """Keys made through the admin API: only the key's SHA-256 is stored; id = its first 12 hex characters (the
    ledger's key_id). role: user | tenant_admin | admin. revoked_at set: refused from then on."""
    return [sa.Column("id", sa.String(64), primary_key=True),
            sa.Column("key_sha256", sa.String(64), nullable=False, unique=True),
            sa.Column("name", sa.String(128), nullable=False), sa.Column("tenant", sa.String(128), nullable=False),
            sa.Column("role", sa.String(16), nullable=False), sa.Column("budget", sa.Text),
            sa.Column("models", sa.Text), sa.Column("rpm", sa.Integer), sa.Column("tpm", sa.Integer),
            sa.Column("expires_at", DOUBLE), sa.Column("metadata", sa.Text),
            sa.Column("created_at", DOUBLE, nullable=False), sa.Column("updated_at", DOUBLE, nullable=False),
            sa.Column("revoked_at", DOUBLE), sa.Column("rotated_to", sa.String(64))]


def _audit_columns() -> list[sa.Column]:
    """Every admin action: who (the admin key's id), what, on which key or tenant, when, and the record before
    and after (JSON, never a secret)."""
    return [sa.Column("id", sa.Integer, primary_key=True, autoincrement=True), sa.Column("ts", DOUBLE, nullable=False),
            sa.Column("actor", sa.String(64)), sa.Column("actor_tenant", sa.String(128)),
            sa.Column("action", sa.String(32), nullable=False), sa.Column("kind", sa.String(16), nullable=False),
            sa.Column("target", sa.String(128), nullable=False), sa.Column("tenant", sa.String(128)),
            sa.Column("before", sa.Text), sa.Column("after", sa.Text)]


# The current shape, for queries and inserts.
ledger = sa.Table("ledger", metadata, *_v1_columns(), *_v2_columns(), *_v4_columns(), *_v5_columns(),
                  *_v6_columns(), *_v7_columns(), *_v8_columns(), *_v10_columns(), *_v11_columns(),
                  *_v14_columns())
prompts = sa.Table("ledger_prompts", metadata, *_prompt_columns())
responses = sa.Table("stored_responses", metadata, *_response_columns())
batch_files = sa.Table("batch_files", metadata, *_batch_file_columns())
batches = sa.Table("batches", metadata, *_batch_columns())
batch_items = sa.Table("batch_items", metadata, *_batch_item_columns())
conversations = sa.Table("conversations", metadata, *_conversation_columns())
conversation_items = sa.Table("conversation_items", metadata, *_conversation_item_columns())


tenants = sa.Table("tenants", metadata, *_tenant_columns())
api_keys = sa.Table("api_keys", metadata, *_api_key_columns())
admin_audit = sa.Table("admin_audit", metadata, *_audit_columns())
# One row: bumped in the same transaction as every change to tenants or api_keys; gateways poll it.
keys_version = sa.Table("keys_version", metadata, sa.Column("version", sa.Integer, nullable=False))
schema_version = sa.Table("schema_version", metadata, sa.Column("version", sa.Integer, nullable=False))


def add_column(conn: Connection, table: str, column: sa.Column) -> None:
    """ALTER TABLE ... ADD COLUMN, rendered for the connection's dialect (new columns are nullable)."""
    ddl = column.type.compile(dialect=conn.dialect)
    conn.exec_driver_sql(f'ALTER TABLE {table} ADD COLUMN "{column.name}" {ddl}')


def _m1_create_ledger(conn: Connection) -> None:
    table = sa.Table("ledger", sa.MetaData(), *_v1_columns())
    table.create(conn)
    sa.Index("ix_ledger_ts", table.c.ts).create(conn)
    sa.Index("ix_ledger_tenant_ts", table.c.tenant, table.c.ts).create(conn)
    sa.Index("ix_ledger_key_ts", table.c.key_id, table.c.ts).create(conn)


def _m2_feedback(conn: Connection) -> None:
    for column in _v2_columns():
        add_column(conn, "ledger", column)


def _m3_prompts(conn: Connection) -> None:
    table = sa.Table("ledger_prompts", sa.MetaData(), *_prompt_columns())
    table.create(conn)
    sa.Index("ix_ledger_prompts_ts", table.c.ts).create(conn)


def _m4_context(conn: Connection) -> None:
    for column in _v4_columns():
        add_column(conn, "ledger", column)


def _m5_replica(conn: Connection) -> None:
    for column in _v5_columns():
        add_column(conn, "ledger", column)


def _m6_batch(conn: Connection) -> None:
    for column in _v6_columns():
        add_column(conn, "ledger", column)
    conn.exec_driver_sql("CREATE INDEX ix_ledger_batch ON ledger (batch)")


def _m7_inside(conn: Connection) -> None:
    for column in _v7_columns():
        add_column(conn, "ledger", column)


def _m8_api(conn: Connection) -> None:
    for column in _v8_columns():
        add_column(conn, "ledger", column)


def _m9_responses(conn: Connection) -> None:
    table = sa.Table("stored_responses", sa.MetaData(), *_response_columns())
    table.create(conn)
    sa.Index("ix_stored_responses_ts", table.c.ts).create(conn)


def _m10_cache_write(conn: Connection) -> None:
    for column in _v10_columns():
        add_column(conn, "ledger", column)


def _m11_trace(conn: Connection) -> None:
    for column in _v11_columns():
        add_column(conn, "ledger", column)


def _m12_batch_tables(conn: Connection) -> None:
    """The Batch API's tables. Before this step BatchStore made them itself (create_all, then the lease columns
    where they lacked them): a database that has them keeps them and their rows, and gains only what it lacks
    (the lease columns of tables from before leases, an index)."""
    inspector = sa.inspect(conn)
    for name, columns in (("batch_files", _batch_file_columns), ("batches", _batch_columns),
                          ("batch_items", _batch_item_columns)):
        table = sa.Table(name, sa.MetaData(), *columns())
        if not inspector.has_table(name):
            table.create(conn)
            continue
        have = {c["name"] for c in inspector.get_columns(name)}
        for column in table.columns:
            if column.name not in have:
                add_column(conn, name, column)
        indexed = {i["name"] for i in inspector.get_indexes(name)}
        for index in table.indexes:
            if index.name not in indexed:
                index.create(conn)


def _m13_conversations(conn: Connection) -> None:
    """The Conversations API's tables (self-contained: they reference no other table)."""
    table = sa.Table("conversations", sa.MetaData(), *_conversation_columns())
    table.create(conn)
    sa.Index("ix_conversations_ts", table.c.ts).create(conn)
    sa.Table("conversation_items", sa.MetaData(), *_conversation_item_columns()).create(conn)


def _m14_admin_plane(conn: Connection) -> None:
    """The admin plane: tenants, keys, their audit and the version gateways poll; the ledger's user column."""
    for column in _v14_columns():
        add_column(conn, "ledger", column)
    md = sa.MetaData()
    sa.Table("tenants", md, *_tenant_columns())
    sa.Table("api_keys", md, *_api_key_columns())
    audit = sa.Table("admin_audit", md, *_audit_columns())
    version = sa.Table("keys_version", md, sa.Column("version", sa.Integer, nullable=False))
    md.create_all(conn)
    sa.Index("ix_admin_audit_ts", audit.c.ts).create(conn)
    conn.execute(version.insert().values(version=0))
    conn.exec_driver_sql("CREATE INDEX ix_ledger_user_ts ON ledger (\"user\", ts)")


MIGRATIONS: list[Callable[[Connection], None]] = [_m1_create_ledger, _m2_feedback, _m3_prompts, _m4_context,
                                                  _m5_replica, _m6_batch, _m7_inside, _m8_api, _m9_responses,
                                                  _m10_cache_write, _m11_trace, _m12_batch_tables,
                                                  _m13_conversations, _m14_admin_plane]
BATCH_TABLES_VERSION = MIGRATIONS.index(_m12_batch_tables) + 1   # the schema version that has the batch tables


class LedgerSchemaError(RuntimeError):
    """The ledger's schema cannot be brought to this version (e.g. it is newer than this tokenomy knows)."""


def current_version(conn: Connection) -> int:
    if not sa.inspect(conn).has_table("schema_version"):
        return 0
    v = conn.execute(sa.select(schema_version.c.version)).scalar()
    return int(v or 0)


def migrate(conn: Connection, upto: int | None = None) -> tuple[int, int]:
    """Run the pending steps inside the caller's transaction; returns (version before, version after).
    The caller holds a write lock (BEGIN IMMEDIATE on SQLite, an advisory lock on PostgreSQL)."""
    target = len(MIGRATIONS) if upto is None else upto
    if conn.dialect.name == "postgresql":
        conn.exec_driver_sql("SELECT pg_advisory_xact_lock(7368251)")   # one migrator at a time
    schema_version.create(conn, checkfirst=True)
    before = current_version(conn)
    if before > len(MIGRATIONS):
        raise LedgerSchemaError(f"the ledger's schema is version {before}, newer than this tokenomy knows "
                          f"({len(MIGRATIONS)}); upgrade tokenomy to use it")
    if before == 0 and conn.execute(sa.select(sa.func.count()).select_from(schema_version)).scalar() == 0:
        conn.execute(schema_version.insert().values(version=0))
    for step in range(before, target):
        MIGRATIONS[step](conn)
    if target > before:
        conn.execute(schema_version.update().values(version=target))
    return before, max(before, target)
