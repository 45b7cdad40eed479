"""tokenomy/api/dashboard.py: the live page in headless Chromium, its data endpoint, its operations view under load
on a live server, and POST /v1/feedback.

TOKENOMY_DASHBOARD_SCREENSHOT=path makes the operations-view test save a screenshot of the view under load there
(docs/img/dashboard-live.png is one)."""

from __future__ import annotations

import json
import os
import shutil
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from urllib.parse import urlparse

import httpx
import pytest
import uvicorn
from fastapi import FastAPI, Request

from tests.conftest import LiveServer, free_port
from tests.helpers.synthetic import Spec, mixed, rows_for
from tests.helpers.wait import wait_until
from tests.report.test_figures import check, expected
from tokenomy.api import dashboard
from tokenomy.errors import APIError
from tokenomy.ledger.ledger import Ledger
from tokenomy.metrics.prometheus import Metrics
from tokenomy.models.catalog import DEFAULT_MODEL
from tokenomy.report.figure_rows import ROWS

pytestmark = pytest.mark.slow       # a real engine, client or process (docs/testing.md)

SCREENSHOT_ENV = "TOKENOMY_DASHBOARD_SCREENSHOT"
CHROMIUM_ENV = "TOKENOMY_TEST_CHROMIUM"
CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]


def chromium_path(pw) -> str:
    """$TOKENOMY_TEST_CHROMIUM, else /usr/bin/chromium or a Chromium/Chrome on PATH, else the one `playwright install
    chromium` downloaded; fails, naming the fixes, when there is none."""
    forced = os.environ.get(CHROMIUM_ENV)
    if forced:
        if not os.access(forced, os.X_OK):
            pytest.fail(f"{CHROMIUM_ENV}={forced} is not an executable browser", pytrace=False)
        return forced
    for path in ("/usr/bin/chromium", *(shutil.which(name) for name in CHROMIUM_NAMES)):
        if path and os.access(path, os.X_OK):
            return path
    bundled = pw.chromium.executable_path
    if bundled and os.access(bundled, os.X_OK):
        return bundled
    pytest.fail("no Chromium for the dashboard browser tests: looked for /usr/bin/chromium, "
                f"{', '.join(CHROMIUM_NAMES)} on PATH and Playwright's own download. Install one "
                "(`bash install.sh test` does as root on apt systems: apt-get install -y chromium), or run "
                f"`.venv/bin/playwright install chromium`, or set {CHROMIUM_ENV}=/path/to/chromium", pytrace=False)


def launch_chromium(pw):
    return pw.chromium.launch(executable_path=chromium_path(pw), args=CHROMIUM_ARGS, headless=True)


@contextmanager
def serve(app: FastAPI) -> Iterator[str]:
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    wait_until(lambda: server.started or not thread.is_alive(), what="the server to start")
    assert server.started, "server did not start"
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)


def dashboard_app(d: dashboard.Dashboard) -> FastAPI:
    app = FastAPI(routes=dashboard.ROUTES)
    app.state.dashboard = d
    return app


@pytest.fixture
def site(tmp_path):
    specs = mixed()
    rows = rows_for(specs)
    metrics = Metrics()
    with Ledger(f"sqlite:///{tmp_path / 'l.db'}") as led:
        for r in rows:
            led.write(r)
        led.flush()
        metrics.watch_ledger(led)
        with serve(dashboard_app(dashboard.Dashboard(led, metrics, refresh_s=1.0))) as root:
            yield root, led, specs, rows, metrics


def nested(cells: dict[str, float], group: str) -> dict:
    """Cells {"all:cost_usd.total": v} -> {"cost_usd": {"total": v}} for one column."""
    out: dict = {}
    for key, value in cells.items():
        name, path = key.split(":", 1)
        if name != group:
            continue
        node = out
        *parents, leaf = path.split(".")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
    return out


def test_dashboard_in_chromium_shows_the_ledgers_figures_and_refreshes(site):
    from playwright.sync_api import sync_playwright

    root, led, specs, rows, _ = site
    hosts: set[str] = set()
    with sync_playwright() as pw:
        browser = launch_chromium(pw)
        try:
            page = browser.new_page()
            page.on("request", lambda req: hosts.add(urlparse(req.url).netloc))
            errors: list[str] = []
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.goto(root + "/dashboard")
            page.wait_for_selector('[data-figure="all:requests"]', timeout=20_000)
            cells = page.eval_on_selector_all(
                "[data-figure]", "els => els.map(e => [e.dataset.figure, JSON.parse(e.dataset.value), "
                                 "e.textContent])")
            values = {k: v for k, v, _ in cells}
            texts = {k: t for k, _, t in cells}
            assert {k.split(":", 1)[1] for k in values} == {path for _, path, _ in ROWS}
            want = expected(specs, rows)
            shown = {k: v for k, v in want.items() if any(k == p for _, p, _ in ROWS)}
            assert len(shown) >= 20
            check(nested(values, "all"), shown)
            assert texts["all:requests"] == str(len(specs))
            assert texts["all:tokens.billed"] == f"{want['tokens.billed']:,}"
            assert texts["all:cost_usd.total"].startswith("$")
            assert texts["all:energy.joules"].endswith("(estimate)")
            assert "notional" in page.inner_text("#note-notional")
            # the charts are drawn from the same figures
            cost_y = page.evaluate("document.getElementById('chart-cost').data.map(t => t.y[0])")
            assert sum(cost_y) == pytest.approx(want["cost_usd.total"], rel=1e-9)
            assert page.locator("#chart-timeline .main-svg").count() > 0
            assert page.locator('#live [data-live="tokenomy_ledger_queue_depth"]').count() == 1
            # live: a new request shows up within a refresh or two
            led.write(rows_for([Spec("large", 10, 0, 5)], prefix="new")[0])
            led.flush()
            page.wait_for_selector(f'[data-figure="all:requests"][data-value="{len(specs) + 1}"]', timeout=10_000)
            # grouping by model adds a column per model
            page.select_option("#by", "model")
            page.wait_for_selector('[data-figure="large:requests"]', timeout=10_000)
            n_large = sum(s.model == "large" for s in specs) + 1
            assert page.get_attribute('[data-figure="large:requests"]', "data-value") == str(n_large)
            assert not errors, errors
        finally:
            browser.close()
    assert hosts == {urlparse(root).netloc}, f"the page reached beyond the gateway: {hosts}"


def test_data_endpoint_and_its_errors(site):
    root, _, specs, rows, _ = site
    r = httpx.get(root + "/dashboard/data", params={"since": "1h", "by": "tenant"})
    assert r.status_code == 200
    data = r.json()
    check(data["total"], expected(specs, rows))
    assert set(data["groups"]) == {s.tenant for s in specs}
    assert data["live"]["tokenomy_ledger_queue_depth"] == 0
    assert httpx.get(root + "/dashboard/data", params={"since": "5m"}).json()["total"]["requests"] == \
        sum(s.ago_s < 300 for s in specs)
    for params, param in (({"since": "soon"}, "since"), ({"until": "x"}, "until"), ({"by": "user"}, "by"),
                          ({"since": "1h", "until": "2h"}, "since"), ({"since": "inf"}, "since"),
                          ({"since": "-inf"}, "since"), ({"until": "nan"}, "until"), ({"since": "1e400"}, "since"),
                          ({"since": str(10**30)}, "since"), ({"since": "99999999999999w"}, "since")):
        r = httpx.get(root + "/dashboard/data", params=params)
        assert r.status_code == 400
        assert r.json()["error"]["param"] == param and set(r.json()["error"]) == {"message", "type", "param", "code"}
    page = httpx.get(root + "/dashboard")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert "<script src" not in page.text


def test_feedback_endpoint(site):
    root, led, _, rows, metrics = site
    rid = rows[2].request_id
    r = httpx.post(root + "/v1/feedback", json={"request_id": rid, "score": 0.5, "comment": "good answer"})
    assert r.status_code == 200 and r.json()["request_id"] == rid
    assert (led.get(rid).feedback_score, led.get(rid).feedback_comment) == (0.5, "good answer")
    assert metrics.registry.get_sample_value("tokenomy_feedback_score_count") == 1
    fresh = rows_for([Spec("small", 3, 0, 1)], prefix="fresh")[0]
    led.write(fresh)                                     # not flushed: feedback may follow the answer at once
    assert httpx.post(root + "/v1/feedback", json={"request_id": fresh.request_id, "score": -1}).status_code == 200

    def err(body, status, param=None, raw=None):
        r = httpx.post(root + "/v1/feedback", **({"content": raw} if raw is not None else {"json": body}))
        assert r.status_code == status, r.text
        e = r.json()["error"]
        assert set(e) == {"message", "type", "param", "code"} and e["param"] == param
        return e

    assert err({"request_id": "req_nope", "score": 1}, 404, "request_id")["code"] == "request_not_found"
    err({"request_id": rid, "score": 2}, 400, "score")
    err({"request_id": rid, "score": "good"}, 400, "score")
    err({"request_id": rid, "score": True}, 400, "score")
    err({"request_id": rid}, 400, "score")
    err({"score": 1}, 400, "request_id")
    err({"request_id": 7, "score": 1}, 400, "request_id")
    err({"request_id": rid, "score": 1, "comment": "x" * 5000}, 400, "comment")
    err({"request_id": rid, "score": 1, "stars": 5}, 400, "stars")
    err(None, 400, raw=b"{not json")
    err(None, 400, raw=b"[1, 2]")
    assert err(None, 400, raw=b'{"request_id": "a", "score": 1, "comment": ' + b"[" * 5000 + b"]" * 5000 + b"}"
               )["code"] == "invalid_json"                # issue 50: a RecursionError was a 500
    e = err(None, 400, "comment", raw=json.dumps({"request_id": rid, "score": 1, "comment": "x\udc00"}).encode())
    assert e["code"] == "invalid_encoding"                # issue 50: a UnicodeEncodeError was a 500
    assert led.get(rid).feedback_score == 0.5          # no bad request changed it


def test_guards(tmp_path):
    def admin_only(request: Request) -> None:
        if request.headers.get("authorization") != "Bearer admin":
            raise APIError(401, "admin key needed", code="invalid_api_key")

    def own_requests(request: Request, row) -> None:
        if request.headers.get("authorization") != f"Bearer {row.key_id}":
            raise APIError(403, "not your request", code="not_owner")

    [row] = rows_for([Spec("small", 3, 0, 1, key_id="k9")])
    with Ledger(f"sqlite:///{tmp_path / 'l.db'}") as led:
        led.write(row)
        with serve(dashboard_app(dashboard.Dashboard(led, guard=admin_only, feedback_guard=own_requests))) as root:
            assert httpx.get(root + "/dashboard/data").status_code == 401
            ok = httpx.get(root + "/dashboard/data", headers={"authorization": "Bearer admin"})
            assert ok.status_code == 200 and ok.json()["total"]["requests"] == 1
            body = json.dumps({"request_id": row.request_id, "score": 1})
            theirs = httpx.post(root + "/v1/feedback", content=body, headers={"authorization": "Bearer k1"})
            unknown = httpx.post(root + "/v1/feedback", content=json.dumps({"request_id": "req_none", "score": 1}),
                                 headers={"authorization": "Bearer k1"})
            assert theirs.status_code == unknown.status_code == 404        # no oracle of another key's ids
            assert theirs.json() == {"error": {**unknown.json()["error"],
                                               "message": unknown.json()["error"]["message"].replace(
                                                   "req_none", row.request_id)}}
            assert httpx.post(root + "/v1/feedback", content=body,
                              headers={"authorization": "Bearer k9"}).status_code == 200


def test_a_key_in_the_dashboard_url_leaves_the_address_bar_and_still_authorizes(tmp_path):
    from playwright.sync_api import sync_playwright

    def admin(request: Request) -> None:
        if request.headers.get("authorization") != "Bearer sk-admin":
            raise APIError(401, "admin key needed")

    with Ledger(f"sqlite:///{tmp_path / 'l.db'}") as led:
        for r in rows_for(mixed()):
            led.write(r)
        led.flush()
        app = dashboard_app(dashboard.Dashboard(led, Metrics(), guard=admin, refresh_s=1.0))
        with serve(app) as root, sync_playwright() as pw:
            browser = launch_chromium(pw)
            try:
                page = browser.new_page()
                page.goto(root + "/dashboard#key=sk-admin")
                page.wait_for_selector('[data-figure="all:requests"]', timeout=20_000)
                assert page.evaluate("location.href") == root + "/dashboard"     # no key left to record
                page.wait_for_timeout(1500)                    # a refresh still authorizes from the session
                assert page.is_hidden("#error")
            finally:
                browser.close()


def test_the_operations_view_follows_the_traffic_of_a_live_server(server: LiveServer) -> None:
    """While requests run, the page's live charts move without a reload: output tokens/s of the served model turns
    positive, and the values change from one poll of /dashboard/live to the next."""
    from playwright.sync_api import sync_playwright

    stop, statuses = threading.Event(), []

    def load() -> None:
        with httpx.Client(base_url=server.base_url, timeout=120) as c:
            i = 0
            while not stop.is_set():
                r = c.post("/chat/completions", json={
                    "model": DEFAULT_MODEL, "max_tokens": 8, "temperature": 0, "ignore_eos": True, "stream": i % 2 == 1,
                    "messages": [{"role": "user", "content": f"Count to {i}."}]})
                statuses.append(r.status_code)
                i += 1

    traffic = [threading.Thread(target=load, daemon=True) for _ in range(2)]     # two clients: a batch of two
    hosts: set[str] = set()
    with sync_playwright() as pw:
        browser = launch_chromium(pw)
        try:
            page = browser.new_page(viewport={"width": 1500, "height": 1100})
            page.on("request", lambda req: hosts.add(urlparse(req.url).netloc))
            errors: list[str] = []
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.goto(server.root + "/dashboard")
            page.wait_for_selector("#ops-tokens[data-last]", timeout=20_000)
            assert page.is_visible("#ops") and page.locator("#figures").count() == 1      # the report stays
            for t in traffic:
                t.start()
            page.wait_for_function(
                "m => (JSON.parse(document.getElementById('ops-tokens').dataset.last || '{}')[m] || 0) > 0",
                arg=DEFAULT_MODEL, timeout=60_000)
            seen = page.evaluate("[document.getElementById('ops').dataset.polls, "
                                 "document.getElementById('ops-tokens').dataset.last]")
            page.wait_for_function("([polls, last]) => document.getElementById('ops').dataset.polls !== polls && "
                                   "document.getElementById('ops-tokens').dataset.last !== last",
                                   arg=seen, timeout=30_000)       # a later poll, with other values
            names = page.evaluate("Object.fromEntries(['ops-ttft', 'ops-tpot', 'ops-queue', 'ops-kv', 'ops-hits', "
                                  "'ops-cost', 'ops-requests'].map(id => [id, "
                                  "document.getElementById(id).data.map(t => t.name)]))")
            m = DEFAULT_MODEL
            assert {f"{m} p50", f"{m} p99"} <= set(names["ops-ttft"]) and f"{m} p99" in names["ops-tpot"]
            assert {f"{m} waiting", f"{m} running"} <= set(names["ops-queue"]) and names["ops-kv"] == [m]
            assert f"prefix {m}" in names["ops-hits"] and f"response {m}" in names["ops-hits"]
            assert "tenant default" in names["ops-requests"] and m in names["ops-cost"]
            # the fleet's ps view: the model serving the traffic is loaded, with its memory and loads
            row = page.wait_for_selector(f'#models-table tr[data-model="{m}"][data-state="loaded"]', timeout=20_000)
            cells = row.evaluate("r => [...r.children].map(c => c.textContent)")
            assert cells[2].endswith("GiB") and float(cells[2].split()[0]) > 0 and int(cells[9]) >= 1
            assert "held" in page.text_content("#models-held")
            shot = os.environ.get(SCREENSHOT_ENV)
            if shot:                                    # a fuller picture: half a minute of traffic
                page.wait_for_function("document.getElementById('ops-tokens').dataset.points >= 15",
                                       timeout=120_000)
                page.locator("#ops").screenshot(path=shot)
            assert not errors, errors
        finally:
            stop.set()
            browser.close()
            for t in traffic:
                t.join(timeout=120)
    assert statuses and set(statuses) == {200}
    assert hosts == {urlparse(server.root).netloc}, f"the page reached beyond the gateway: {hosts}"


def test_live_endpoint_without_metrics_and_behind_the_guard(tmp_path) -> None:
    def admin(request: Request) -> None:
        if request.headers.get("authorization") != "Bearer sk-admin":
            raise APIError(401, "admin key needed", code="invalid_api_key")

    with Ledger(f"sqlite:///{tmp_path / 'l.db'}") as led:
        with serve(dashboard_app(dashboard.Dashboard(led))) as root:
            r = httpx.get(root + "/dashboard/live")
            assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"
            assert "liveUrl\": null" in httpx.get(root + "/dashboard").text
        with serve(dashboard_app(dashboard.Dashboard(led, Metrics(), guard=admin))) as root:
            assert httpx.get(root + "/dashboard/live").status_code == 401
            ok = httpx.get(root + "/dashboard/live", headers={"authorization": "Bearer sk-admin"})
            assert ok.status_code == 200 and set(ok.json()) == {"t", "interval_s", "series"}
