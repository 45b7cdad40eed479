"""A gateway stopped mid-batch and started again on the same database resumes without running anything twice."""

from __future__ import annotations

import io
import json
import re

import openai
import pytest

from tests.api.test_batch_api import line, wait_done
from tests.conftest import NO_CACHE, SMALL_ENGINE, live_server
from tests.helpers.wait import wait_until
from tokenomy.batch.database import BatchStore
from tokenomy.batch.input_lines import parse_input
from tokenomy.ledger.ledger import Ledger

N = 12


def base(request_id: str) -> str:
    """The item's own request id: a later start of it adds `_a<n>` (batch/runner.py's request_id)."""
    return re.sub(r"_a\d+$", "", request_id)


@pytest.mark.slow
@pytest.mark.parametrize("drain_s", [10.0, 0.0], ids=["drained", "cut"])
def test_a_restart_mid_batch_resumes_without_duplicates(tmp_path, drain_s):
    """drain_s 0 cuts the items in flight at the stop, as a slow machine does when they outlast the drain: a start
    cut short is billed on its own row (499) and the item runs again under another request id."""
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    config = {"engine": SMALL_ENGINE, "cache": NO_CACHE, "ledger": url,
              "batch": {"poll_s": 0.1, "concurrency": 2, "drain_s": drain_s}}
    text = "\n".join(line(f"k{i}", f"Say the word number {i}.", max_tokens=12) for i in range(N))
    with live_server(config) as first:
        c = openai.OpenAI(base_url=first.base_url, api_key="x", max_retries=0)
        f = c.files.create(file=("in.jsonl", io.BytesIO(text.encode())), purpose="batch")
        b = c.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h")
        wait_until(lambda: c.batches.retrieve(b.id).request_counts.completed >= 3, 120, interval=0.1,
                   what="three items done")
    with Ledger(url) as led:
        done_before = {r.request_id for r in led.query() if r.batch == b.id and r.status == 200}
    assert 3 <= len(done_before) < N
    with live_server(config) as second:
        c = openai.OpenAI(base_url=second.base_url, api_key="x", max_retries=0)
        b = wait_done(c, b.id)
        assert b.status == "completed" and b.request_counts.completed == N
        out = [json.loads(x) for x in c.files.content(b.output_file_id).text.splitlines()]
        second.gateway.ledger.flush()
        rows = [r for r in second.gateway.ledger.query() if r.batch == b.id]
    assert sorted(o["custom_id"] for o in out) == sorted(f"k{i}" for i in range(N))
    answered = {r.request_id for r in rows if r.status == 200}
    assert len(answered) == N == len({base(r) for r in answered})            # each item answered once
    assert {o["response"]["request_id"] for o in out} == answered
    assert done_before <= answered                            # finished before the stop: not run again
    cut = [r for r in rows if r.status != 200]
    assert all(r.status == 499 and r.request_id not in answered for r in cut), [(r.request_id, r.status) for r in cut]
    assert {base(r.request_id) for r in cut} <= {base(r) for r in answered - done_before}


def test_malformed_lines_become_error_lines_and_runnable_ones_items(tmp_path):
    ok = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    lines = ["", "[1]", json.dumps({"custom_id": "a", "url": "/v1/chat/completions", "body": ok}),
             json.dumps({"custom_id": "a", "url": "/v1/chat/completions", "body": {}}),
             json.dumps({"custom_id": "b", "method": "GET", "url": "/v1/chat/completions", "body": {}}),
             json.dumps({"url": "/v1/chat/completions", "body": {}})]
    parsed = list(parse_input("\n".join(lines).encode(), "/v1/chat/completions"))
    assert [(cid, body is not None) for cid, body, _ in parsed] == [
        (None, False), ("a", True), ("a", False), ("b", False), (None, False)]
    assert all(err is None or set(err["error"]) == {"code", "message"} for _, _, err in parsed)
    with Ledger(f"sqlite:///{tmp_path / 'l.db'}") as led:
        store = BatchStore(led.engine)
        f = store.create_file("k", "batch", "x.jsonl", "\n".join(lines).encode())
        b = store.create_batch("k", "t", f["id"], "/v1/chat/completions", "24h", None, b"\n".join(
            x.encode() for x in lines))
        assert b["request_counts"] == {"total": 5, "completed": 0, "failed": 4}
        assert store.get_batch(b["id"], "someone else") is None and store.get_file(f["id"], "other") is None
