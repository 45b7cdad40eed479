"""A batch input file goes through the checks every HTTP body gets, line by line, and a batch's creation holds its
file's bytes and one chunk of items, not an object per line (issue 50)."""

from __future__ import annotations

import json
import tracemalloc

from tokenomy.batch.database import BatchStore
from tokenomy.batch.input_lines import count_lines, parse_input
from tokenomy.dialect.json_input import MAX_JSON_DEPTH
from tokenomy.ledger.ledger import Ledger

CHAT = "/v1/chat/completions"
MODEL = "smollm2-135m-instruct"


def line(cid: str, content: str = "hi", **body) -> str:
    return json.dumps({"custom_id": cid, "method": "POST", "url": CHAT,
                       "body": {"model": MODEL, "messages": [{"role": "user", "content": content}], **body}})


def test_a_line_the_api_would_refuse_fails_as_that_line_and_the_others_run():
    surrogate = ('{"custom_id":"a","method":"POST","url":"/v1/chat/completions","body":{"model":'
                 '"smollm2-135m-instruct","messages":[{"role":"user","content":"x\\ud800"}]}}')   # raw JSON text
    deep = line("deep").replace('"hi"', "[" * (MAX_JSON_DEPTH + 5) + "]" * (MAX_JSON_DEPTH + 5))
    recursion = '{"custom_id": "r", "body": ' + "[" * 100_000 + "]" * 100_000 + "}"     # json's RecursionError
    lines = [surrogate, line("ok"), deep, recursion, line("big", max_tokens=2**63),
             json.dumps({"custom_id": "none", "url": CHAT, "body": {"model": MODEL}})]
    parsed = list(parse_input("\n".join(lines).encode(), CHAT, request_id="req_x_{}".format))
    assert [body is not None for _, body, _ in parsed] == [False, True, False, False, False, False]
    assert [cid for cid, _, _ in parsed] == ["a", "ok", "deep", None, "big", "none"]
    [unparsed] = [err["error"] for _, _, err in parsed if err is not None and err["response"] is None]
    assert unparsed["code"] == "invalid_json" and unparsed["message"].startswith("line 4: The line is nested more")
    refused = [err["response"] for _, _, err in parsed if err is not None and err["response"] is not None]
    assert [r["status_code"] for r in refused] == [400] * 4     # the HTTP route's answer to the same body
    assert [r["request_id"] for r in refused] == ["req_x_0", "req_x_2", "req_x_4", "req_x_5"]
    errors = [r["body"]["error"] for r in refused]
    assert [(e["code"], e["param"]) for e in errors] == [
        ("invalid_encoding", "messages[0].content"), ("invalid_json", errors[1]["param"]),
        ("invalid_value", "max_tokens"), ("invalid_value", "messages")]
    assert "lone UTF-16 surrogate" in errors[0]["message"] and f"more than {MAX_JSON_DEPTH}" in errors[1]["message"]
    assert "1048576" in errors[2]["message"]
    assert count_lines(b"\n".join(x.encode() for x in lines) + b"\n\n  \n") == len(lines)
    short, long = line("s"), line("l", "x" * 300)
    (_, ok, _), (cid, body, err) = parse_input(f"{short}\n{long}\n".encode(), CHAT, max_line_bytes=len(short))
    assert ok is not None and cid is None and body is None and err["error"]["code"] == "line_too_large"
    assert err["error"]["message"] == f"line 2: {len(long)} bytes; a line may be at most {len(short)} bytes"


def created_peak(store: BatchStore, n: int) -> tuple[int, int]:
    """The traced allocation peak while a batch of `n` lines is created, less its file's bytes, and the file size."""
    content = "\n".join(line(f"k{i}") for i in range(n)).encode()
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        base = tracemalloc.get_traced_memory()[0]
        b = store.create_batch("k", "t", "file-x", CHAT, "24h", None, content)
        peak = tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()
    assert b["request_counts"]["total"] == n
    return peak, len(content)


def test_creating_a_batch_holds_its_file_and_a_chunk_of_items_not_an_object_per_line(tmp_path):
    """Counted in bytes Python allocates (tracemalloc), not timed: a file 4x as long costs about its own bytes more
    and a few bytes a line (the set of custom_ids seen), where an object per line cost over a kilobyte a line."""
    with Ledger(f"sqlite:///{tmp_path / 'l.db'}") as led:
        store = BatchStore(led.engine)
        small, small_bytes = created_peak(store, 2_000)
        large, large_bytes = created_peak(store, 8_000)
    per_line = (large - small - (large_bytes - small_bytes)) / 6_000
    assert per_line < 200, f"{per_line:.0f} bytes a line beyond the file's own"
