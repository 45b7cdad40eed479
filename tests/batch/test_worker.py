"""The batch runner against its store on a hand-moved clock: a batch past its completion window expires."""

from __future__ import annotations

import asyncio
import json

from tests.batch.test_leases import store_with_batch
from tokenomy.batch.database import WINDOW_S
from tokenomy.batch.worker import BatchRunner


def test_a_batch_past_its_window_expires_and_its_pending_items_fail_with_batch_expired(tmp_path):
    now = [4_000_000_000.0]                    # 2096: the wall clock would not expire it
    led, store, bid = store_with_batch(tmp_path, clock=lambda: now[0])
    started = []

    async def handle(ctx):                     # the pipeline: never reached, the window is over first
        started.append(ctx)

    with led:
        runner = BatchRunner(store, handle)
        now[0] += WINDOW_S["24h"] + 1
        asyncio.run(runner.tick())
        batch = store.get_batch(bid, "k")
        assert batch["status"] == "expired" and batch["expired_at"] == int(now[0])
        assert not started and batch["request_counts"] == {"total": 3, "completed": 0, "failed": 3}
        errors = [json.loads(x) for x in store.get_file(batch["error_file_id"], "k")["content"].splitlines()]
        assert [e["custom_id"] for e in errors] == ["k0", "k1", "k2"]
        assert {e["error"]["code"] for e in errors} == {"batch_expired"}


def test_an_item_whose_start_keeps_failing_fails_after_max_attempts_and_the_batch_completes(tmp_path, monkeypatch):
    """An exception the pipeline does not turn into an APIError (the UnicodeEncodeError of issue 50) is retried a
    bounded number of times, then its line fails with internal_error; the other items and the batch go on."""
    from tokenomy.batch import worker
    from tokenomy.errors import APIError

    monkeypatch.setattr(worker, "RETRY_S", 0.0)         # retry at once: the test counts starts, not seconds
    led, store, bid = store_with_batch(tmp_path)
    starts: dict[str, int] = {}

    async def handle(ctx):
        line = ctx.request_id.split("_")[2]
        starts[line] = starts.get(line, 0) + 1
        if line == "1":
            raise UnicodeEncodeError("utf-8", "x\ud800", 1, 2, "surrogates not allowed")
        raise APIError(400, "refused by the pipeline", code="invalid_value")

    async def run(runner: BatchRunner) -> None:
        for _ in range(20):                              # bounded: a loop for ever fails the test, not hangs it
            await runner.tick()
            await asyncio.gather(*runner.inflight.values())
            if store.get_batch(bid, "k")["status"] == "completed":
                return

    with led:
        runner = BatchRunner(store, handle, max_attempts=3)
        asyncio.run(run(runner))
        batch = store.get_batch(bid, "k")
        assert batch["status"] == "completed", batch
        assert starts == {"0": 1, "1": 3, "2": 1}
        errors = [json.loads(x) for x in store.get_file(batch["error_file_id"], "k")["content"].splitlines()]
        by_id = {e["custom_id"]: e for e in errors}
        assert by_id["k1"]["error"]["code"] == "internal_error" and "3 times" in by_id["k1"]["error"]["message"]
        assert by_id["k0"]["response"]["status_code"] == 400


def test_an_item_stored_before_lines_were_checked_fails_as_its_line_and_never_reaches_the_pipeline(tmp_path):
    led, store, bid = store_with_batch(tmp_path, n=1)
    started = []

    async def handle(ctx):
        started.append(ctx)

    with led:
        with store.engine.begin() as conn:          # a body an older gateway stored unchecked
            conn.exec_driver_sql("UPDATE batch_items SET body = ?", (json.dumps(
                {"model": "m", "messages": [{"role": "user", "content": "x\ud800"}]}),))
        runner = BatchRunner(store, handle)

        async def run() -> None:
            for _ in range(5):
                await runner.tick()
                await asyncio.gather(*runner.inflight.values())

        asyncio.run(run())
        batch = store.get_batch(bid, "k")
        assert batch["status"] == "completed" and not started
        [error] = [json.loads(x) for x in store.get_file(batch["error_file_id"], "k")["content"].splitlines()]
        assert error["response"]["status_code"] == 400
        assert error["response"]["body"]["error"]["code"] == "invalid_encoding"
