"""A trained router file, loaded by path from config, routes live requests and explains the decision."""

from __future__ import annotations

import json
import os
import re

import httpx
import pytest
from typer.testing import CliRunner

from tests.conftest import NO_CACHE, live_server
from tokenomy.cli import app

DATA = os.environ.get("TOKENOMY_ROUTING_DATA", os.path.join(
    os.path.dirname(__file__), "..", "..", "..", "shared", "data", "routing", "routellm-dev.jsonl"))


def test_classifier_strategy_routes_with_its_calibrated_threshold(tmp_path):
    if not os.path.exists(DATA):
        pytest.skip("routing dev data not found")
    rows = [json.loads(x) for x in open(DATA)][::6]
    subset = tmp_path / "train.jsonl"
    subset.write_text("\n".join(json.dumps(r) for r in rows))
    out = tmp_path / "router.json"
    r = CliRunner().invoke(app, ["router", "train", "--data", str(subset), "--out", str(out)])
    assert r.exit_code == 0, r.output
    cfg = {"cache": NO_CACHE, "engine": {"n_ctx": 2048, "max_model_len": 1024, "max_running": 2},
           "models": [{"name": "weak", "gguf": "smollm2-135m-instruct"},
                      {"name": "strong", "gguf": "smollm2-135m-instruct", "price": {"input": 1, "output": 2}}],
           "routes": {"smart": {"strategy": "classifier", "models": ["weak", "strong"],
                                "classifier": {"path": str(out)}}}}
    with live_server(cfg) as gw:
        chosen = set()
        for row in rows[:12]:
            resp = httpx.post(gw.base_url + "/chat/completions", timeout=120, json={
                "model": "smart", "messages": [{"role": "user", "content": row["prompt"][:300]}], "max_tokens": 1})
            assert resp.status_code == 200
            header = resp.headers["x-tokenomy-route"]
            m = re.search(r"classifier: p=([0-9.]+) (>=|<) ([0-9.]+)", header)
            assert m, header
            p, op, t = float(m.group(1)), m.group(2), float(m.group(3))
            assert (op == ">=") == (p >= t)
            served = resp.json()["model"]
            assert served == ("weak" if op == ">=" else "strong")
            chosen.add(served)
        assert chosen == {"weak", "strong"}          # a router that always says one thing is not routing
