"""tokenomy replay on a ledger a live server recorded in this test, on synthetic rows, and on bad input."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from typer.testing import CliRunner

from tests.conftest import SMALL_ENGINE, live_server
from tests.helpers.synthetic import Spec, mixed, rows_for
from tokenomy.cli import app
from tokenomy.ledger.ledger import Ledger
from tokenomy.ledger.prompts import StoredPrompt

pytestmark = pytest.mark.slow       # a real engine, client or process (docs/testing.md)

runner = CliRunner()
PRICE = {"input": 2.0, "cached_input": 0.5, "output": 8.0}
QUESTIONS = [   # (tenant, question): a miss, its exact repeat, a paraphrase, another question, another tenant
    ("acme", "What is the capital of France?"),
    ("acme", "What is the capital of France?"),
    ("acme", "What's the capital city of France?"),
    ("acme", "Name one primary colour."),
    ("beta", "What is the capital of France?"),
    ("acme", "Name one primary colour."),
]


def live_config(tmp: Path) -> dict[str, Any]:
    return {"engine": {**SMALL_ENGINE, "n_threads": 1},
            "models": [{"name": "small", "gguf": "smollm2-135m-instruct", "price": PRICE}],
            "cache": {"path": str(tmp / "cache"), "semantic": {"threshold": 0.8, "error_budget": None,
                                                               "min_margin": 0.0}},
            "ledger": {"url": f"sqlite:///{tmp / 'ledger.db'}", "store_prompts": True},
            "keys": [{"key": "sk-acme", "tenant": "acme"}, {"key": "sk-beta", "tenant": "beta"}]}


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    tmp = tmp_path_factory.mktemp("replay")
    cfg = live_config(tmp)
    with live_server(cfg) as srv:
        for tenant, q in QUESTIONS:
            body = {"model": "small", "messages": [{"role": "user", "content": q}], "max_tokens": 4,
                    "temperature": 0}
            r = httpx.post(srv.base_url + "/chat/completions", json=body, timeout=120,
                           headers={"authorization": f"Bearer sk-{tenant}"})
            assert r.status_code == 200, r.text
        assert srv.gateway.ledger.flush()
    path = tmp / "live.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path, cfg


def replay(*args: str) -> Any:
    result = runner.invoke(app, ["replay", *args])
    return result


def replay_json(*args: str) -> dict[str, Any]:
    result = replay(*args, "--format", "json")
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_replay_with_the_live_config_reproduces_recorded_cost_and_cache_hits(recorded):
    path, cfg = recorded
    data = replay_json("--ledger", cfg["ledger"]["url"], "--config", str(path))
    rec = data["recorded"]
    assert rec["requests"] == len(QUESTIONS) == rec["with_bodies"]
    assert rec["exact"]["requests"] == 2 and rec["semantic"]["requests"] == 1      # the trace is what we meant
    live = data["cache"][0]
    assert live["name"].startswith("candidate") and live["evaluated"] == len(QUESTIONS)
    assert live["cost_usd"] == pytest.approx(rec["cost_usd"], rel=0.01)
    for layer in ("exact", "semantic"):
        assert live[layer]["requests"] == rec[layer]["requests"]
        assert live[layer]["tokens"] == pytest.approx(rec[layer]["tokens"], rel=0.01)
        assert live[layer]["usd"] == pytest.approx(rec[layer]["usd"], rel=0.01)
    price = {p["name"]: p["cost_usd"] for p in data["price"]}
    assert price["recomputed from tokens x recorded prices"] == pytest.approx(rec["cost_usd"], rel=0.01)
    assert data["route"]["chosen"] == {"small": 3} and data["route"]["agreement"] == 1.0


def test_a_candidate_config_gives_the_hand_computed_difference(recorded, tmp_path):
    path, cfg = recorded
    candidate = dict(cfg, models=[{"name": "small", "gguf": "smollm2-135m-instruct",
                                   "price": {k: 2 * v for k, v in PRICE.items()}}],
                     cache={"semantic": {"threshold": 0.99, "error_budget": None, "min_margin": 0.0}})
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(candidate))
    data = replay_json("--ledger", cfg["ledger"]["url"], "--config", str(tmp_path / "c.yaml"),
                       "--thresholds", "0.8")
    rec = data["recorded"]
    with Ledger(cfg["ledger"]["url"]) as led:
        rows = led.query()
    paraphrase = next(r for r in rows if r.cache == "semantic")
    strict, loose = data["cache"][0], next(p for p in data["cache"] if p["name"] == "exact + semantic 0.8")
    assert strict["semantic"]["requests"] == 0 and strict["exact"]["requests"] == 2   # 0.99: the paraphrase misses
    assert strict["cost_usd"] == pytest.approx(rec["cost_usd"] + paraphrase.saved_by["semantic"]["usd"], rel=1e-9)
    assert loose["cost_usd"] == pytest.approx(rec["cost_usd"], rel=0.01)
    exact_only = next(p for p in data["cache"] if p["name"] == "exact only")
    assert exact_only["cost_usd"] == pytest.approx(strict["cost_usd"])
    price = {p["name"]: p["cost_usd"] for p in data["price"]}
    assert price["candidate config's prices"] == pytest.approx(2 * price["recomputed from tokens x recorded prices"])
    no_cache = sum(r.cost_usd for r in rows) + sum(r.saved_by[r.cache]["usd"] for r in rows if r.cache_hit)
    assert price["no response cache"] == pytest.approx(no_cache)


def test_table_and_html_render(recorded, tmp_path):
    path, cfg = recorded
    table = replay("--ledger", cfg["ledger"]["url"], "--config", str(path), "--what", "cache")
    assert table.exit_code == 0 and "response caches" in table.stdout and "exact + semantic 0.9" in table.stdout
    out = tmp_path / "r.html"
    page = replay("--ledger", cfg["ledger"]["url"], "--what", "price", "-f", "html", "-o", str(out))
    assert page.exit_code == 0 and "<table>" in out.read_text() and "all on small" in out.read_text()


def _write(url: str, rows: list, prompts: dict[str, StoredPrompt] | None = None) -> None:
    with Ledger(url) as led:
        for r in rows:
            led.write(r, (prompts or {}).get(r.request_id))
        led.flush()


def test_without_stored_prompts_replay_says_what_it_cannot_evaluate(tmp_path):
    url = f"sqlite:///{tmp_path / 'l.db'}"
    _write(url, rows_for(mixed()))
    data = replay_json("--ledger", url)
    assert "cache" not in data and "route" not in data
    cannot = " ".join(data["cannot_evaluate"])
    assert "no request bodies were stored" in cannot and "no candidate config" in cannot
    assert data["price"][0]["name"] == "recorded"     # prices work from the rows alone
    assert {p["name"] for p in data["price"]} >= {"all on small", "all on large", "no response cache"}


@pytest.fixture(params=["sqlite", "postgresql"])
def ledger_url(request: pytest.FixtureRequest, tmp_path: Path):
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'ledger.db'}"
    else:
        from tests.helpers.ledger_urls import pg_schema_url

        yield from pg_schema_url(request.getfixturevalue("postgres_url"))


def test_a_candidate_router_on_stored_prompts_hand_checked(ledger_url, tmp_path):
    texts = ["prove that 2 is prime", "say hi", "derive the area of a circle", "say bye"]
    rows = rows_for([Spec("small", 100, 0, 10, route="default", ago_s=100 - i) for i in range(4)])
    prompts = {r.request_id: StoredPrompt(r.request_id, r.ts, r.tenant, {
        "kind": "chat", "model": "default", "messages": [{"role": "user", "content": t}], "params": {}})
        for r, t in zip(rows, texts, strict=True)}
    _write(ledger_url, rows, prompts)
    cfg = {"models": [{"name": "small", "backend": "openai", "base_url": "http://127.0.0.1:9/v1",
                       "price": {"input": 1.0, "output": 2.0}},
                      {"name": "large", "backend": "openai", "base_url": "http://127.0.0.1:9/v1",
                       "price": {"input": 10.0, "output": 20.0}}],
           "routes": {"default": {"strategy": "rules", "models": ["small", "large"],
                                  "rules": [{"when": {"keywords": ["prove", "derive"]}, "model": "large"}]}}}
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(cfg))
    data = replay_json("--ledger", ledger_url, "--config", str(tmp_path / "c.yaml"), "--what", "route")
    r = data["route"]
    assert r["chosen"] == {"large": 2, "small": 2} and r["recorded"] == {"small": 4} and r["agreement"] == 0.5
    assert r["cost_usd"] == pytest.approx(2 * (100 * 1 + 10 * 2) / 1e6 + 2 * (100 * 10 + 10 * 20) / 1e6)


def _one_line_error(result: Any, fragment: str) -> None:
    err = result.stderr
    assert result.exit_code != 0, result.output
    assert "Traceback" not in result.output and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1 and fragment in err, err


def test_bad_input_gets_one_clear_line(tmp_path):
    url = f"sqlite:///{tmp_path / 'l.db'}"
    Ledger(url).close()                                          # an empty ledger
    _one_line_error(replay("--ledger", url), "no rows in this window")
    _write(url, rows_for([Spec("small", 10, 0, 1)]))
    _one_line_error(replay("--ledger", url, "--what", "everything"), "--what 'everything' is not one of")
    _one_line_error(replay("--ledger", url, "--since", "yesterday-ish"), "is not a time")
    _one_line_error(replay("--ledger", url, "--since", "1h", "--until", "2h"), "--since is after --until")
    _one_line_error(replay("--ledger", url, "--thresholds", "0.9,2"), "each must be in (0, 1]")
    bad = tmp_path / "bad.yaml"
    bad.write_text("cache: {semantic: {threshold: 7}}\nnonsense: 1\n")
    _one_line_error(replay("--ledger", url, "--config", str(bad)), "invalid configuration")
    _one_line_error(replay("--ledger", url, "--config", str(tmp_path / "missing.yaml")), "cannot read config")
    _one_line_error(replay("--ledger", f"sqlite:///{tmp_path / 'none.db'}"), "no ledger at")
    _one_line_error(replay("--ledger", "mysql://x/y"), "use sqlite:///FILE or postgresql://")
    since = time.time() + 3600
    _one_line_error(replay("--ledger", url, "--since", str(since)), "no rows in this window")


def test_report_verify_agrees_on_the_ledger_the_live_server_recorded(recorded):
    _, cfg = recorded
    result = runner.invoke(app, ["report", "--ledger", cfg["ledger"]["url"], "--verify", "--by", "tenant"])
    assert result.exit_code == 0, result.stderr
    assert "agree with the report" in result.stderr
