"""What one bad request can do to everyone else: nothing. Each test is a defect found by probing the server
(issue 14), reproduced through the HTTP API."""

from __future__ import annotations

import httpx
import pytest

pytestmark = pytest.mark.slow       # a real engine, client or process (docs/testing.md)

MODEL = "smollm2-135m-instruct"


def chat(server, raw: str | None = None, **body) -> httpx.Response:
    if raw is not None:
        return httpx.post(server.base_url + "/chat/completions", content=raw.encode(),
                          headers={"content-type": "application/json"}, timeout=60)
    body.setdefault("model", MODEL)
    body.setdefault("messages", [{"role": "user", "content": "Say hi."}])
    body.setdefault("max_tokens", 4)
    return httpx.post(server.base_url + "/chat/completions", json=body, timeout=60)


def test_made_up_model_names_never_become_metric_labels_and_metrics_never_break(server):
    bad = chat(server, raw='{"model": "x\\ud800", "messages": [{"role": "user", "content": "hi"}]}')
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "model"
    for i in range(30):
        assert chat(server, model=f"made-up-{i}").status_code == 404
    metrics = httpx.get(server.root + "/metrics")
    assert metrics.status_code == 200
    assert "made-up-" not in metrics.text and 'model="other"' in metrics.text


def test_a_lone_surrogate_anywhere_is_a_400_naming_the_field(server):
    body = '{"model": "MODEL", "messages": [{"role": "user", "content": "a\\udc00b"}]}'.replace("MODEL", MODEL)
    r = chat(server, raw=body)
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["param"] == "messages[0].content" and err["code"] == "invalid_encoding"


def test_json_nested_too_deeply_is_a_400_even_in_an_ignored_field(server):
    deep = "[" * 5000 + "]" * 5000
    body = '{"model": "MODEL", "messages": [{"role": "user", "content": "hi"}], "x": DEEP}'
    r = chat(server, raw=body.replace("MODEL", MODEL).replace("DEEP", deep))
    assert r.status_code == 400 and "nested" in r.json()["error"]["message"]


def test_parameters_out_of_range_fail_only_their_request_and_never_cool_the_model(server):
    for _ in range(4):                               # more than the cool-down's failure count
        r = chat(server, logit_bias={"60000": 1})
        assert r.status_code == 400, r.text
        assert r.json()["error"]["param"] == "logit_bias" and "60000" in r.json()["error"]["message"]
        assert chat(server, logit_bias={str(2**70): 1}).status_code == 400
        assert chat(server, repetition_penalty=1e-300).status_code == 400
    health = httpx.get(server.root + "/health").json()
    assert health["cooling"] == [] and health["models"][MODEL] is True
    assert chat(server).status_code == 200


def test_a_vanishing_temperature_is_greedy_and_any_seed_is_accepted(server):
    greedy = chat(server, temperature=0, max_tokens=8).json()["choices"][0]["message"]["content"]
    tiny = chat(server, temperature=1e-45, max_tokens=8)
    assert tiny.status_code == 200 and tiny.json()["choices"][0]["message"]["content"] == greedy
    for seed in (-1, 2**63 + 5):
        r = httpx.post(server.base_url + "/completions", json={"model": MODEL, "prompt": "Once", "max_tokens": 4,
                                                               "seed": seed, "temperature": 1.0}, timeout=60)
        assert r.status_code == 200, r.text


def test_a_schema_no_answer_can_satisfy_is_a_400_and_never_cools_the_model(server):
    schema = {"type": "object", "properties": {"a": {"$ref": "#"}}, "required": ["a"]}   # required forever
    for _ in range(3):
        r = chat(server, max_tokens=16,
                 response_format={"type": "json_schema", "json_schema": {"name": "r", "schema": schema}})
        assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_schema", r.text
    assert httpx.get(server.root + "/health").json()["cooling"] == []


def raw_post(port: int, path: str, headers: dict[str, str], body: bytes = b"") -> bytes:
    """Send a request head (and some body) on a plain socket and read what comes back within 10 s: a server
    that waited for the declared body would never answer."""
    import socket

    head = f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(head.encode() + b"\r\n" + body)
        return s.recv(4096)


def test_bodies_are_refused_by_their_declared_size_and_after_auth_before_they_are_read():
    from tests.conftest import live_server

    keys = [{"key": "sk-tenant", "tenant": "a"}]
    with live_server({"keys": keys, "engine": {"n_ctx": 12288, "max_model_len": 512}}) as srv:
        big = raw_post(srv.port, "/v1/chat/completions",
                       {"content-type": "application/json", "content-length": str(512 << 20),
                        "authorization": "Bearer sk-tenant"})
        assert big.startswith(b"HTTP/1.1 413"), big[:80]
        chunk = b"x" * 65536
        no_key = raw_post(srv.port, "/v1/chat/completions",
                          {"content-type": "application/json", "transfer-encoding": "chunked"},
                          b"%x\r\n%s\r\n" % (len(chunk), chunk))
        assert no_key.startswith(b"HTTP/1.1 401"), no_key[:80]
        feedback = raw_post(srv.port, "/v1/feedback",
                            {"content-type": "application/json", "content-length": str(64 << 20)})
        assert feedback.startswith(b"HTTP/1.1 401"), feedback[:80]
        over = raw_post(srv.port, "/v1/chat/completions",
                        {"content-type": "application/json", "transfer-encoding": "chunked",
                         "authorization": "Bearer sk-tenant"},
                        b"".join(b"%x\r\n%s\r\n" % (len(chunk), chunk) for _ in range(70)))   # 4.4 MB > 4 MB
        assert over.startswith(b"HTTP/1.1 413"), over[:80]


def test_a_stream_the_client_cuts_short_is_billed_for_what_it_got():
    from tests.conftest import NO_CACHE, live_server
    from tests.helpers.wait import wait_until

    models = [{"name": MODEL, "gguf": MODEL, "price": {"input": 1.0, "cached_input": 0.5, "output": 2.0}}]
    with live_server({"models": models, "cache": NO_CACHE,
                      "engine": {"n_ctx": 16384, "max_model_len": 2048, "max_running": 4, "max_retired": 4,
                                 "max_batch_tokens": 64}}) as srv:
        body = {"model": MODEL, "messages": [{"role": "user", "content": "Tell me a long story about a dragon."}],
                "max_tokens": 300, "temperature": 0, "stream": True}
        with httpx.Client(timeout=60) as c, c.stream("POST", srv.base_url + "/chat/completions", json=body) as r:
            seen = 0
            for line in r.iter_lines():
                if line.startswith("data: {"):
                    seen += 1
                if seen >= 15:
                    break
        try:                                          # a long prompt, abandoned during its prefill
            httpx.post(srv.base_url + "/chat/completions", timeout=0.3,
                       json={"model": MODEL, "messages": [{"role": "user", "content": "lorem ipsum " * 400}],
                             "max_tokens": 10})
        except httpx.TimeoutException:
            pass
        ledger = srv.gateway.ledger

        def cancelled() -> list:
            ledger.flush()
            rows = [row for row in ledger.query() if row.status == 499]
            return rows if len(rows) >= 2 else []

        rows = wait_until(cancelled, what="two cancelled rows in the ledger")
        assert len(rows) == 2, [(row.status, row.finish_reason) for row in ledger.query()]
        streamed, abandoned = sorted(rows, key=lambda row: row.ts)
        assert streamed.model == MODEL and streamed.prompt_tokens > 10
        assert streamed.completion_tokens >= 13 and streamed.cost_usd > 0
        assert abandoned.model == MODEL and abandoned.prompt_tokens > 800 and abandoned.cost_usd > 0
        metrics = httpx.get(srv.root + "/metrics").text
        cancelled = f'tokenomy_requests_total{{endpoint="chat.completions",model="{MODEL}",status="cancelled"}} 2.0'
        assert cancelled in metrics, [
            line for line in metrics.splitlines() if line.startswith("tokenomy_requests_total")]


def test_keys_and_tenants_may_name_only_the_models_and_routes_they_are_allowed():
    from tests.conftest import NO_CACHE, live_server

    cfg = {"models": [{"name": "cheap", "gguf": MODEL}, {"name": "dear", "gguf": MODEL}],
           "routes": {"auto": {"strategy": "fixed", "models": ["cheap", "dear"]}},
           "tenants": {"t": {"models": ["auto", "cheap"]}},
           "keys": [{"key": "sk-narrow", "tenant": "t", "models": ["auto"]}, {"key": "sk-wide", "tenant": "u"}],
           "cache": NO_CACHE, "engine": {"n_ctx": 12288, "max_model_len": 512}}
    with live_server(cfg) as srv:
        def ask(key: str, model: str) -> httpx.Response:
            return httpx.post(srv.base_url + "/chat/completions", timeout=60,
                              headers={"authorization": f"Bearer {key}"},
                              json={"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
        assert ask("sk-narrow", "auto").status_code == 200
        for model in ("dear", "cheap"):                # not on the key's list ("cheap" is on the tenant's only)
            r = ask("sk-narrow", model)
            assert r.status_code == 403 and r.json()["error"]["code"] == "model_not_allowed"
        missing = ask("sk-narrow", "nope")
        assert missing.status_code == 403 and "dear" not in missing.text
        assert ask("sk-wide", "dear").status_code == 200
        listed = httpx.get(srv.base_url + "/models", headers={"authorization": "Bearer sk-narrow"}).json()
        assert [m["id"] for m in listed["data"]] == ["auto"]
        assert httpx.get(srv.base_url + "/models").status_code == 401


def test_request_fields_are_typed_as_strictly_as_openai_types_them(server):
    for bad in ({"max_tokens": "8"}, {"stream": "yes"}, {"temperature": True}, {"logprobs": 1},
                {"tool_choice": "auto"}):
        r = chat(server, **bad)
        assert r.status_code == 400, (bad, r.text)
        assert r.json()["error"]["type"] == "invalid_request_error"
    assert chat(server, temperature=1).status_code == 200            # an integer is a number
    bom = b"\xef\xbb\xbf" + b'{"model": "%s", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}' \
        % MODEL.encode()
    r = httpx.post(server.base_url + "/chat/completions", content=bom,
                   headers={"content-type": "application/json"}, timeout=60)
    assert r.status_code == 200, r.text
    for prompt in ("", [""]):
        r = httpx.post(server.base_url + "/completions", json={"model": MODEL, "prompt": prompt}, timeout=60)
        assert r.status_code == 400 and "empty" in r.json()["error"]["message"], r.text


def test_an_unreachable_redis_cache_shows_on_metrics_health_and_the_log_once(caplog):
    import logging
    import time

    from tests.conftest import free_port, live_server

    dead = f"redis://127.0.0.1:{free_port()}/0"          # nothing listens there
    with caplog.at_level(logging.WARNING, logger="tokenomy.cache"), live_server(
            {"cache": {"store": dead, "semantic": {"enabled": False}},
             "engine": {"n_ctx": 12288, "max_model_len": 512}}) as srv:
        store = dict(srv.gateway.cache_stores())["exact"]
        now = [time.monotonic()]
        store.clock = lambda: now[0]                      # the breaker's clock, moved by hand below
        for _ in range(3):
            r = httpx.post(srv.base_url + "/chat/completions", timeout=60, json={
                "model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "temperature": 0})
            assert r.status_code == 200 and r.headers["x-tokenomy-cache"] == "miss"
        assert not store.available
        now[0] += store.retry_after_s + 0.1              # past the breaker's pause: still shown as down
        assert store.available
        metrics = httpx.get(srv.root + "/metrics").text
        errors = [ln for ln in metrics.splitlines()
                  if ln.startswith('tokenomy_cache_store_errors_total{cache="exact"}')]
        assert errors and float(errors[0].split()[-1]) >= 1
        assert 'tokenomy_cache_store_up{cache="exact"} 0.0' in metrics
        health = httpx.get(srv.root + "/health")
        assert health.status_code == 200 and health.json()["status"] == "degraded"
        assert health.json()["caches"] == {"exact": False}
    failed = [r for r in caplog.records if "failed" in r.getMessage()]
    assert len(failed) == 1, [r.getMessage() for r in caplog.records]


@pytest.mark.parametrize("durable", [False, True])
def test_a_durable_ledger_commits_the_row_before_the_answer_reaches_the_client(durable):
    import threading

    from tests.conftest import NO_CACHE, live_server
    from tests.helpers.wait import wait_until

    with live_server({"ledger_durable": durable, "cache": NO_CACHE,
                      "engine": {"n_ctx": 12288, "max_model_len": 512}}) as srv:
        ledger = srv.gateway.ledger
        original = ledger._commit
        for stream in (False, True):
            gate, committing, answer = threading.Event(), threading.Event(), {}

            def held_commit(rows, *stored, gate=gate, committing=committing):   # a database that commits
                committing.set()                                                 # when the test says so
                gate.wait(60)
                original(rows, *stored)

            def ask(stream=stream, answer=answer):
                body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2,
                        "stream": stream}
                with httpx.stream("POST", srv.base_url + "/chat/completions", json=body, timeout=60) as r:
                    r.read()
                    answer["rid"] = r.headers["x-tokenomy-request-id"]

            ledger._commit = held_commit
            client = threading.Thread(target=ask)
            client.start()
            try:
                assert committing.wait(60)                # the row is at the database, which holds it
                if durable:
                    assert "rid" not in answer, stream    # the answer waits for the commit
                else:
                    wait_until(lambda answer=answer: "rid" in answer, what="the answer")   # it does not
                    assert ledger.get(answer["rid"]) is None, stream
            finally:
                gate.set()
                client.join(60)
            assert ledger.flush() and ledger.get(answer["rid"]) is not None, (stream, durable)


def test_a_keyed_server_opens_only_its_public_paths_without_a_key():
    from tests.conftest import live_server

    small = {"n_ctx": 12288, "max_model_len": 512}
    with live_server({"keys": [{"key": "sk-k", "tenant": "a"}], "engine": small}) as srv:
        for path in ("/metrics", "/openapi.json", "/docs", "/v1/models"):
            assert httpx.get(srv.root + path).status_code == 401, path
            assert httpx.get(srv.root + path, headers={"authorization": "Bearer sk-k"}).status_code == 200, path
        assert httpx.get(srv.root + "/health").status_code == 200
    with live_server({"keys": [{"key": "sk-k"}], "engine": small,
                      "server": {"public": ["/health", "/metrics"]}}) as srv:
        assert httpx.get(srv.root + "/metrics").status_code == 200
        assert httpx.get(srv.root + "/openapi.json").status_code == 401


# ---- issue 50: the endpoints added since issue 14 ------------------------------------------------------------

SURROGATE_LINE = ('{"custom_id":"a","method":"POST","url":"/v1/chat/completions","body":{"model":'
                  '"smollm2-135m-instruct","messages":[{"role":"user","content":"x\\ud800"}]}}')


def test_a_batch_line_with_a_lone_surrogate_fails_as_that_line_and_the_batch_completes(server):
    import io

    import openai

    from tests.api.test_batch_api import jsonl, line, wait_done

    c = openai.OpenAI(base_url=server.base_url, api_key="x", max_retries=0)
    text = SURROGATE_LINE + "\n" + line("b", "Say hi.", max_tokens=2) + "\n"
    f = c.files.create(file=("in.jsonl", io.BytesIO(text.encode())), purpose="batch")
    b = c.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h")
    done = wait_done(c, b.id)
    assert done.status == "completed" and (done.request_counts.completed, done.request_counts.failed) == (1, 1)
    [error] = jsonl(c, done.error_file_id)
    assert error["custom_id"] == "a" and error["response"]["status_code"] == 400     # as over HTTP
    assert error["response"]["body"]["error"]["code"] == "invalid_encoding"
    assert [o["custom_id"] for o in jsonl(c, done.output_file_id)] == ["b"]


def test_bad_input_on_the_newer_endpoints_is_a_4xx_naming_the_limit_on_a_connection_that_stays_open(server):
    deep = "[" * 5000 + "]" * 5000
    user = {"role": "user", "content": "hi"}
    turns = [user, {"role": "assistant", "content": "ok"}] * 2500 + [user]
    orphan = {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_x", "content": "1"}]}
    cases = [                                               # (method, path, raw body or JSON, what the error says)
        ("POST", "/v1/batches", '{"endpoint": "/v1/chat/completions", "metadata": ' + deep + "}", "nested"),
        ("POST", "/v1/batches", '{"endpoint": "/v1/chat/completions", "completion_window": "24h", '
                                '"metadata": {"a": "\\ud800"}}', "surrogate"),
        ("POST", "/v1/feedback", '{"request_id": "r", "score": 1, "comment": ' + deep + "}", "nested"),
        ("POST", "/v1/feedback", '{"request_id": "r", "score": 1, "comment": "\\ud800"}', "surrogate"),
        ("GET", "/dashboard/data?since=inf", None, "since"),
        ("GET", "/dashboard/data?until=1e400", None, "until"),
        ("POST", "/v1/messages", {"model": MODEL, "max_tokens": 8, "messages": turns}, "2048"),
        ("POST", "/v1/messages", {"model": MODEL, "max_tokens": 2**63, "messages": [user]}, "1048576"),
        ("POST", "/v1/messages", {"model": MODEL, "max_tokens": 8, "messages": [orphan]}, "toolu_x"),
        ("POST", "/v1/responses", {"model": MODEL, "input": turns}, "2048"),
        ("POST", "/v1/responses", {"model": MODEL, "input": "hi", "max_output_tokens": 2**63}, "1048576"),
        ("POST", "/v1/chat/completions", {"model": MODEL, "messages": turns}, "2048"),
        ("POST", "/v1/chat/completions", {"model": MODEL, "messages": [user], "max_tokens": 2**63}, "1048576"),
    ]
    with httpx.Client(base_url=server.root, timeout=60) as c:
        for method, path, body, says in cases:
            sent = {"content": body.encode()} if isinstance(body, str) else {"json": body}
            r = c.request(method, path, headers={"content-type": "application/json"}, **sent)
            assert r.status_code == 400, (path, says, r.text[:300])
            assert says in r.text and "connection" not in r.headers, (path, says, r.text[:300])
        assert c.get("/v1/batches").status_code == 200          # nothing stored broke the list
        assert c.get("/health").status_code == 200


def test_a_500_says_connection_close_and_a_pooled_client_goes_on():
    from fastapi import FastAPI
    from fastapi.routing import APIRoute

    from tests.api.test_dashboard import serve
    from tokenomy.api.app import EXCEPTION_HANDLERS

    async def broken() -> None:
        raise RuntimeError("a defect")

    async def fine() -> dict:
        return {"ok": True}

    app = FastAPI(routes=[APIRoute("/broken", broken), APIRoute("/fine", fine)], exception_handlers=EXCEPTION_HANDLERS)
    with serve(app) as root, httpx.Client(base_url=root, timeout=10) as c:
        for _ in range(3):
            r = c.get("/broken")
            assert r.status_code == 500 and r.headers["connection"] == "close"
            assert r.json()["error"]["message"] == "internal error: RuntimeError"
            assert c.get("/fine").json() == {"ok": True}


def test_a_keyed_server_shows_tenants_and_every_batch_to_admins_only_and_feedback_is_no_oracle():
    import io

    import openai

    from tests.api.test_batch_api import line
    from tests.conftest import NO_CACHE, live_server
    from tests.helpers.wait import wait_until

    keys = [{"key": "sk-a", "tenant": "a"}, {"key": "sk-b", "tenant": "b"},
            {"key": "sk-admin", "tenant": "ops", "admin": True}]
    with live_server({"keys": keys, "cache": NO_CACHE, "engine": {"n_ctx": 12288, "max_model_len": 512},
                      "batch": {"concurrency": 1}}) as srv:
        def as_key(key: str) -> dict[str, str]:
            return {"authorization": f"Bearer {key}"}

        r = httpx.post(srv.base_url + "/chat/completions", headers=as_key("sk-a"), timeout=60,
                       json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
        rid = r.headers["x-tokenomy-request-id"]
        wait_until(lambda: 'tokenomy_tenant_requests_total{tenant="a"}' in httpx.get(
            srv.root + "/metrics", headers=as_key("sk-admin")).text, what="tenant a's series")
        seen = httpx.get(srv.root + "/metrics", headers=as_key("sk-b")).text
        assert "tokenomy_tenant_" not in seen and "tokenomy_budget_used_ratio" not in seen
        assert "tokenomy_requests_total" in seen

        def feedback(key: str, request_id: str) -> httpx.Response:
            return httpx.post(srv.base_url + "/feedback", headers=as_key(key),
                              json={"request_id": request_id, "score": 1})

        theirs, unknown = feedback("sk-b", rid), feedback("sk-b", "req_" + "0" * 24)
        assert theirs.status_code == unknown.status_code == 404
        assert theirs.json()["error"]["code"] == unknown.json()["error"]["code"] == "request_not_found"
        assert feedback("sk-a", rid).status_code == 200

        a = openai.OpenAI(base_url=srv.base_url, api_key="sk-a", max_retries=0)
        text = "\n".join(line(f"k{i}", "Count to twenty.", max_tokens=32) for i in range(20))
        f = a.files.create(file=("in.jsonl", io.BytesIO(text.encode())), purpose="batch")
        b = a.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h")
        admin = openai.OpenAI(base_url=srv.base_url, api_key="sk-admin", max_retries=0)
        other = openai.OpenAI(base_url=srv.base_url, api_key="sk-b", max_retries=0)
        assert [x.id for x in admin.batches.list()] == [b.id] and list(other.batches.list()) == []
        with pytest.raises(openai.NotFoundError):
            other.batches.cancel(b.id)
        assert admin.batches.cancel(b.id).status in ("cancelling", "cancelled")
        ended = wait_until(lambda: a.batches.retrieve(b.id).status == "cancelled", 60, what="the cancel")
        assert ended
        assert httpx.get(srv.root + "/dashboard/data", headers=as_key("sk-a")).status_code == 403
        assert httpx.get(srv.root + "/dashboard/data", headers=as_key("sk-admin")).status_code == 200
