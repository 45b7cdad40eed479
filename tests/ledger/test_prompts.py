"""Stored prompts beside the ledger rows: opt-in per tenant, same transaction as the row, pruned by age."""

from __future__ import annotations

import time

import pytest

from tests.helpers.synthetic import PRICES, Spec, context, mixed, rows_for
from tokenomy.config import Config, ConfigError, LedgerSettings, load_config
from tokenomy.ledger.ledger import Ledger
from tokenomy.ledger.prompts import StoredPrompt
from tokenomy.pipeline.record import Record
from tokenomy.pipeline.sink import MeterSink


def _ask(ctx, text):
    ctx.gen.messages = [{"role": "user", "content": text}]
    ctx.gen.params = {"temperature": 0.0, "max_tokens": 4}
    ctx.headers = {"cache-control": "no-store", "x-tokenomy-meta-team": "blue", "authorization": "Bearer sk-x"}
    ctx.text = "answer to " + text
    return ctx


def test_only_opted_in_tenants_have_bodies_stored_and_every_row_is_written(ledger_url):
    settings = LedgerSettings(url=ledger_url, store_prompts=True, store_prompts_tenants=["acme"])
    from tokenomy.metrics.prometheus import Metrics

    with Ledger(ledger_url) as led:
        record = Record(Metrics(), sinks=[MeterSink(led, PRICES, store_prompts=settings.stores_prompts)])
        ctxs = [_ask(context(s, f"req_{i:04d}", time.time()), f"question {i}") for i, s in enumerate(mixed())]
        for ctx in ctxs:
            record.finish(ctx)
        assert led.flush()
        rows, stored = led.query(), led.prompts()
    assert len(rows) == len(ctxs) and led.failed == 0
    assert set(stored) == {c.request_id for c in ctxs if c.tenant == "acme"}
    assert {c.tenant for c in ctxs} - {"acme"}                       # the other tenants were there, not stored
    p = stored[ctxs[0].request_id]
    row = next(r for r in rows if r.request_id == p.request_id)
    assert p.ts == pytest.approx(row.ts) and p.answer == "answer to question 0"
    assert p.gen_request().messages == [{"role": "user", "content": "question 0"}]
    assert p.headers == {"cache-control": "no-store", "x-tokenomy-meta-team": "blue"}   # never the key


def test_without_opt_in_no_body_is_stored(tmp_path):
    url = f"sqlite:///{tmp_path / 'l.db'}"
    with Ledger(url) as led:
        sink = MeterSink(led, PRICES, store_prompts=LedgerSettings(url=url).stores_prompts)
        for i, s in enumerate(mixed()):
            sink(_ask(context(s, f"r{i}", time.time()), "q"))
        led.flush()
        assert len(led.query()) == len(mixed()) and led.prompts() == {}


def test_retention_prunes_old_bodies_and_keeps_their_rows(ledger_url):
    now = time.time()
    rows = rows_for([Spec("small", 10, 0, 2, ago_s=3 * 86400), Spec("small", 10, 0, 2, ago_s=60)], now=now)
    with Ledger(ledger_url) as led:
        for r in rows:
            led.write(r, StoredPrompt(r.request_id, r.ts, r.tenant, {"kind": "chat", "messages": []}, "a"))
        led.flush()
    with Ledger(ledger_url, prompt_retention_s=86400) as led:      # pruned on open
        assert set(led.prompts()) == {rows[1].request_id}
        assert led.prompts_pruned == 1 and len(led.query()) == 2
        assert led.prune_prompts(now=now + 2 * 86400) == 1 and led.prompts() == {}


def test_a_prompt_the_database_refuses_never_costs_its_row(tmp_path):
    rows = rows_for([Spec("small", 10, 0, 2, ago_s=10), Spec("small", 10, 0, 2, ago_s=5)])
    first = rows[0].request_id
    with Ledger(f"sqlite:///{tmp_path / 'l.db'}") as led:
        led.write(rows[0], StoredPrompt(first, rows[0].ts, "acme", {"kind": "chat"}, "a"))
        led.write(rows[1], StoredPrompt(first, rows[1].ts, "acme", {"kind": "chat"}, "b"))   # same key: refused
        led.flush()
        assert {r.request_id for r in led.query()} == {r.request_id for r in rows}
        assert led.written == 2 and led.failed == 0 and led.prompts_failed == 1
        assert led.prompts()[first].answer == "a"


def test_ledger_config_takes_a_url_or_a_mapping(tmp_path):
    assert Config.model_validate({"ledger": "sqlite:///x.db"}).ledger == LedgerSettings(url="sqlite:///x.db")
    assert Config.model_validate({"ledger": None}).ledger is None
    cfg = Config.model_validate({"ledger": {"url": "sqlite:///x.db", "store_prompts": True, "retention_days": 7}})
    assert cfg.ledger is not None and cfg.ledger.stores_prompts("anyone") and cfg.ledger.retention_days == 7
    assert not Config().ledger.stores_prompts("anyone")            # type: ignore[union-attr]
    bad = tmp_path / "bad.yaml"
    bad.write_text("ledger: {url: 'sqlite:///x.db', store_prompts_tenants: [acme]}\n")
    with pytest.raises(ConfigError, match="store_prompts_tenants needs store_prompts"):
        load_config(bad)
