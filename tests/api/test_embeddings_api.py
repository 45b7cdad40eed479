"""POST /v1/embeddings with the official openai client: the packaged all-MiniLM-L6-v2 and an OpenAI-compatible
upstream's embedding model (the stub), through keys, limits, budgets, the ledger and the metrics."""

from __future__ import annotations

import base64
import threading
from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np
import openai
import pytest

from tests.conftest import NO_CACHE, LiveServer, free_port, live_server
from tests.helpers.noise import EMBEDDING_NOISE, assert_same_vectors
from tests.helpers.upstream_stub import Stub, stub_vector
from tests.helpers.wait import wait_until
from tests.pipeline.test_gateway_upstream import StubServer
from tokenomy.embedding.embedder import default_embedder

pytestmark = pytest.mark.slow       # a real engine, client or process (docs/testing.md)

MINILM = "all-minilm-l6-v2"
CHAT_MODEL = "smollm2-135m-instruct"
QUESTION = "How do I learn Python quickly?"
PARAPHRASE = "What is the fastest way to learn Python?"
UNRELATED = "Why is the sky blue?"
MINILM_PRICE = 0.005        # tokenomy/models/catalog.py PACKAGED_EMBEDDINGS: notional USD per 1M input tokens


def own(texts: list[str]) -> np.ndarray:
    """The vectors the gateway's embedder itself gives (the semantic cache's instance: embed_threads 1)."""
    return default_embedder(1).embed(texts)


def vectors(response: Any) -> np.ndarray:
    return np.array([d.embedding for d in response.data], dtype=np.float32)


def decode(b64: str) -> np.ndarray:
    return np.frombuffer(base64.b64decode(b64), dtype="<f4")


def post(srv: LiveServer, body: dict[str, Any], key: str | None = None) -> httpx.Response:
    headers = {"authorization": f"Bearer {key}"} if key else {}
    return httpx.post(srv.base_url + "/embeddings", json=body, headers=headers, timeout=120)


def ledger_row(srv: LiveServer, request_id: str) -> Any:
    ledger = srv.gateway.ledger

    def found() -> Any:
        ledger.flush()
        return next((r for r in ledger.query() if r.request_id == request_id), None)

    return wait_until(found, what=f"the ledger row of {request_id}")


# --- the packaged MiniLM on the session server (no keys) -----------------------------------------------------------

def test_the_packaged_embedder_is_listed_after_the_configured_models(client):
    assert [m.id for m in client.models.list().data] == [CHAT_MODEL, MINILM]
    assert client.models.retrieve(MINILM).id == MINILM


def test_a_string_and_a_list_give_the_embedders_own_vectors_in_order(client):
    one = client.embeddings.create(model=MINILM, input=QUESTION, encoding_format="float")
    assert one.object == "list" and one.model == MINILM and len(one.data) == 1
    assert one.data[0].object == "embedding" and one.data[0].index == 0 and len(one.data[0].embedding) == 384
    texts = [QUESTION, PARAPHRASE, UNRELATED]
    many = client.embeddings.create(model=MINILM, input=texts, encoding_format="float")
    assert [d.index for d in many.data] == [0, 1, 2]
    got = vectors(many)
    assert_same_vectors(got, own(texts))
    assert_same_vectors(vectors(one)[0], got[0])                  # alone or in a batch: the same vector
    assert np.linalg.norm(got, axis=1) == pytest.approx(1.0, abs=EMBEDDING_NOISE)
    assert float(vectors(one)[0] @ got[0]) == pytest.approx(1.0, abs=EMBEDDING_NOISE)
    assert float(got[0] @ got[1]) > float(got[0] @ got[2]) + 0.3  # a paraphrase is closer than an unrelated text
    tokens = sum(len(ids) for ids in default_embedder(1).tokenize(texts))   # [CLS] and [SEP] counted
    assert many.usage.prompt_tokens == many.usage.total_tokens == tokens


def test_base64_and_float_give_the_same_vectors(server, client):
    floats = vectors(client.embeddings.create(model=MINILM, input=[QUESTION, UNRELATED], encoding_format="float"))
    sdk_default = client.embeddings.create(model=MINILM, input=[QUESTION, UNRELATED])   # asks base64, decodes
    assert_same_vectors(vectors(sdk_default), floats)
    explicit = client.embeddings.create(model=MINILM, input=[QUESTION, UNRELATED], encoding_format="base64")
    assert all(isinstance(d.embedding, str) for d in explicit.data)
    assert_same_vectors(np.stack([decode(d.embedding) for d in explicit.data]), floats)
    raw = post(server, {"model": MINILM, "input": QUESTION, "encoding_format": "base64"})
    assert raw.status_code == 200 and decode(raw.json()["data"][0]["embedding"]).shape == (384,)


def test_token_ids_are_the_models_wordpieces_with_or_without_cls_and_sep(client):
    tok = default_embedder(1).tokenizer
    bare = tok.encode(QUESTION, add_special_tokens=False).ids
    full = tok.encode(QUESTION).ids
    assert full == [tok.token_to_id("[CLS]"), *bare, tok.token_to_id("[SEP]")]
    want = own([QUESTION])[0]
    for ids in (bare, full):
        r = client.embeddings.create(model=MINILM, input=ids, encoding_format="float")
        assert_same_vectors(vectors(r)[0], want)
        assert r.usage.prompt_tokens == len(full)
    both = client.embeddings.create(model=MINILM, input=[bare, tok.encode(UNRELATED).ids], encoding_format="float")
    assert_same_vectors(vectors(both), own([QUESTION, UNRELATED]))


def test_dimensions_are_refused_unless_they_are_the_models_own(client):
    r = client.embeddings.create(model=MINILM, input=QUESTION, dimensions=384, encoding_format="float")
    assert len(r.data[0].embedding) == 384
    with pytest.raises(openai.BadRequestError) as e:
        client.embeddings.create(model=MINILM, input=QUESTION, dimensions=128)
    assert e.value.body["param"] == "dimensions" and "384" in e.value.body["message"]


@pytest.mark.parametrize(("body", "param", "says"), [
    ({"model": MINILM}, "input", "Missing"),
    ({"model": MINILM, "input": ""}, "input", "empty string"),
    ({"model": MINILM, "input": []}, "input", "empty"),
    ({"model": MINILM, "input": ["a", ""]}, "input", "input[1] is an empty string"),
    ({"model": MINILM, "input": [[1, 2], []]}, "input", "input[1] is an empty token-id list"),
    ({"model": MINILM, "input": ["a", 7]}, "input", "not both"),
    ({"model": MINILM, "input": [[1, 2], ["a"]]}, "input", "input[1]"),
    ({"model": MINILM, "input": [1, -2]}, "input", "token-id"),
    ({"model": MINILM, "input": [True, False]}, "input", "token-id"),
    ({"model": MINILM, "input": {"text": "a"}}, "input", "must be a string"),
    ({"model": MINILM, "input": ["a"] * 2049}, "input", "at most 2048"),
    ({"model": MINILM, "input": "a", "encoding_format": "int8"}, "encoding_format", "float"),
    ({"model": MINILM, "input": "a", "dimensions": 0}, "dimensions", ""),
    ({"model": MINILM, "input": "a", "dimensions": "384"}, "dimensions", ""),
    ({"input": "a"}, "model", "Missing"),
])
def test_bad_bodies_are_400s_in_openais_shape(server, body, param, says):
    r = post(server, body)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and err["param"] == param and says in err["message"], err


def test_inputs_the_model_cannot_read_whole_are_refused_not_truncated(server):
    long = post(server, {"model": MINILM, "input": ["short", "word " * 300]})
    assert long.status_code == 400 and long.json()["error"]["code"] == "input_too_long", long.text
    assert "input[1] is 302 tokens" in long.json()["error"]["message"] and "256" in long.json()["error"]["message"]
    r = post(server, {"model": MINILM, "input": [[101, 30522]]})
    assert r.status_code == 400 and "30522" in r.json()["error"]["message"], r.text


def test_unknown_models_are_404s_and_the_wrong_kind_of_model_a_400(server, client):
    with pytest.raises(openai.NotFoundError) as e:
        client.embeddings.create(model="text-embedding-3-small", input="hi")
    assert e.value.body["code"] == "model_not_found" and MINILM in e.value.body["message"]
    with pytest.raises(openai.BadRequestError) as e:
        client.embeddings.create(model=CHAT_MODEL, input="hi")
    assert e.value.body["code"] == "not_an_embedding_model" and MINILM in e.value.body["message"]
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=MINILM, messages=[{"role": "user", "content": "hi"}], max_tokens=2)
    assert e.value.body["code"] == "not_a_generation_model" and "/v1/embeddings" in e.value.body["message"]


def test_a_request_gets_its_ledger_row_cost_and_metrics(server, client):
    raw = client.embeddings.with_raw_response.create(model=MINILM, input=[QUESTION, PARAPHRASE])
    r = raw.parse()
    rid = raw.headers["x-tokenomy-request-id"]
    assert raw.headers["x-tokenomy-route"] == f"{MINILM}; pinned model"
    row = ledger_row(server, rid)
    assert (row.api, row.model, row.status, row.cache) == ("embeddings", MINILM, 200, "bypass")
    assert row.prompt_tokens == r.usage.prompt_tokens and row.completion_tokens == 0
    assert row.price_input == MINILM_PRICE and row.price_notional
    assert row.cost_usd == pytest.approx(r.usage.prompt_tokens * MINILM_PRICE / 1e6)
    assert float(raw.headers["x-tokenomy-cost-usd"]) == pytest.approx(row.cost_usd, abs=1e-8)
    metrics = httpx.get(server.root + "/metrics").text
    assert f'tokenomy_requests_total{{endpoint="embeddings",model="{MINILM}",status="ok"}}' in metrics
    prompt = [line for line in metrics.splitlines()
              if line.startswith(f'tokenomy_tokens_total{{kind="prompt",model="{MINILM}"}}')]
    assert prompt and float(prompt[0].split()[-1]) >= r.usage.prompt_tokens


def test_a_body_refused_before_the_pipeline_still_gets_its_ledger_row(server):
    ledger = server.gateway.ledger

    def refused_rows() -> int:
        ledger.flush()
        return sum(r.api == "embeddings" and r.status == 400 and r.model is None for r in ledger.query())

    before = refused_rows()
    assert post(server, {"model": MINILM, "input": ""}).status_code == 400
    wait_until(lambda: refused_rows() == before + 1, what="the refused request's row")


def test_an_embedding_in_progress_leaves_the_event_loop_free(server, client):
    backend = server.gateway.embedders[MINILM]
    client.embeddings.create(model=MINILM, input="load the model")
    done: dict[str, Any] = {}

    def ask(name: str, texts: list[str]) -> None:
        done[name] = client.embeddings.create(model=MINILM, input=texts, encoding_format="float")

    first = threading.Thread(target=ask, args=("first", [QUESTION, UNRELATED]))
    second = threading.Thread(target=ask, args=("second", [PARAPHRASE]))
    with backend.embedder._lock:            # the embedder is busy, as with another caller's long batch
        first.start()
        second.start()
        wait_until(lambda: backend.pending == 2, what="both requests to reach the embedder")
        assert httpx.get(server.base_url + "/models", timeout=30).status_code == 200   # the loop still serves
        assert httpx.get(server.root + "/health", timeout=30).status_code == 200
        assert first.is_alive() and second.is_alive() and not done
    first.join(60)
    second.join(60)
    assert_same_vectors(vectors(done["first"]), own([QUESTION, UNRELATED]))
    assert_same_vectors(vectors(done["second"]), own([PARAPHRASE]))
    assert backend.pending == 0


# --- keys, limits, budgets and an upstream's embedding model -------------------------------------------------------

UPSTREAM_PRICE = 2.0


@pytest.fixture(scope="module")
def keyed() -> Iterator[tuple[LiveServer, Stub]]:
    stub = Stub()
    with StubServer(stub) as up:
        url = f"http://127.0.0.1:{up.port}/v1"
        dead = f"http://127.0.0.1:{free_port()}/v1"
        cfg = {"cache": NO_CACHE,
               "models": [{"name": "stub-embed", "backend": "openai", "base_url": url, "model": "stub-embedding",
                           "max_retries": 0, "price": {"input": UPSTREAM_PRICE}},
                          {"name": "stub-pool", "backend": "openai", "replicas": [dead, url],
                           "model": "stub-embedding", "balance": {"check_interval_s": 0}}],
               "keys": [{"key": "sk-a", "tenant": "a"},
                        {"key": "sk-narrow", "tenant": "n", "models": ["stub-embed"]},
                        {"key": "sk-rpm", "tenant": "r", "rpm": 1},
                        {"key": "sk-budget", "tenant": "b", "budget": {"tokens_per_day": 5}}]}
        with live_server(cfg) as srv:
            yield srv, stub


def sdk(srv: LiveServer, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=srv.base_url, api_key=key, max_retries=0, timeout=120)


def test_an_upstreams_embedding_model_is_passed_through(keyed):
    srv, stub = keyed
    c = sdk(srv, "sk-a")
    raw = c.embeddings.with_raw_response.create(model="stub-embed", input=["one two", "three"],
                                                encoding_format="float", user="u-1")
    r = raw.parse()
    sent = stub.bodies[-1]
    assert (sent["model"], sent["input"], sent["encoding_format"], sent["user"]) == (
        "stub-embedding", ["one two", "three"], "float", "u-1")
    assert r.model == "stub-embed" and r.usage.prompt_tokens == 3            # the upstream's usage
    assert_same_vectors(vectors(r), [stub_vector("one two"), stub_vector("three")])
    default = c.embeddings.create(model="stub-embed", input=["one two", "three"])     # the SDK's base64
    assert stub.bodies[-1]["encoding_format"] == "base64"
    assert_same_vectors(vectors(default), vectors(r))
    short = c.embeddings.create(model="stub-embed", input=[[5, 6, 7]], dimensions=4, encoding_format="float")
    assert stub.bodies[-1]["dimensions"] == 4 and stub.bodies[-1]["input"] == [[5, 6, 7]]
    assert_same_vectors(vectors(short)[0], stub_vector([5, 6, 7], 4))
    with pytest.raises(openai.BadRequestError) as e:                          # the upstream refuses: a 400
        c.embeddings.create(model="stub-embed", input="x", dimensions=16)
    assert "8 dimensions" in e.value.body["message"]
    row = ledger_row(srv, raw.headers["x-tokenomy-request-id"])
    assert (row.api, row.model, row.backend, row.prompt_tokens) == ("embeddings", "stub-embed", "openai", 3)
    assert row.cost_usd == pytest.approx(3 * UPSTREAM_PRICE / 1e6) and row.tenant == "a"


def test_a_pool_of_upstreams_fails_over_for_embeddings(keyed):
    srv, _ = keyed
    c = sdk(srv, "sk-a")
    for _ in range(2):      # whichever replica comes first, the dead one is passed over
        r = c.embeddings.create(model="stub-pool", input="one", encoding_format="float")
        assert_same_vectors(vectors(r)[0], stub_vector("one"))


def test_keys_allow_lists_rate_limits_and_budgets_apply(keyed):
    srv, _ = keyed
    with pytest.raises(openai.AuthenticationError):
        sdk(srv, "sk-wrong").embeddings.create(model=MINILM, input="hi")
    assert post(srv, {"model": MINILM, "input": "hi"}).status_code == 401
    ok = sdk(srv, "sk-a").embeddings.create(model=MINILM, input="hi", encoding_format="float")
    assert_same_vectors(vectors(ok)[0], own(["hi"])[0])
    narrow = sdk(srv, "sk-narrow")
    with pytest.raises(openai.PermissionDeniedError) as e:
        narrow.embeddings.create(model=MINILM, input="hi")
    assert e.value.body["code"] == "model_not_allowed"
    assert narrow.embeddings.create(model="stub-embed", input="hi").data
    assert [m.id for m in narrow.models.list().data] == ["stub-embed"]
    rpm = sdk(srv, "sk-rpm")
    rpm.embeddings.create(model=MINILM, input="hi")
    with pytest.raises(openai.RateLimitError) as e:
        rpm.embeddings.create(model=MINILM, input="hi")
    assert e.value.body["code"] == "rate_limit_exceeded" and int(e.value.response.headers["retry-after"]) >= 1
    budget = sdk(srv, "sk-budget")
    with pytest.raises(openai.RateLimitError) as e:       # may be more than 5 tokens: refused before it runs
        budget.embeddings.create(model=MINILM, input="a longer text than five tokens")
    assert "budget" in e.value.body["message"].lower()
    budget.embeddings.create(model=MINILM, input="hi")    # at most 4 tokens (its bytes + 2): admitted, spends 3
    with pytest.raises(openai.RateLimitError) as e:
        budget.embeddings.create(model=MINILM, input="hi")
    assert "budget" in e.value.body["message"].lower()
