"""bench/replay_day.py on a small day: the recorded config reproduces the recorded cost; caches and the router
save on the candidate config."""

from __future__ import annotations

import time

import pytest
import yaml

from tests.helpers.bench_module import load_bench
from tokenomy.config import Config
from tokenomy.ledger.ledger import Ledger
from tokenomy.tools.replay.report import build
from tokenomy.tools.replay.traffic import load_trace


def test_a_small_synthetic_day(tmp_path):
    bench = load_bench("replay_day.py")
    url = f"sqlite:///{tmp_path / 'l.db'}"
    requests = bench.day(150, 4, 1, time.time() - 86400)
    bench.record(url, requests)
    with Ledger(url) as led:
        trace = load_trace(led)
        assert len(led.prompts()) == len(requests)
    live = Config.model_validate(yaml.safe_load(yaml.safe_dump(bench.live_config(url))))
    check = build(trace, live, "cache", [])
    assert check["cache"][0]["cost_usd"] == pytest.approx(check["recorded"]["cost_usd"], rel=1e-9)
    data = build(trace, Config.model_validate(bench.candidate_config(url)), "all", [0.9])
    rows = {name: cost for name, cost, _ in bench.savings(data)}
    base = rows["recorded (all on large, no response cache)"]
    assert rows["exact only"] < base and rows["exact + semantic 0.9"] <= rows["exact only"]
    assert rows["rules router (prove/derive -> large, rest small)"] < base
