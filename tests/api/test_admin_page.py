"""The admin page (GET /admin, tokenomy/api/admin_page.html) in headless Chromium over a live server: tenants and
keys with today's spend against their budgets (the admin API's figures), a key made, rotated and revoked from the
page and so refused by the API, the spend-over-time charts drawn, and a non-admin key shown an error and no data."""

from __future__ import annotations

import httpx
import pytest

from tests.api.test_admin_command import server_config
from tests.api.test_dashboard import launch_chromium
from tests.conftest import live_server
from tests.helpers.upstream_stub import Stub
from tests.pipeline.test_gateway_upstream import StubServer

pytestmark = pytest.mark.slow       # a real browser (docs/testing.md)

ADMIN = {"authorization": "Bearer sk-admin"}


def chat(root: str, key: str) -> int:
    return httpx.post(root + "/v1/chat/completions", headers={"authorization": f"Bearer {key}"},
                      json={"model": "a", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}).status_code


def test_the_admin_page_shows_spend_against_budget_and_makes_rotates_and_revokes_keys() -> None:
    from playwright.sync_api import sync_playwright

    with StubServer(Stub()) as stub, live_server(server_config(stub.port)) as gw:
        root = gw.root
        httpx.post(root + "/admin/tenants", headers=ADMIN, json={"name": "acme", "budget": {"usd_per_day": 5}})
        dev = httpx.post(root + "/admin/keys", headers=ADMIN, json={"name": "dev", "tenant": "acme"}).json()
        assert chat(root, dev["key"]) == 200
        httpx.patch(root + "/admin/tenants/acme", headers=ADMIN, json={"budget": {"usd_per_day": 0.001}})
        spent = httpx.get(root + "/admin/spend?group_by=tenant", headers=ADMIN).json()["data"][0]["cost_usd"]
        assert spent > 0.001                       # over its daily budget
        with sync_playwright() as pw:
            browser = launch_chromium(pw)
            try:
                page = browser.new_page()
                errors: list[str] = []
                page.on("pageerror", lambda e: errors.append(str(e)))
                page.on("dialog", lambda d: d.accept())
                page.goto(root + "/admin#key=sk-admin")
                page.wait_for_selector("body[data-loaded]", timeout=30_000)
                assert "#key" not in page.url                              # the key left the address bar
                row = page.locator('#tenants tr[data-tenant="acme"]')
                assert float(row.locator("[data-spent]").get_attribute("data-spent")) == pytest.approx(spent)
                assert row.locator(".over").count() == 1                   # spend past the budget is marked
                keys = page.locator("#keys tbody tr")
                assert keys.count() == 2
                config_row = page.locator("#keys tr", has_text="config")
                assert config_row.locator("button").count() == 0           # config keys are read-only
                assert page.locator("#chart-tenant .main-svg").count() >= 1
                assert page.evaluate("document.getElementById('chart-model').data.length") == 1
                # make a key on the page: shown once, and it works
                page.fill('#create input[name="name"]', "web")
                page.fill('#create input[name="tenant"]', "acme")
                page.click('#create button[type="submit"]')
                page.wait_for_selector("#new-key:not([hidden])")
                web = page.text_content("#new-key")
                assert web.startswith("sk-") and chat(root, web) in (200, 429)    # 429: acme is over budget
                listed = httpx.get(root + "/admin/keys", headers=ADMIN).json()["data"]
                web_id = next(k["id"] for k in listed if k["name"] == "web")
                page.wait_for_selector(f'#keys tr[data-key="{web_id}"]')
                # rotate it: a new key shown, the old one refused at once
                page.click(f'#keys tr[data-key="{web_id}"] button[data-action="rotate"]')
                page.wait_for_function(f"document.getElementById('new-key').textContent !== {web!r}")
                rotated = page.text_content("#new-key")
                assert chat(root, web) == 401 and chat(root, rotated) in (200, 429)
                # revoke the first key from the page
                page.click(f'#keys tr[data-key="{dev["id"]}"] button[data-action="revoke"]')
                page.wait_for_selector(f'#keys tr[data-key="{dev["id"]}"] [data-state="revoked"]')
                assert chat(root, dev["key"]) == 401
                assert errors == []
                # a non-admin key opens the page but sees an error and no data
                other = browser.new_page()
                other.goto(root + f"/admin#key={rotated}")
                other.wait_for_function("document.getElementById('error').textContent.length > 0")
                assert "admin key" in other.text_content("#error")
                assert other.locator("#admin").is_hidden() and other.locator("#keys tbody tr").count() == 0
                bare = browser.new_page()
                bare.goto(root + "/admin")
                bare.wait_for_function("document.getElementById('error').textContent.length > 0")
                assert bare.locator("#admin").is_hidden()
            finally:
                browser.close()
