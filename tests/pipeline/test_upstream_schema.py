"""Upstream answers are validated against the request's schema: flagged, or repaired once."""

from __future__ import annotations

import httpx
import pytest

from tests.conftest import NO_CACHE, live_server
from tests.helpers.upstream_stub import Stub
from tests.pipeline.test_gateway_upstream import StubServer
from tokenomy.generation import GenRequest, Usage
from tokenomy.pipeline.generate import schema_problem
from tokenomy.pipeline.request import Result

pytestmark = pytest.mark.slow       # a real engine, client or process (docs/testing.md)

SCHEMA = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
FMT = {"type": "json_schema", "json_schema": {"name": "x", "schema": SCHEMA}}


def test_schema_problem_names_what_is_wrong():
    req = GenRequest(model="m", messages=[{"role": "user", "content": "x"}], response_format=FMT)
    assert schema_problem(req, Result('{"n": 3}', "stop", Usage())) is None
    assert schema_problem(req, Result('{"n": "three"}', "stop", Usage()))
    assert schema_problem(req, Result("not json", "stop", Usage()))
    plain = GenRequest(model="m", messages=[{"role": "user", "content": "x"}])
    assert schema_problem(plain, Result("anything", "stop", Usage())) is None


def run(policy: str) -> tuple[httpx.Response, int, str]:
    with StubServer(Stub()) as s:
        cfg = {"cache": NO_CACHE, "models": [{"name": "up", "backend": "openai", "model": "stub",
                                              "base_url": f"http://127.0.0.1:{s.port}/v1", "tokenizer": "cl100k_base",
                                              "schema_policy": policy}]}
        with live_server(cfg) as gw:
            r = httpx.post(gw.base_url + "/chat/completions", timeout=60, json={
                "model": "up", "messages": [{"role": "user", "content": "a number"}], "response_format": FMT})
            gw.gateway.ledger.flush()
            row = gw.gateway.ledger.get(r.headers["x-tokenomy-request-id"])
            assert row is not None and row.error_code == "schema_invalid"
            return r, s.stub.hits, httpx.get(gw.root + "/metrics").text


def test_flag_policy_returns_the_answer_with_a_flag_and_counts_it():
    r, hits, metrics = run("flag")
    assert r.status_code == 200 and r.headers["x-tokenomy-schema"] == "invalid" and hits == 1
    assert 'tokenomy_schema_invalid_total{action="flagged",model="up"} 1.0' in metrics


def test_repair_policy_tries_once_more_then_flags():
    r, hits, metrics = run("repair")
    assert r.status_code == 200 and hits == 2 and r.headers["x-tokenomy-schema"] == "invalid"
