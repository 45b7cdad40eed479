"""The Batch API through the official openai client, unchanged, on a live tokenomy with the real SmolLM2 model."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from typing import Any

import openai
import pytest

from tests.conftest import NO_CACHE, SMALL_ENGINE, live_server
from tests.helpers.answers import assert_chat_end
from tests.helpers.wait import wait_until

pytestmark = pytest.mark.slow       # a real engine, client or process (docs/testing.md)

MODEL = "smollm2-135m-instruct"
KEYS = [{"key": "sk-batch-a", "tenant": "a", "name": "a"}, {"key": "sk-batch-b", "tenant": "b", "name": "b"}]


def line(cid: str, text: str, max_tokens: int = 3, **extra: Any) -> str:
    body = {"model": MODEL, "messages": [{"role": "user", "content": text}], "max_tokens": max_tokens,
            "temperature": 0, **extra}
    return json.dumps({"custom_id": cid, "method": "POST", "url": "/v1/chat/completions", "body": body})


def wait_done(client: openai.OpenAI, batch_id: str, timeout: float = 120) -> Any:
    def ended() -> Any:
        b = client.batches.retrieve(batch_id)
        return b if b.status in ("completed", "failed", "cancelled", "expired") else None

    return wait_until(ended, timeout, interval=0.2, what=f"batch {batch_id} to end")


def jsonl(client: openai.OpenAI, file_id: str | None) -> list[dict[str, Any]]:
    if file_id is None:
        return []
    return [json.loads(x) for x in client.files.content(file_id).text.splitlines() if x.strip()]


@pytest.fixture(scope="module")
def keyed() -> Iterator[Any]:
    with live_server({"engine": SMALL_ENGINE, "cache": NO_CACHE, "keys": KEYS, "batch": {"poll_s": 0.1}}) as s:
        yield s


def client_for(server: Any, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url, api_key=key, max_retries=0, timeout=60)


def test_the_official_client_submits_a_batch_and_reads_results_and_errors(keyed):
    a = client_for(keyed, "sk-batch-a")
    text = "\n".join([
        line("r1", "Say hi."), line("r2", "Name a color."), "{not json", line("r2", "a repeated custom_id"),
        json.dumps({"custom_id": "r4", "method": "POST", "url": "/v1/embeddings", "body": {}}),
        line("r5", "Bad.", max_tokens=0), line("r6", "Count to three."),
    ]) + "\n"
    f = a.files.create(file=("in.jsonl", io.BytesIO(text.encode())), purpose="batch")
    assert f.object == "file" and f.purpose == "batch" and f.bytes == len(text.encode())
    b = a.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h",
                         metadata={"job": "t"})
    assert b.object == "batch" and b.status == "validating" and b.metadata == {"job": "t"}
    b = wait_done(a, b.id)
    assert b.status == "completed" and b.completed_at and b.in_progress_at
    assert (b.request_counts.total, b.request_counts.completed, b.request_counts.failed) == (7, 3, 4)
    out = jsonl(a, b.output_file_id)
    assert [o["custom_id"] for o in out] == ["r1", "r2", "r6"]
    for o in out:
        assert o["error"] is None and o["response"]["status_code"] == 200
        body = o["response"]["body"]
        assert body["object"] == "chat.completion"
        assert_chat_end(body["choices"][0]["finish_reason"], body["usage"]["completion_tokens"], 3)
        assert isinstance(body["choices"][0]["message"]["content"], str)
    errors = jsonl(a, b.error_file_id)
    assert [e["custom_id"] for e in errors] == [None, "r2", "r4", "r5"]
    for e in errors[:3]:                       # malformed lines: OpenAI's batch error shape
        assert e["response"] is None and set(e["error"]) == {"code", "message"}
    assert errors[0]["error"]["code"] == "invalid_json" and "line 3" in errors[0]["error"]["message"]
    bad = errors[3]["response"]                # a body that does not validate: its status and error body
    assert bad["status_code"] == 400 and set(bad["body"]["error"]) == {"message", "type", "param", "code"}
    # the ledger: one row per generated request, marked with the batch, at the batch price, under key a
    keyed.gateway.ledger.flush()
    rows = [r for r in keyed.gateway.ledger.query() if r.batch == b.id]
    assert sorted(r.request_id for r in rows) == sorted(o["response"]["request_id"] for o in out)
    price = keyed.gateway.config.model(MODEL).price
    ok = [r for r in rows if r.status == 200]
    assert all(r.price_output == pytest.approx(price.output * (1 - price.batch_discount)) for r in ok)
    assert all(r.tenant == "a" for r in rows)


def test_another_key_cannot_see_files_or_batches(keyed):
    a, other = client_for(keyed, "sk-batch-a"), client_for(keyed, "sk-batch-b")
    f = a.files.create(file=("in.jsonl", io.BytesIO((line("x", "Hi.") + "\n").encode())), purpose="batch")
    b = a.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h")
    for call in (lambda: other.files.retrieve(f.id), lambda: other.files.content(f.id),
                 lambda: other.batches.retrieve(b.id), lambda: other.batches.cancel(b.id),
                 lambda: other.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions",
                                              completion_window="24h")):
        with pytest.raises(openai.NotFoundError):
            call()
    assert b.id not in [x.id for x in other.batches.list().data]
    assert b.id in [x.id for x in a.batches.list().data]
    with pytest.raises(openai.AuthenticationError):
        client_for(keyed, "sk-nobody").batches.retrieve(b.id)
    wait_done(a, b.id)


def test_cancel_stops_a_batch(keyed):
    a = client_for(keyed, "sk-batch-a")
    # ignore_eos: every item runs its 40 tokens, however briefly the model would answer, so the batch is still
    # running when it is cancelled
    text = "\n".join(line(f"c{i}", f"Write a long story about the number {i}.", max_tokens=40, ignore_eos=True)
                     for i in range(40))
    f = a.files.create(file=("in.jsonl", io.BytesIO(text.encode())), purpose="batch")
    b = a.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h")
    wait_until(lambda: a.batches.retrieve(b.id).request_counts.completed > 0, interval=0.05,
               what="the batch to be under way")
    c = a.batches.cancel(b.id)
    assert c.status in ("cancelling", "cancelled") and c.cancelling_at
    b = wait_done(a, b.id)
    assert b.status == "cancelled" and b.cancelled_at
    n = b.request_counts
    assert n.total == 40 and n.completed < 40 and n.completed + n.failed == 40
    errors = jsonl(a, b.error_file_id)
    assert errors and all(e["error"]["code"] == "batch_cancelled" for e in errors)
    assert len(jsonl(a, b.output_file_id)) == n.completed
    # nothing of it runs any more, nor can start: the runner holds no item of it and none is pending
    assert not [key for key in list(keyed.gateway.batch_runner.inflight) if key[0] == b.id]
    assert keyed.gateway.batches.pending(b.id, 1, set()) == []
    keyed.gateway.ledger.flush()
    rows = [r for r in keyed.gateway.ledger.query() if r.batch == b.id]
    assert len([r for r in rows if r.status == 200]) >= n.completed     # each finished item has its row


def test_cli_submits_follows_and_fetches_results(keyed, tmp_path):
    from typer.testing import CliRunner

    from tokenomy.cli import app

    src = tmp_path / "in.jsonl"
    src.write_text(line("q1", "Hi.") + "\n" + line("q2", "Yo.") + "\n")
    env = {"TOKENOMY_BASE_URL": keyed.base_url, "OPENAI_API_KEY": "sk-batch-a"}
    r = CliRunner().invoke(app, ["batch", "submit", str(src), "--poll", "0.2"], env=env)
    assert r.exit_code == 0, r.output
    batch_id = r.output.split()[0]
    assert "completed" in r.output and "2/2 done" in r.output
    r = CliRunner().invoke(app, ["batch", "status", batch_id], env=env)
    assert r.exit_code == 0 and "completed" in r.output
    out = tmp_path / "out.jsonl"
    r = CliRunner().invoke(app, ["batch", "results", batch_id, "-o", str(out)], env=env)
    assert r.exit_code == 0 and sorted(json.loads(x)["custom_id"] for x in out.read_text().splitlines()) == ["q1", "q2"]
