"""The ledger on SQLite and (when TOKENOMY_TEST_POSTGRES_URL is set) PostgreSQL."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest
import sqlalchemy as sa

from tests.helpers.synthetic import Spec, mixed, rows_for
from tests.helpers.wait import wait_until
from tokenomy.ledger import tables as schema
from tokenomy.ledger.ledger import Ledger, LedgerError, normalize_url
from tokenomy.ledger.row import LedgerRow

ROOT = Path(__file__).resolve().parents[2]


def test_rows_round_trip_in_order(ledger_url):
    rows = rows_for(mixed())
    with Ledger(ledger_url) as led:
        for r in reversed(rows):
            led.write(r)
        assert led.flush()
        got = led.query()
        assert got == sorted(rows, key=lambda r: r.ts)
        assert led.written == len(rows) and led.dropped == 0 and led.failed == 0
        # filters and the half-open time window
        assert [r.request_id for r in led.query(tenant="beta")] == [r.request_id for r in got if r.tenant == "beta"]
        assert [r.request_id for r in led.query(model="small", key_id="k2")] == \
            [r.request_id for r in got if r.model == "small" and r.key_id == "k2"]
        t = got[3].ts
        assert [r.request_id for r in led.query(since=t, until=got[6].ts)] == [r.request_id for r in got[3:6]]
        assert len(led.query(limit=2)) == 2
        assert led.get(rows[0].request_id) == rows[0] and led.get("nope") is None
        with pytest.raises(ValueError, match="after"):
            led.query(since=t + 1, until=t)


def test_totals_count_cost_and_billed_tokens(ledger_url):
    rows = rows_for(mixed())
    with Ledger(ledger_url) as led:
        for r in rows:
            led.write(r)
        led.flush()
        by_tenant = led.totals(0, by="tenant")
        by_key = led.totals(0, by="key_id")
    for tenant in {r.tenant for r in rows}:
        mine = [r for r in rows if r.tenant == tenant]
        assert by_tenant[tenant][0] == pytest.approx(sum(r.cost_usd for r in mine))
        assert by_tenant[tenant][1] == sum(r.billed_tokens for r in mine)
    assert by_key[None][1] == sum(r.billed_tokens for r in rows if r.key_id is None)


def test_feedback_joins_the_row(ledger_url):
    rows = rows_for([Spec("small", 10, 0, 3), Spec("large", 20, 0, 4)])
    with Ledger(ledger_url) as led:
        for r in rows:
            led.write(r)
        # no flush: feedback right after the request must find the row still in the queue
        assert led.feedback(rows[1].request_id, 0.5, "useful")
        assert led.feedback(rows[1].request_id, -1, None)      # a second call replaces the first
        assert not led.feedback("req_unknown", 1.0)
        got = led.get(rows[1].request_id)
        assert (got.feedback_score, got.feedback_comment) == (-1.0, None) and got.feedback_ts is not None
        assert led.get(rows[0].request_id).feedback_score is None
        for bad in (1.5, float("nan"), "1", True):
            with pytest.raises(ValueError, match="score"):
                led.feedback(rows[0].request_id, bad)
        with pytest.raises(ValueError, match="comment"):
            led.feedback(rows[0].request_id, 0, "x" * 5000)


def test_close_drains_the_queue(ledger_url):
    rows = rows_for([Spec("small", 10, 0, 1, ago_s=i) for i in range(600)])
    led = Ledger(ledger_url, batch_size=50)
    for r in rows:
        led.write(r)
    led.close()
    led.close()                                     # idempotent
    led.write(rows[0])                              # after close: counted, not raised
    assert led.dropped == 1
    with Ledger(ledger_url) as again:
        assert len(again.query()) == 600


def test_write_never_blocks_a_full_queue_drops_and_counts(ledger_url):
    led = Ledger(ledger_url, max_queue=2)
    gate, original = threading.Event(), led._commit

    def slow_commit(rows: list[LedgerRow], *stored: object) -> None:      # a stalled database, until the gate
        gate.wait()
        original(rows, *stored)

    led._commit = slow_commit                           # type: ignore[method-assign]
    rows = rows_for([Spec("small", 10, 0, 1, ago_s=i) for i in range(50)])
    try:
        led.write(rows[0])
        wait_until(lambda: led.pending == 0, what="the writer to take row 0")      # and be stuck on it
        writes = threading.Thread(target=lambda: [led.write(r) for r in rows[1:]])
        writes.start()
        # They return while the database is still stalled (the gate opens only below): none waited for it.
        # (What a write costs: bench/ledger_write.py.)
        wait_until(lambda: not writes.is_alive(), what="49 writes against a stalled database")
        assert led.dropped == 47 and led.pending == 2
    finally:
        gate.set()
    led.close()
    with Ledger(ledger_url) as again:
        assert [r.request_id for r in again.query()] == [r.request_id for r in sorted(rows[:3], key=lambda r: r.ts)]


def test_a_duplicate_request_id_fails_alone(ledger_url):
    rows = rows_for([Spec("small", 10, 0, 1, ago_s=i) for i in range(5)])
    with Ledger(ledger_url) as led:
        led.write(rows[0])
        led.flush()
        for r in rows:                                  # rows[0] again, in one batch with the others
            led.write(r)
        led.flush()
        assert led.failed == 1 and led.written == 5
        assert len(led.query()) == 5


KILL_SCRIPT = textwrap.dedent("""
    import sys, time
    from tokenomy.ledger.ledger import Ledger
    from tokenomy.ledger.row import LedgerRow
    url, n = sys.argv[1], int(sys.argv[2])
    led = Ledger(url)
    t = time.time()
    for i in range(n):
        led.write(LedgerRow(request_id=f"flushed_{i:05d}", ts=t + i, completion_tokens=i))
    assert led.flush()
    print("flushed", flush=True)
    i = 0
    while True:                      # keep writing until killed: some committed, some queued
        led.write(LedgerRow(request_id=f"later_{i:07d}", ts=t + n + i))
        i += 1
        if i % 100 == 0:
            time.sleep(0.001)
""")


def committed(url: str, prefix: str) -> int:
    """Rows whose request id starts with `prefix` that another process has committed to the ledger at `url`."""
    engine = sa.create_engine(normalize_url(url))
    try:
        with engine.connect() as conn:
            return conn.execute(sa.select(sa.func.count()).select_from(schema.ledger)
                                .where(schema.ledger.c.request_id.startswith(prefix))).scalar_one()
    finally:
        engine.dispose()


def test_kill_9_loses_at_most_uncommitted_rows(ledger_url):
    n = 300
    child = subprocess.Popen([sys.executable, "-c", KILL_SCRIPT, ledger_url, str(n)], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, cwd=ROOT,
                             env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        line = child.stdout.readline()
        assert line.strip() == "flushed", child.stderr.read()
        wait_until(lambda: committed(ledger_url, "later_"), interval=0.05, what="a row after the flush to commit")
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(10)
    assert child.returncode == -signal.SIGKILL
    with Ledger(ledger_url) as led:
        rows = led.query()
        if ledger_url.startswith("sqlite"):
            with led.engine.connect() as conn:
                assert conn.exec_driver_sql("PRAGMA integrity_check").scalar() == "ok"
    ids = [r.request_id for r in rows]
    assert ids[:n] == [f"flushed_{i:05d}" for i in range(n)]           # every flushed row survived
    assert [r.completion_tokens for r in rows[:n]] == list(range(n))
    later = ids[n:]
    assert later == [f"later_{i:07d}" for i in range(len(later))]     # what else survived is a committed prefix


def test_migrates_an_old_ledger_without_losing_rows(ledger_url):
    engine = sa.create_engine(normalize_url(ledger_url))
    with engine.begin() as conn:
        assert schema.migrate(conn, upto=1) == (0, 1)
        v1 = sa.Table("ledger", sa.MetaData(), autoload_with=conn)
        assert "feedback_score" not in v1.c
        row = rows_for([Spec("small", 10, 0, 2)])[0].to_db()
        conn.execute(v1.insert().values({k: v for k, v in row.items() if k in v1.c}))
    engine.dispose()
    with Ledger(ledger_url) as led:
        [got] = led.query()
        assert got.request_id == row["request_id"] and got.completion_tokens == 2
        assert led.feedback(got.request_id, 1.0, "kept")
        with led.engine.connect() as conn:
            assert schema.current_version(conn) == len(schema.MIGRATIONS)
    with Ledger(ledger_url) as again:                   # a second open is a no-op
        assert again.get(row["request_id"]).feedback_comment == "kept"


def test_cache_write_columns_arrive_by_migration_and_read_as_zero_on_older_rows(ledger_url):
    engine = sa.create_engine(normalize_url(ledger_url))
    step = schema.MIGRATIONS.index(schema._m10_cache_write)
    with engine.begin() as conn:
        schema.migrate(conn, upto=step)
        before = sa.Table("ledger", sa.MetaData(), autoload_with=conn)
        assert "cache_write_tokens" not in before.c
        row = rows_for([Spec("small", 10, 0, 2)])[0].to_db()
        conn.execute(before.insert().values({k: v for k, v in row.items() if k in before.c}))
    engine.dispose()
    with Ledger(ledger_url) as led:
        [got] = led.query()
        assert (got.cache_write_tokens, got.cost_cache_write_usd, got.price_cache_write) == (0, 0.0, None)
        written = rows_for([Spec("small", 10, 0, 2)])[0]
        written.request_id, written.cache_write_tokens, written.cost_cache_write_usd = "req_w", 4, 1e-6
        led.write(written)
        assert led.flush()
        assert (led.get("req_w").cache_write_tokens, led.get("req_w").cost_cache_write_usd) == (4, 1e-6)


def test_trace_id_arrives_by_migration_and_reads_as_null_on_older_rows(ledger_url):
    engine = sa.create_engine(normalize_url(ledger_url))
    step = schema.MIGRATIONS.index(schema._m11_trace)
    with engine.begin() as conn:
        schema.migrate(conn, upto=step)
        before = sa.Table("ledger", sa.MetaData(), autoload_with=conn)
        assert "trace_id" not in before.c
        row = rows_for([Spec("small", 10, 0, 2)])[0].to_db()
        conn.execute(before.insert().values({k: v for k, v in row.items() if k in before.c}))
    engine.dispose()
    with Ledger(ledger_url) as led:
        [got] = led.query()
        assert got.trace_id is None
        written = rows_for([Spec("small", 10, 0, 2)])[0]
        written.request_id, written.trace_id = "req_t", "4bf92f3577b34da6a3ce929d0e0e4736"
        led.write(written)
        assert led.flush()
        assert led.get("req_t").trace_id == "4bf92f3577b34da6a3ce929d0e0e4736"


def test_a_newer_schema_is_refused(ledger_url):
    Ledger(ledger_url).close()
    engine = sa.create_engine(normalize_url(ledger_url))
    with engine.begin() as conn:
        conn.execute(schema.schema_version.update().values(version=len(schema.MIGRATIONS) + 1))
    engine.dispose()
    with pytest.raises(LedgerError, match="newer than this tokenomy"):
        Ledger(ledger_url)


def test_urls(tmp_path, monkeypatch):
    monkeypatch.setenv("TOKENOMY_HOME", str(tmp_path / "home"))
    assert normalize_url(None) == f"sqlite:///{tmp_path / 'home' / 'ledger.db'}"
    assert normalize_url("postgresql://u@h/db") == "postgresql+psycopg://u@h/db"
    assert normalize_url("postgres://u@h/db") == "postgresql+psycopg://u@h/db"
    assert normalize_url("x/led.db") == "sqlite:///x/led.db"
    with pytest.raises(LedgerError, match="use sqlite"):
        normalize_url("mysql://u@h/db")
    with pytest.raises(LedgerError, match="does not exist"):
        Ledger(f"sqlite:///{tmp_path}/missing/dir/led.db")
    monkeypatch.chdir(tmp_path)
    with Ledger() as led:                              # default: ledger.db in the data directory, made on first use
        led.write(rows_for([Spec("small", 1, 0, 1)])[0])
    assert (tmp_path / "home" / "ledger.db").exists() and not (tmp_path / "tokenomy.db").exists()
    with sa.create_engine(f"sqlite:///{tmp_path / 'home' / 'ledger.db'}").connect() as conn:
        assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"


def test_an_unreachable_database_is_a_clear_error():
    with pytest.raises(LedgerError, match="cannot open the ledger"):
        Ledger("postgresql://nobody@127.0.0.1:1/none?connect_timeout=2")


def test_a_row_that_cannot_be_encoded_is_lost_alone(ledger_url):
    rows = rows_for([Spec("small", 10, 0, 1, ago_s=i) for i in range(60)])
    rows[30].error = "bad \ud800 text"              # no database can store a lone surrogate
    with Ledger(ledger_url, batch_size=64) as led:
        for r in rows:
            led.write(r)
        assert led.flush()
        assert led.failed == 1 and led.written == 59
        assert {r.request_id for r in led.query()} == {r.request_id for i, r in enumerate(rows) if i != 30}


def _release_batch_tables(conn: sa.Connection, leases: bool) -> None:
    """The batch tables as BatchStore made them before they were migrations (metadata.create_all), with the lease
    columns or as before leases, and a file, a batch and an item in them."""
    old = sa.MetaData()
    for name, columns in (("batch_files", schema._batch_file_columns), ("batches", schema._batch_columns),
                          ("batch_items", schema._batch_item_columns)):
        sa.Table(name, old, *[c for c in columns() if leases or not c.name.startswith("lease_")])
    old.create_all(conn)
    t = old.tables
    conn.execute(t["batch_files"].insert().values(id="file-1", owner="k", purpose="batch", filename="in.jsonl",
                                                 bytes=2, created_at=1, content=b"{}"))
    conn.execute(t["batches"].insert().values(id="batch_1", owner="k", tenant="t", endpoint="/v1/chat/completions",
                                             input_file_id="file-1", completion_window="24h", status="in_progress",
                                             created_at=1, expires_at=2))
    conn.execute(t["batch_items"].insert().values(batch_id="batch_1", line=0, custom_id="c", body="{}",
                                                 state="pending", attempts=0))


@pytest.mark.parametrize("leases", [True, False], ids=["with-leases", "before-leases"])
def test_batch_tables_made_by_the_last_release_are_migrated_with_their_rows(ledger_url, leases):
    from tokenomy.batch.database import BatchStore

    engine = sa.create_engine(normalize_url(ledger_url))
    with engine.begin() as conn:
        schema.migrate(conn, upto=schema.BATCH_TABLES_VERSION - 1)
        _release_batch_tables(conn, leases)
    engine.dispose()
    with Ledger(ledger_url) as led:
        with led.engine.connect() as conn:
            assert schema.current_version(conn) == len(schema.MIGRATIONS)
        inspector = sa.inspect(led.engine)
        for table in (schema.batch_files, schema.batches, schema.batch_items):
            assert {c["name"] for c in inspector.get_columns(table.name)} == set(table.c.keys())
        assert {i["name"] for i in inspector.get_indexes("batches")} >= {"ix_batches_owner", "ix_batches_status"}
        store = BatchStore(led.engine)
        assert store.get_file("file-1", "k")["filename"] == "in.jsonl"
        assert store.get_batch("batch_1", "k")["status"] == "in_progress"
        [item] = store.pending("batch_1", 10, set())
        assert item.custom_id == "c" and store.claim(item, "w", 60)


def test_a_new_ledger_has_the_batch_tables_and_a_batch_store_needs_them(ledger_url):
    from tokenomy.batch.database import BatchStore

    bare = sa.create_engine(normalize_url(ledger_url))
    with pytest.raises(RuntimeError, match="no batch tables"):
        BatchStore(bare)
    bare.dispose()
    with Ledger(ledger_url) as led:
        store = BatchStore(led.engine)
        f = store.create_file("k", "batch", "x.jsonl", b"{}")
        assert store.list_files("k") == [f] and store.get_file(f["id"], "other") is None
