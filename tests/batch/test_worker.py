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
