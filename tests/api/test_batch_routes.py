"""The Files and Batches routes alone, on a SQLite store, with no model and no runner: every lookup by another key
(or of nothing) is the same 404 as a missing id, and the owner's lookups return OpenAI's objects. The whole
flow through the official client and a real engine is tests/api/test_batch_api.py."""

from __future__ import annotations

import json

import pytest
from fastapi import FastAPI, Request
from fastapi.testclient import TestClient

from tokenomy.api import batches
from tokenomy.api.error_bodies import api_error_handler
from tokenomy.batch.database import BatchStore
from tokenomy.errors import APIError
from tokenomy.ledger.ledger import Ledger

LINE = json.dumps({"custom_id": "a", "method": "POST", "url": "/v1/chat/completions",
                   "body": {"model": "m", "messages": [{"role": "user", "content": "hi"}]}})


MAX_LINES = 5


@pytest.fixture
def api(tmp_path):
    led = Ledger(f"sqlite:///{tmp_path / 'batch.db'}")           # its migrations make the batch tables
    store, woken = BatchStore(led.engine), []

    def owner_of(request: Request) -> tuple[str, str]:
        key = request.headers.get("authorization", "").removeprefix("Bearer ")
        return key, f"tenant-{key}"

    app = FastAPI(routes=batches.ROUTES, exception_handlers={APIError: api_error_handler})
    app.state.batch_api = batches.BatchAPI(store, owner_of, max_file_bytes=1 << 20, wake=lambda: woken.append(1),
                                           max_lines=MAX_LINES, is_admin=lambda r: owner_of(r)[0] == "admin")
    with TestClient(app) as client:
        yield client, store, woken
    led.close()


def as_key(key: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}


def upload(client: TestClient, key: str, content: str = LINE + "\n", purpose: str = "batch") -> dict:
    r = client.post("/v1/files", headers=as_key(key), data={"purpose": purpose},
                    files={"file": ("in.jsonl", content.encode(), "application/jsonl")})
    assert r.status_code == 200, r.text
    return r.json()


def not_found(r, what: str, ident: str) -> None:
    assert r.status_code == 404, r.text
    assert r.json()["error"]["code"] == "not_found" and r.json()["error"]["message"] == f"No such {what}: '{ident}'"


def test_files_are_the_owners_and_a_404_to_anyone_else(api):
    client, _, _ = api
    f = upload(client, "a")
    got = client.get(f"/v1/files/{f['id']}", headers=as_key("a"))
    assert got.status_code == 200 and got.json() == f and f["object"] == "file" and f["bytes"] == len(LINE) + 1
    content = client.get(f"/v1/files/{f['id']}/content", headers=as_key("a"))
    assert content.status_code == 200 and content.text == LINE + "\n"
    for path in (f"/v1/files/{f['id']}", f"/v1/files/{f['id']}/content"):
        not_found(client.get(path, headers=as_key("b")), "file", f["id"])
    not_found(client.get("/v1/files/file-nope", headers=as_key("a")), "file", "file-nope")
    not_found(client.delete(f"/v1/files/{f['id']}", headers=as_key("b")), "file", f["id"])
    assert client.delete(f"/v1/files/{f['id']}", headers=as_key("a")).json()["deleted"] is True
    not_found(client.get(f"/v1/files/{f['id']}", headers=as_key("a")), "file", f["id"])


def test_batches_are_the_owners_and_a_404_to_anyone_else(api):
    client, store, woken = api
    f = upload(client, "a")
    body = {"input_file_id": f["id"], "endpoint": "/v1/chat/completions", "completion_window": "24h"}
    not_found(client.post("/v1/batches", headers=as_key("b"), json=body), "file", f["id"])
    not_found(client.post("/v1/batches", headers=as_key("a"), json={**body, "input_file_id": "file-nope"}),
              "file", "file-nope")
    assert woken == []
    other = upload(client, "a")
    with store.engine.begin() as conn:                        # a file of another purpose cannot be a batch input
        conn.exec_driver_sql("UPDATE batch_files SET purpose = 'batch_output' WHERE id = ?", (other["id"],))
    r = client.post("/v1/batches", headers=as_key("a"), json={**body, "input_file_id": other["id"]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "input_file_id"
    b = client.post("/v1/batches", headers=as_key("a"), json=body)
    assert b.status_code == 200 and woken == [1]
    b = b.json()
    assert b["status"] == "validating" and b["request_counts"] == {"total": 1, "completed": 0, "failed": 0}
    assert client.get(f"/v1/batches/{b['id']}", headers=as_key("a")).json() == b
    not_found(client.get(f"/v1/batches/{b['id']}", headers=as_key("b")), "batch", b["id"])
    not_found(client.post(f"/v1/batches/{b['id']}/cancel", headers=as_key("b")), "batch", b["id"])
    assert store.get_batch(b["id"], None)["status"] == "validating" and woken == [1]   # another key changed nothing
    not_found(client.post("/v1/batches/batch_nope/cancel", headers=as_key("a")), "batch", "batch_nope")
    cancelled = client.post(f"/v1/batches/{b['id']}/cancel", headers=as_key("a"))
    assert cancelled.status_code == 200 and cancelled.json()["status"] == "cancelling" and woken == [1, 1]
    assert cancelled.json()["cancelling_at"] is not None
    listed = client.get("/v1/batches", headers=as_key("a")).json()
    assert [x["id"] for x in listed["data"]] == [b["id"]] and client.get(
        "/v1/batches", headers=as_key("b")).json()["data"] == []
    assert {x["id"] for x in client.get("/v1/files", headers=as_key("a")).json()["data"]} == {f["id"], other["id"]}
    assert client.get("/v1/files", headers=as_key("b")).json()["data"] == []


def refused(r, status: int, code: str, param: str | None = None) -> str:
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert error["code"] == code and error.get("param") == param, error
    return error["message"]


def test_an_upload_is_read_under_the_limit_and_its_form_checked(api):
    client, store, _ = api
    # a file part without a filename is a plain field: still the file, named upload.jsonl
    form = b"".join(b'--b\r\nContent-Disposition: form-data; name="%s"\r\n\r\n%s\r\n' % (name, value)
                    for name, value in ((b"purpose", b" batch "), (b"file", LINE.encode() + b"\n"))) + b"--b--\r\n"
    multipart = {**as_key("a"), "content-type": "multipart/form-data; boundary=b"}
    r = client.post("/v1/files", headers=multipart, content=form)
    assert r.status_code == 200, r.text
    assert r.json()["filename"] == "upload.jsonl" and r.json()["bytes"] == len(LINE) + 1
    assert "multipart/form-data" in refused(client.post("/v1/files", headers=as_key("a"), json={"purpose": "batch"}),
                                            400, "invalid_request")
    refused(client.post("/v1/files", headers=as_key("a"), data={"purpose": "batch"},
                        files={"other": ("x", b"y")}), 400, "invalid_value", "file")
    refused(client.post("/v1/files", headers=as_key("a"), data={"purpose": "fine-tune"},
                        files={"file": ("in.jsonl", LINE.encode())}), 400, "invalid_value", "purpose")
    two = [("file", ("a.jsonl", LINE.encode())), ("file", ("b.jsonl", LINE.encode()))]
    assert "Too many files" in refused(client.post("/v1/files", headers=as_key("a"), data={"purpose": "batch"},
                                                   files=two), 400, "invalid_request")
    no_boundary = {**as_key("a"), "content-type": "multipart/form-data"}
    assert "boundary" in refused(client.post("/v1/files", headers=no_boundary, content=b"--x\r\n"),
                                 400, "invalid_request")
    big = LINE.encode() * ((1 << 20) // len(LINE) + 1)
    refused(client.post("/v1/files", headers=as_key("a"), data={"purpose": "batch"},
                        files={"file": ("in.jsonl", big)}), 413, "body_too_large")

    def chunks():                                   # no Content-Length: refused once the limit has come
        yield b"--b\r\nContent-Disposition: form-data; name=\"file\"; filename=\"in.jsonl\"\r\n\r\n"
        for _ in range(64):
            yield b"x" * (32 << 10)

    r = client.post("/v1/files", headers=multipart, content=chunks())
    assert "more than" in refused(r, 413, "body_too_large")
    assert [f["filename"] for f in store.list_files("a", None)] == ["upload.jsonl"]


BATCH = {"endpoint": "/v1/chat/completions", "completion_window": "24h"}


def test_a_refused_batch_stores_nothing_and_nothing_stored_breaks_a_read(api):
    """Issue 50: metadata with a lone surrogate was stored, answered 500, and broke every later list and read."""
    client, store, woken = api
    f = upload(client, "a")
    raw = json.dumps({**BATCH, "input_file_id": f["id"]})[:-1] + ", "
    surrogate = raw + '"metadata": {"a": "\\ud800"}}'
    deep = raw + '"metadata": {"a": ' + "[" * 5000 + "]" * 5000 + "}}"
    headers = {**as_key("a"), "content-type": "application/json"}
    assert "surrogate" in refused(client.post("/v1/batches", headers=headers, content=surrogate), 400,
                                  "invalid_encoding", "metadata.a")
    assert "nested" in refused(client.post("/v1/batches", headers=headers, content=deep), 400, "invalid_json")
    for meta in ({"k" * 65: "v"}, {"k": "v" * 513}, {str(i): "v" for i in range(17)}, {"k": 1}, ["k"]):
        refused(client.post("/v1/batches", headers=as_key("a"), json={**BATCH, "input_file_id": f["id"],
                                                                       "metadata": meta}),
                400, "invalid_value", "metadata")
    refused(client.post("/v1/batches", headers=as_key("a"), json={**BATCH, "input_file_id": ["x"]}),
            400, "invalid_value", "input_file_id")
    for field in ("endpoint", "completion_window"):          # schemathesis found a dict here was a 500
        refused(client.post("/v1/batches", headers=as_key("a"), json={**BATCH, "input_file_id": f["id"],
                                                                       field: {"a": 1}}),
                400, "invalid_value", field)
    assert client.get("/v1/batches", headers=as_key("a")).json()["data"] == [] and woken == []
    ok = client.post("/v1/batches", headers=as_key("a"), json={**BATCH, "input_file_id": f["id"]}).json()
    with store.engine.begin() as conn:              # a row stored before these checks existed
        conn.exec_driver_sql("UPDATE batches SET metadata = ? WHERE id = ?", ('{"a": "x\\ud800"}', ok["id"]))
    listed = client.get("/v1/batches", headers=as_key("a"))
    assert listed.status_code == 200 and listed.json()["data"][0]["metadata"] == {"a": "x\ufffd"}
    assert client.get(f"/v1/batches/{ok['id']}", headers=as_key("a")).json()["metadata"] == {"a": "x\ufffd"}


def test_a_file_with_more_lines_than_a_batch_may_have_is_a_400_naming_the_limit(api):
    client, _, woken = api
    f = upload(client, "a", (LINE + "\n\n") * (MAX_LINES + 1))
    message = refused(client.post("/v1/batches", headers=as_key("a"), json={**BATCH, "input_file_id": f["id"]}),
                      400, "too_many_lines", "input_file_id")
    assert f"{MAX_LINES + 1} requests" in message and f"at most {MAX_LINES}" in message
    assert client.get("/v1/batches", headers=as_key("a")).json()["data"] == [] and woken == []


def test_a_bad_line_fails_as_that_line_and_the_batch_is_created(api):
    client, store, _ = api
    surrogate = LINE.replace('"content": "hi"', '"content": "x\\ud800"').replace('"a"', '"s"')
    f = upload(client, "a", f"{LINE}\n{surrogate}\n")
    b = client.post("/v1/batches", headers=as_key("a"), json={**BATCH, "input_file_id": f["id"]}).json()
    assert b["request_counts"] == {"total": 2, "completed": 0, "failed": 1}
    assert [i.custom_id for i in store.pending(b["id"], 10, set())] == ["a"]


def test_an_admin_key_lists_reads_and_cancels_every_batch(api):
    client, _, _ = api
    mine = client.post("/v1/batches", headers=as_key("a"), json={**BATCH, "input_file_id": upload(client, "a")["id"]})
    bid = mine.json()["id"]
    not_found(client.get(f"/v1/batches/{bid}", headers=as_key("b")), "batch", bid)
    not_found(client.post(f"/v1/batches/{bid}/cancel", headers=as_key("b")), "batch", bid)
    assert client.get("/v1/batches", headers=as_key("b")).json()["data"] == []
    assert [b["id"] for b in client.get("/v1/batches", headers=as_key("admin")).json()["data"]] == [bid]
    assert client.get(f"/v1/batches/{bid}", headers=as_key("admin")).json()["status"] == "validating"
    cancelled = client.post(f"/v1/batches/{bid}/cancel", headers=as_key("admin"))
    assert cancelled.status_code == 200 and cancelled.json()["status"] == "cancelling"
    assert client.get(f"/v1/batches/{bid}", headers=as_key("a")).json()["status"] == "cancelling"
