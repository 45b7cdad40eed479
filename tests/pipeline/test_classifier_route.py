"""A trained router file, loaded by path from config, routes live requests and explains the decision."""

from __future__ import annotations

import json
import re

import httpx
import numpy as np
import pytest
from typer.testing import CliRunner

from tests.conftest import NO_CACHE, live_server
from tests.helpers.noise import shown
from tests.helpers.shared_data import shared_data
from tokenomy.cli import app

pytestmark = pytest.mark.slow       # a real engine, client or process (docs/testing.md)


def routing_rows(step: int) -> list[dict]:
    """Every step-th row of ../shared/data/routing/routellm-dev.jsonl (or $TOKENOMY_ROUTING_DATA)."""
    data = shared_data("routing/routellm-dev.jsonl", "TOKENOMY_ROUTING_DATA")
    return [json.loads(x) for x in data.read_text(encoding="utf-8").splitlines() if x.strip()][::step]


def test_classifier_strategy_routes_with_its_calibrated_threshold(tmp_path):
    rows = routing_rows(6)
    subset = tmp_path / "train.jsonl"
    subset.write_text("\n".join(json.dumps(r) for r in rows))
    out = tmp_path / "router.json"
    r = CliRunner().invoke(app, ["router", "train", "--data", str(subset), "--out", str(out)])
    assert r.exit_code == 0, r.output
    cfg = {"cache": NO_CACHE, "engine": {"n_ctx": 4096, "max_model_len": 1024, "max_running": 2, "max_retired": 2},
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
            assert (op == ">=") == (p >= t) or p == t      # both printed to 4 places: equal ones went either way
            served = resp.json()["model"]
            assert served == ("weak" if op == ">=" else "strong")
            chosen.add(served)
        assert chosen == {"weak", "strong"}          # a router that always says one thing is not routing


def test_a_contextual_router_shares_the_request_vector_with_the_semantic_cache(tmp_path):
    """A router on the "minilm" embedding reads the prompt's vector from the request's memo (where the semantic
    cache's lookup leaves it) and leaves it there when it had to embed (for the cache's add)."""
    from tokenomy.config import RouteSpec
    from tokenomy.generation import GenRequest
    from tokenomy.pipeline.request import RequestContext
    from tokenomy.pipeline.route import Route
    from tokenomy.tools.router_training.dataset import load_routing_data
    from tokenomy.tools.router_training.train import train_classifier

    rows = routing_rows(12)
    subset = tmp_path / "train.jsonl"
    subset.write_text("\n".join(json.dumps(r) for r in rows))
    router = train_classifier(load_routing_data(subset), embedding="minilm")
    router.save(tmp_path / "router.json")
    spec = RouteSpec.model_validate({"strategy": "classifier", "models": ["weak", "strong"],
                                     "classifier": {"path": str(tmp_path / "router.json")}})
    route = Route(["weak", "strong"], {"smart": spec})

    def choose(text: str, vectors: dict) -> tuple[float, RequestContext]:
        ctx = RequestContext(gen=GenRequest(model="smart", messages=[{"role": "user", "content": text}]))
        ctx.vectors.update(vectors)
        _, _, signals = route.choose(spec, ctx)
        return signals["p_cheap_ok"], ctx

    gsm, mmlu = rows[-1]["prompt"], rows[0]["prompt"]
    assert rows[-1]["benchmark"] == "gsm8k" and rows[0]["benchmark"] == "mmlu"
    p, ctx = choose(gsm, {})
    assert set(ctx.vectors) == {gsm}                                   # embedded here, left for the cache
    # The route's classifier, loaded from the file, computes what the trained one does on the same vector (to
    # kernel noise: tests/helpers/noise.py); the vector is the text's embedding, to float32 noise.
    assert p == shown(router.p_weak_ok(gsm, ctx.vectors[gsm]))
    np.testing.assert_allclose(ctx.vectors[gsm], router.embed([gsm])[0], rtol=0, atol=1e-6)
    # The memo's vector is what the router judges: the MMLU prompt's vector under the GSM8K text gives the
    # probability of that vector, not of the text's own embedding.
    other = router.embed([mmlu])[0]
    planted, ctx = choose(gsm, {gsm: other})
    assert planted == shown(router.p_weak_ok(gsm, other)) and planted != p
    assert ctx.vectors[gsm] is other


def test_a_two_head_router_uses_the_contextual_head_only_when_the_memo_holds_the_vector(tmp_path):
    """The route stage decides with the contextual head when the prompt's contextual vector is already in the
    request's memo (the semantic cache's lookup put it there), and with the static head otherwise, without
    embedding the prompt contextually; the signals and the reason say which head decided."""
    from tests.helpers.routing_fixtures import synthetic_rows
    from tokenomy.config import RouteSpec
    from tokenomy.generation import GenRequest
    from tokenomy.pipeline.request import RequestContext
    from tokenomy.pipeline.route import Route
    from tokenomy.tools.router_training.dataset import load_routing_data
    from tokenomy.tools.router_training.train import train_router

    data = tmp_path / "tiny.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in synthetic_rows(48)))
    router = train_router(load_routing_data(data))
    router.save(tmp_path / "router.json")
    static, contextual = router.head("minilm-static"), router.head("minilm")
    spec = RouteSpec.model_validate({"strategy": "classifier", "models": ["weak", "strong"],
                                     "classifier": {"path": str(tmp_path / "router.json")}})
    route = Route(["weak", "strong"], {"smart": spec})

    def choose(text: str, vectors: dict) -> tuple[list[str], str, dict, RequestContext]:
        ctx = RequestContext(gen=GenRequest(model="smart", messages=[{"role": "user", "content": text}]))
        ctx.vectors.update(vectors)
        return *route.choose(spec, ctx), ctx

    text = "Ann has 4 coins and buys 1250 more each day for 9 days, then gives away half. How many are left?"
    ladder, by, signals, ctx = choose(text, {})
    assert signals["head"] == "minilm-static" and "(minilm-static head)" in by
    assert signals["p_cheap_ok"] == shown(static.p_weak_ok(text))
    assert signals["threshold"] == round(static.threshold, 4)
    assert ladder[0] == ("weak" if static.p_weak_ok(text) >= static.threshold else "strong")
    assert ctx.vectors == {}                                  # nothing embedded contextually for the route
    vector = contextual.embed([text])[0]                      # what the semantic cache's lookup leaves in the memo
    ladder, by, signals, ctx = choose(text, {text: vector})
    assert signals["head"] == "minilm" and "(minilm head)" in by
    assert signals["p_cheap_ok"] == shown(contextual.p_weak_ok(text, vector))
    assert signals["threshold"] == round(contextual.threshold, 4)
    assert ladder[0] == ("weak" if contextual.p_weak_ok(text, vector) >= contextual.threshold else "strong")
    # The memo's vector is what decides: another prompt's vector under this text gives that vector's probability.
    other = contextual.embed(["What is the capital of Peru?\nA. Lima\nB. Oslo\nAnswer:"])[0]
    _, _, planted, _ = choose(text, {text: other})
    assert planted["head"] == "minilm" and planted["p_cheap_ok"] == shown(contextual.p_weak_ok(text, other))
    assert planted["p_cheap_ok"] != signals["p_cheap_ok"]
    # A vector memoised for another text does not count.
    _, _, signals, _ = choose(text, {"something else": vector})
    assert signals["head"] == "minilm-static"
