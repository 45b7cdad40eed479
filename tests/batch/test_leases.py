"""Several gateways on one database: leases keep each batch item to one worker and each batch's ending to one."""

from __future__ import annotations

import io
import json
import time

import openai
import pytest

from tests.api.test_batch_api import line, wait_done
from tests.conftest import NO_CACHE, SMALL_ENGINE, live_server
from tokenomy.batch.database import BatchStore
from tokenomy.ledger.ledger import Ledger

pytestmark = pytest.mark.slow       # a real engine, client or process (docs/testing.md)


def store_with_batch(tmp_path, n=3, clock=time.time):
    led = Ledger(f"sqlite:///{tmp_path / 'l.db'}")
    store = BatchStore(led.engine, clock=clock)
    text = "\n".join(line(f"k{i}", "hi") for i in range(n)).encode()
    f = store.create_file("k", "batch", "x.jsonl", text)
    b = store.create_batch("k", "t", f["id"], "/v1/chat/completions", "24h", None, text)
    return led, store, b["id"]


def test_an_item_claimed_by_one_worker_is_not_claimed_by_another_until_its_lease_runs_out(tmp_path):
    now = [1_000_000.0]
    led, store, bid = store_with_batch(tmp_path, clock=lambda: now[0])
    with led:
        a, b = store.pending(bid, 3, set(), "A"), store.pending(bid, 3, set(), "B")
        assert [i.line for i in a] == [i.line for i in b] == [0, 1, 2]
        assert store.claim(a[0], "A", lease_s=60)
        assert not store.claim(b[0], "B", lease_s=60)          # same item, read before A claimed it
        assert [i.line for i in store.pending(bid, 3, set(), "B")] == [1, 2]
        assert [i.line for i in store.pending(bid, 3, set())] == [0, 1, 2]   # still pending for the batch
        assert store.claim(a[1], "A", lease_s=30)
        now[0] += 29
        assert [i.line for i in store.pending(bid, 3, set(), "B")] == [2]   # A's leases still run
        now[0] += 2                                             # A's lease on line 1 ran out (A died)
        late = store.pending(bid, 3, set(), "B")
        assert [i.line for i in late] == [1, 2] and late[0].attempts == 1
        assert store.claim(late[0], "B", lease_s=60)            # B starts it again, as attempt 2
        store.renew("A", 60)
        store.release("A")                                       # A stops: its item 0 is free for B at once
        free = store.pending(bid, 3, set(), "B")
        assert [i.line for i in free] == [0, 1, 2]               # B's own lease on 1 does not hide it from B
        assert store.claim(free[0], "B", lease_s=60) and free[0].attempts == 1


def test_a_stale_read_cannot_start_an_item_twice_under_one_request_id(tmp_path):
    led, store, bid = store_with_batch(tmp_path, n=1)
    with led:
        stale = store.pending(bid, 1, set(), "B")[0]
        first = store.pending(bid, 1, set(), "A")[0]
        assert store.claim(first, "A", lease_s=60)
        store.release("A")
        assert not store.claim(stale, "B", lease_s=60)          # its start count is behind: read again
        assert store.claim(store.pending(bid, 1, set(), "B")[0], "B", lease_s=60)


def test_only_one_worker_ends_a_batch(tmp_path):
    now = [1_000_000.0]
    led, store, bid = store_with_batch(tmp_path, clock=lambda: now[0])
    with led:
        assert store.claim_batch(bid, "A", 60) and store.claim_batch(bid, "A", 60)
        assert not store.claim_batch(bid, "B", 60)
        assert store.claim_batch(bid, "A", 30)
        now[0] += 29
        assert not store.claim_batch(bid, "B", 60)              # A's lease still runs
        now[0] += 2
        assert store.claim_batch(bid, "B", 60)


def test_two_gateways_on_one_database_share_a_batch_and_run_each_request_once(tmp_path):
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    n = 12
    # one thread per engine, as the gateway's start-up warning asks when two engines share the cores: two 2-thread
    # OpenMP teams on 2 cores spin against each other and the 12 requests took 7-130 s instead of 2 s
    engine = {**SMALL_ENGINE, "n_threads": 1}
    config = {"engine": engine, "cache": NO_CACHE, "ledger": url, "batch": {"poll_s": 0.05, "concurrency": 2}}
    text = "\n".join(line(f"k{i}", f"Say the word number {i}.", max_tokens=8) for i in range(n))
    with live_server(config) as one, live_server(config) as two:
        c = openai.OpenAI(base_url=one.base_url, api_key="x", max_retries=0)
        f = c.files.create(file=("in.jsonl", io.BytesIO(text.encode())), purpose="batch")
        b = c.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h")
        for g in (one, two):
            g.gateway.batch_runner.wake()
        b = wait_done(openai.OpenAI(base_url=two.base_url, api_key="x", max_retries=0), b.id)
        out = [json.loads(x) for x in c.files.content(b.output_file_id).text.splitlines()]
        ran = (one.gateway.batch_runner.ran, two.gateway.batch_runner.ran)
        for g in (one, two):
            g.gateway.ledger.flush()
        rows = [r for r in one.gateway.ledger.query() if r.batch == b.id]
        files = [x for x in c.files.list() if x.filename.startswith(b.id)]
    assert b.status == "completed" and b.request_counts.completed == n
    assert sorted(o["custom_id"] for o in out) == sorted(f"k{i}" for i in range(n))
    assert sum(ran) == n and min(ran) > 0, ran                 # both worked, nothing ran twice
    assert len(rows) == n and len({r.request_id for r in rows}) == n
    assert len(files) == 1                                      # one output file: the batch ended once
