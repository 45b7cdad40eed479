"""The dashboard and the feedback endpoint: ROUTES over a Dashboard the app holds as `app.state.dashboard`.

    GET  /dashboard        a self-contained page (plotly inline, no external assets) that refreshes its figures
    GET  /dashboard/data   the report JSON (report/figures.py) over ?since=24h&until=&by=model|route|tenant|key, with
                           the fleet's ps view as `models` when the gateway has a fleet
    GET  /dashboard/live   the operations view's recent time series (metrics/live.py), from the app's Metrics
    POST /v1/feedback      {"request_id", "score" in [-1, 1], "comment"?} joins the request's ledger row

`Dashboard.guard(request)` (e.g. the keyring's admin check) protects /dashboard/data and /dashboard/live; the page
itself holds no data and forwards a key given in its URL fragment (/dashboard#key=...) as a bearer token.
`feedback_guard(request, row)` may refuse feedback on another key's request, which is then answered with the same 404
as an unknown request id. Bodies are read with the checks every body gets (api/body.py read_json); query strings
are parsed into finite times or a 400. Errors use the OpenAI body with a 4xx status.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from fastapi import Request
from fastapi.responses import HTMLResponse, JSONResponse, Response
from fastapi.routing import APIRoute
from starlette.concurrency import run_in_threadpool

from tokenomy.api.body import read_json
from tokenomy.api.error_bodies import error_response
from tokenomy.errors import APIError
from tokenomy.ledger.ledger import FEEDBACK_RANGE, MAX_COMMENT, Ledger
from tokenomy.ledger.row import LedgerRow
from tokenomy.metrics.live import LiveSeries
from tokenomy.report.figures import BY, build, parse_time
from tokenomy.report.page import render_page

MAX_FEEDBACK_BYTES = 64 * 1024
# Live gauges shown next to the ledger's figures when the app's Metrics are given.
LIVE = ("tokenomy_queue_depth", "tokenomy_engine_running_seqs", "tokenomy_engine_kv_usage_ratio",
        "tokenomy_hw_power_watts", "tokenomy_hw_memory_bytes", "tokenomy_ledger_queue_depth")


def _live(metrics: Any) -> dict[str, float]:
    out: dict[str, float] = {}
    # several API workers: every worker's counts (Metrics.shared), as /metrics shows them
    for family in (getattr(metrics, "shared", None) or metrics.registry).collect():
        if family.name in LIVE:
            for s in family.samples:
                labels = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()))
                out[s.name + (f"{{{labels}}}" if labels else "")] = s.value
    return out


def _time(text: str | None, param: str, now: float) -> float | None:
    try:
        return parse_time(text, now)
    except (ValueError, OverflowError) as e:
        raise APIError(400, f"Invalid value for '{param}': {e}", param=param, code="invalid_time") from e


def request_not_found(request_id: str) -> APIError:
    """The one answer for a request id the caller may not give feedback on: unknown, or another key's."""
    return APIError(404, f"No request with id '{request_id}' is in the ledger.", param="request_id",
                    code="request_not_found")


def _err(status: int, message: str, param: str | None = None, code: str | None = None) -> JSONResponse:
    return error_response(APIError(status, message, param=param, code=code))


@dataclass
class Dashboard:
    """What the routes read from `app.state.dashboard`: the ledger, the app's Metrics (for live gauges, the
    operations view's series and the feedback histogram; None for none of them), the guards, how often the page
    refreshes its figures (`refresh_s`) and its live series (`live_s`), and the report's default window."""

    ledger: Ledger
    metrics: Any = None
    guard: Callable[[Request], Any] | None = None
    feedback_guard: Callable[[Request, LedgerRow], Any] | None = None
    authenticate: Callable[[Request], Any] | None = None
    models: Callable[[], dict[str, Any]] | None = None   # the fleet's ps view (Fleet.ps), shown as its table
    refresh_s: float = 5.0
    live_s: float = 2.0
    default_since: str = "24h"
    page: str = field(init=False, repr=False)
    live: LiveSeries | None = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.live = LiveSeries(self.metrics, min_interval_s=self.live_s / 2) if self.metrics is not None else None
        self.page = render_page(data_url="/dashboard/data", refresh_s=self.refresh_s, title="tokenomy dashboard",
                                live_url="/dashboard/live" if self.live is not None else None, live_s=self.live_s)


def _dashboard(request: Request) -> Dashboard:
    d: Dashboard = request.app.state.dashboard
    return d


async def dashboard(request: Request) -> HTMLResponse:
    return HTMLResponse(_dashboard(request).page, headers={"cache-control": "no-store"})


async def dashboard_data(request: Request) -> Response:
    d = _dashboard(request)
    try:
        if d.guard is not None:
            d.guard(request)
        q = request.query_params
        now = time.time()
        since, until = _time(q.get("since", d.default_since), "since", now), _time(q.get("until"), "until", now)
        by = q.get("by") or None
        if by is not None and by not in BY:
            raise APIError(400, f"by must be one of {', '.join(BY)}", param="by", code="invalid_value")
        if since is not None and until is not None and since > until:
            raise APIError(400, "since is after until", param="since", code="invalid_time")
        rows = await run_in_threadpool(d.ledger.query, since, until)
    except APIError as e:
        return error_response(e)
    data = build(rows, since, until, by)
    if d.metrics is not None:
        data["live"] = _live(d.metrics)
    if d.models is not None:
        data["models"] = d.models()
    return JSONResponse(data, headers={"cache-control": "no-store"})


async def dashboard_live(request: Request) -> Response:
    d = _dashboard(request)
    try:
        if d.guard is not None:
            d.guard(request)
        if d.live is None:
            raise APIError(404, "This dashboard has no metrics to show live.", code="not_found")
    except APIError as e:
        return error_response(e)
    data = await run_in_threadpool(d.live.poll)
    return JSONResponse(data, headers={"cache-control": "no-store"})


async def feedback(request: Request) -> Response:
    d = _dashboard(request)
    try:
        if d.authenticate is not None:
            d.authenticate(request)          # before a byte of the body is read
        body = await read_json(request, MAX_FEEDBACK_BYTES)      # the checks every body gets
    except APIError as e:
        return error_response(e)
    unknown = sorted(set(body) - {"request_id", "score", "comment"})
    if unknown:
        return _err(400, f"Unrecognized parameter: '{unknown[0]}'.", param=unknown[0], code="unknown_parameter")
    rid, score, comment = body.get("request_id"), body.get("score"), body.get("comment")
    if rid is None:
        return _err(400, "Missing required parameter: 'request_id'.", param="request_id", code="missing")
    if not isinstance(rid, str) or not rid.strip() or len(rid) > 64:
        return _err(400, "Invalid value for 'request_id': a request id (x-tokenomy-request-id) is expected.",
                    param="request_id", code="invalid_value")
    if score is None:
        return _err(400, "Missing required parameter: 'score'.", param="score", code="missing")
    lo, hi = FEEDBACK_RANGE
    if isinstance(score, bool) or not isinstance(score, int | float) or not math.isfinite(score) \
            or not lo <= score <= hi:
        return _err(400, f"Invalid value for 'score': a number from {lo:g} to {hi:g} is expected.",
                    param="score", code="invalid_value")
    if comment is not None and (not isinstance(comment, str) or len(comment) > MAX_COMMENT):
        return _err(400, f"Invalid value for 'comment': a string of at most {MAX_COMMENT} characters.",
                    param="comment", code="invalid_value")
    try:
        if d.feedback_guard is not None:
            row = await run_in_threadpool(d.ledger.get, rid)
            if row is None and await run_in_threadpool(d.ledger.flush):   # it may still be queued
                row = await run_in_threadpool(d.ledger.get, rid)
            if row is not None:
                try:
                    d.feedback_guard(request, row)
                except APIError as e:      # another key's request: the same 404 as an unknown id
                    raise request_not_found(rid) if e.status in (403, 404) else e from None
        found = await run_in_threadpool(d.ledger.feedback, rid, float(score), comment)
    except APIError as e:
        return error_response(e)
    if not found:
        return error_response(request_not_found(rid))
    if d.metrics is not None:
        d.metrics.feedback.observe(float(score))
    return JSONResponse({"object": "feedback", "request_id": rid, "score": float(score), "comment": comment})


ROUTES = [
    APIRoute("/dashboard", dashboard, methods=["GET"], response_class=HTMLResponse, include_in_schema=False),
    APIRoute("/dashboard/data", dashboard_data, methods=["GET"]),
    APIRoute("/dashboard/live", dashboard_live, methods=["GET"]),
    APIRoute("/v1/feedback", feedback, methods=["POST"]),
]
