"""Keys, tenants and limits at the admit stage, through the live API."""

from __future__ import annotations

import hashlib

import httpx
import pytest

from tests.conftest import NO_CACHE, SMALL_ENGINE, live_server

pytestmark = pytest.mark.slow       # a real engine, client or process (docs/testing.md)

BODY = {"model": "smollm2-135m-instruct", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}


@pytest.fixture(scope="module")
def gw():
    cfg = {"engine": SMALL_ENGINE, "cache": NO_CACHE, "keys": [
        {"key": "sk-alice", "name": "alice", "tenant": "acme", "rpm": 2},
        {"key_sha256": hashlib.sha256(b"sk-bob").hexdigest(), "name": "bob", "tenant": "globex", "tpm": 40},
        {"key": "sk-admin", "name": "ops", "tenant": "ops", "admin": True},
    ]}
    with live_server(cfg) as s:
        yield s


def chat(gw, key=None):
    headers = {"authorization": f"Bearer {key}"} if key else {}
    return httpx.post(gw.base_url + "/chat/completions", json=BODY, headers=headers, timeout=60)


def test_missing_and_wrong_keys_get_401(gw):
    r = chat(gw)
    assert r.status_code == 401 and r.json()["error"]["code"] == "missing_api_key"
    r = chat(gw, "sk-mallory")
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"


def test_requests_per_minute_per_key_and_tenants_separated(gw):
    assert chat(gw, "sk-alice").status_code == 200
    assert chat(gw, "sk-alice").status_code == 200
    r = chat(gw, "sk-alice")
    assert r.status_code == 429 and int(r.headers["retry-after"]) >= 1
    assert "2 requests per minute" in r.json()["error"]["message"]
    assert chat(gw, "sk-bob").status_code == 200            # another tenant's key is unaffected


def test_tokens_per_minute(gw):
    # bob's first request (previous test, or this one) used more than 10 tokens: the next is refused
    chat(gw, "sk-bob")
    r = chat(gw, "sk-bob")
    assert r.status_code == 429 and "tokens per minute" in r.json()["error"]["message"]


def test_admin_endpoints_need_an_admin_key(gw):
    url = gw.root + "/admin/keys"
    assert httpx.get(url).status_code == 401
    r = httpx.get(url, headers={"authorization": "Bearer sk-alice"})
    assert r.status_code == 403 and r.json()["error"]["code"] == "not_admin"
    r = httpx.get(url, headers={"authorization": "Bearer sk-admin"})
    assert r.status_code == 200
    assert {k["tenant"] for k in r.json()["data"]} == {"acme", "globex", "ops"}
    assert "sk-" not in r.text
    r = httpx.post(gw.root + "/admin/reload", headers={"authorization": "Bearer sk-admin"})
    assert r.status_code == 400 and "config file" in r.json()["error"]["message"]
