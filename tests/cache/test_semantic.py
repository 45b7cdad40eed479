"""SemanticCache with the real MiniLM embedder and the shipped verifier."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tokenomy.cache.entry import CacheEntry
from tokenomy.cache.key import context_key
from tokenomy.cache.semantic import SemanticCache
from tokenomy.cache.store import RedisStore
from tokenomy.embedding.embedder import default_embedder

SYSTEM = {"role": "system", "content": "You answer questions about cooking."}
PARAMS = {"temperature": 0}


def ask(text: str, system: dict = SYSTEM) -> list[dict]:
    return [system, {"role": "user", "content": text}]


def entry(answer: str) -> CacheEntry:
    return CacheEntry(response={"answer": answer}, prompt_tokens=40, completion_tokens=60, cost_usd=0.01)


@pytest.fixture(scope="module")
def embedder():
    return default_embedder()


def make(tmp_path: Path | None, embedder, **kw) -> SemanticCache:
    return SemanticCache(tmp_path, embedder=embedder, **kw)


def test_paraphrase_hits_hard_negative_does_not(embedder) -> None:
    cache = make(None, embedder, threshold=0.8, error_budget=0.2)
    cache.add("t1", "small", ask("What is the capital of France?"), PARAMS, entry("Paris"))
    cache.add("t1", "small", ask("How do I lose weight without exercise?"), PARAMS, entry("diet"))
    hit = cache.lookup("t1", "small", ask("What's the capital of France?"), PARAMS)
    assert hit is not None and hit.kind == "semantic" and hit.entry.response == {"answer": "Paris"}
    assert hit.saved_tokens == 100 and hit.saved_usd == 0.01 and hit.similarity >= 0.8
    # Close in embedding space (same words but one), opposite meaning: the verifier must refuse it.
    ctx = context_key("t1", "small", ask("x"), PARAMS)
    d = cache.decide(ctx, "How do I gain weight without exercise?")
    assert d.hit is None and d.similarity >= 0.8 and d.reason == "rejected"


def test_a_budget_the_calibration_cannot_certify_serves_only_identical_questions(embedder) -> None:
    # On QQP no verifier score region is certified under 5% wrong, so a 2% route serves no paraphrase at all;
    # an identical question (case and spacing aside) is still served: it needs no verification.
    cache = make(None, embedder, threshold=0.8, error_budget=0.02)
    assert cache.verifier is not None and cache.verifier.operating_point(0.02, 0.8) > 1
    cache.add("t1", "small", ask("What is the capital of France?"), PARAMS, entry("Paris"))
    assert cache.lookup("t1", "small", ask("What's the capital of France?"), PARAMS) is None
    hit = cache.lookup("t1", "small", ask("what is the  capital of France?"), PARAMS)
    assert hit is not None and hit.score == 1.0
    hit = cache.lookup("t1", "small", ask("What is the capital of France"), PARAMS)  # no question mark
    assert hit is not None and hit.score == 1.0


def test_threshold_only_baseline_serves_the_hard_negative(embedder) -> None:
    # The same pair with no verifier (error_budget=None): a plain threshold serves the wrong answer.
    cache = make(None, embedder, threshold=0.8, error_budget=None, verifier=None)
    cache.add("t1", "small", ask("How do I lose weight without exercise?"), PARAMS, entry("diet"))
    assert cache.lookup("t1", "small", ask("How do I gain weight without exercise?"), PARAMS) is not None


def test_ambiguous_candidates_are_a_miss(embedder) -> None:
    # Two stored near-duplicates (GPTCache's paraphrase set is full of them): the query is about equally close
    # to both, so which answer it gets is a coin toss. The margin gate refuses; with the gate off it serves.
    stored = ["Datasets supports audio, vision, text, and tabular data.",
              "Datasets can load audio, vision, text, and tabular data."]
    query = "Datasets are able to handle audio, visual, textual, and tabular information."
    ctx = context_key("t1", "small", ask("x"), PARAMS)
    gated = make(None, embedder, threshold=0.7, error_budget=None, verifier=None, min_margin=0.05)
    open_ = make(None, embedder, threshold=0.7, error_budget=None, verifier=None, min_margin=0.0)
    for cache in (gated, open_):
        for i, text in enumerate(stored):
            cache.add("t1", "small", ask(text), PARAMS, entry(str(i)))
    d = gated.decide(ctx, query)
    assert d.second_similarity is not None and d.similarity - d.second_similarity < 0.05
    assert d.hit is None and d.reason == "ambiguous"
    assert open_.decide(ctx, query).hit is not None
    # A clear winner still hits through the gate.
    clear = gated.decide(ctx, "Datasets supports audio, vision, text and tabular data")
    assert clear.hit is not None
    with pytest.raises(ValueError):
        make(None, embedder, min_margin=1.5)


def test_a_hit_never_crosses_tenants_or_contexts(embedder) -> None:
    # Even with no verifier and a very low threshold, other tenants and contexts never see the entry.
    cache = make(None, embedder, threshold=0.1, error_budget=None, verifier=None)
    cache.add("alice", "small", ask("How long do I boil an egg?"), PARAMS, entry("alice: 9 minutes"))
    assert cache.lookup("bob", "small", ask("How long do I boil an egg?"), PARAMS) is None
    assert cache.lookup("alice", "large", ask("How long do I boil an egg?"), PARAMS) is None
    other_system = {"role": "system", "content": "You answer questions about chemistry."}
    assert cache.lookup("alice", "small", ask("How long do I boil an egg?", other_system), PARAMS) is None
    earlier = [SYSTEM, {"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"},
               {"role": "user", "content": "How long do I boil an egg?"}]
    assert cache.lookup("alice", "small", earlier, PARAMS) is None
    assert cache.lookup("alice", "small", ask("How long do I boil an egg?"), {"response_format":
                                                                              {"type": "json_object"}}) is None
    hit = cache.lookup("alice", "small", ask("how long do i boil an egg?"), {"temperature": 0.3})
    assert hit is not None and hit.entry.response["answer"] == "alice: 9 minutes"


def test_ttl_expiry_and_lru_bound(embedder) -> None:
    now = [0.0]
    cache = make(None, embedder, threshold=0.5, error_budget=None, verifier=None, ttl_s=10, max_entries=2,
                 clock=lambda: now[0])
    questions = ["How do I make bread?", "How do I fry rice?", "How do I roast a chicken?"]
    for q in questions:
        cache.add("t", "small", ask(q), PARAMS, entry(q))
    assert len(cache) == 2
    ctx = context_key("t", "small", ask("x"), PARAMS)
    assert cache.decide(ctx, questions[0]).candidate_text != questions[0]  # evicted: least recently used
    assert cache.lookup("t", "small", ask(questions[2]), PARAMS) is not None
    now[0] = 11
    assert cache.lookup("t", "small", ask(questions[2]), PARAMS) is None
    assert len(cache) < 2  # the expired candidate was dropped when found


def test_persists_across_reopen_and_rebuilds_a_lost_index(tmp_path: Path, embedder) -> None:
    cache = make(tmp_path, embedder, threshold=0.8, error_budget=None, verifier=None)
    cache.add("t", "small", ask("What temperature should I bake cookies at?"), PARAMS, entry("180C"))
    cache.close()
    again = make(tmp_path, embedder, threshold=0.8, error_budget=None, verifier=None)
    hit = again.lookup("t", "small", ask("At what temperature should cookies be baked?"), PARAMS)
    assert hit is not None and hit.entry.response == {"answer": "180C"}
    again.add("t", "small", ask("How much salt goes in pasta water?"), PARAMS, entry("1%"))
    again._db.close()  # a crash: no flush, the index file misses the new entry
    for f in (tmp_path / "index").glob("*.usearch"):
        f.unlink()
    third = make(tmp_path, embedder, threshold=0.8, error_budget=None, verifier=None)
    assert len(third) == 2
    assert third.lookup("t", "small", ask("How much salt should go in pasta water?"), PARAMS) is not None


def test_feedback_raises_the_entry_bar_then_retires_it(embedder) -> None:
    cache = make(None, embedder, threshold=0.8, error_budget=0.2)
    cache.add("t", "small", ask("What is the capital of France?"), PARAMS, entry("Paris"))
    hit = cache.lookup("t", "small", ask("What's the capital of France?"), PARAMS)
    assert hit is not None and hit.entry_id is not None
    cache.feedback(hit.entry_id, hit.score, correct=False)
    ctx = context_key("t", "small", ask("x"), PARAMS)
    assert cache.decide(ctx, "What's the capital of France?").reason == "entry-bar"
    cache.feedback(hit.entry_id, 0.999, correct=False)
    cache.feedback(hit.entry_id, 0.999, correct=False)
    assert len(cache) == 0  # three wrong hits, none right: retired


def test_redis_payloads_and_a_dead_redis(redis_url: str, namespace: str, embedder) -> None:
    store = RedisStore(redis_url, namespace)
    cache = make(None, embedder, threshold=0.8, error_budget=None, verifier=None, store=store)
    try:
        cache.add("t", "small", ask("How do I sharpen a knife?"), PARAMS, entry("whetstone"))
        assert cache.lookup("t", "small", ask("How do I sharpen a knife?"), PARAMS) is not None
    finally:
        store.clear()
    dead = make(None, embedder, threshold=0.8, error_budget=None, verifier=None,
                store=RedisStore("redis://127.0.0.1:1/0", namespace, timeout_s=0.2))
    dead.add("t", "small", ask("How do I sharpen a knife?"), PARAMS, entry("whetstone"))
    d = dead.decide(context_key("t", "small", ask("x"), PARAMS), "How do I sharpen a knife?")
    assert d.hit is None and d.reason == "payload-missing" and dead.errors >= 1


def test_replicas_sharing_redis_find_each_others_entries(redis_url: str, namespace: str, embedder,
                                                         tmp_path: Path) -> None:
    # Two gateway replicas: separate processes in production (own SQLite files and ANN indexes), one Redis.
    def replica(name: str) -> SemanticCache:
        return make(tmp_path / name, embedder, threshold=0.8, error_budget=None, verifier=None,
                    store=RedisStore(redis_url, namespace))

    a, b = replica("a"), replica("b")
    q = ask("How do I sharpen a kitchen knife?")
    try:
        a.add("t", "small", q, PARAMS, entry("whetstone"))
        hit = b.lookup("t", "small", ask("How can I sharpen a kitchen knife?"), PARAMS)
        assert hit is not None and hit.entry.response == {"answer": "whetstone"}  # found in b's own index
        assert b.lookup("u", "small", q, PARAMS) is None  # still never across tenants
        # A replica started later replays the log, and keeps what it learnt across its own restart.
        c = replica("c")
        assert c.lookup("t", "small", q, PARAMS) is not None
        c.close()
        assert replica("c").lookup("t", "small", q, PARAMS) is not None
        # An explicit delete on one replica reaches the others.
        a.delete(hit.entry_id)
        assert b.lookup("t", "small", q, PARAMS) is None and len(b) == 0
    finally:
        RedisStore(redis_url, namespace).clear()
    # With Redis gone, lookups are misses and adds stay local: nothing raises.
    dead = make(None, embedder, threshold=0.8, error_budget=None, verifier=None,
                store=RedisStore("redis://127.0.0.1:1/0", namespace, timeout_s=0.2))
    dead.add("t", "small", q, PARAMS, entry("whetstone"))
    assert dead.lookup("t", "small", q, PARAMS) is None and dead.errors >= 1


def test_bad_input(embedder) -> None:
    with pytest.raises(ValueError, match="error budget needs a verifier"):
        SemanticCache(None, embedder=embedder, error_budget=0.02, verifier=None)
    with pytest.raises(ValueError, match="threshold"):
        SemanticCache(None, embedder=embedder, threshold=1.5, error_budget=None, verifier=None)
    cache = make(None, embedder, error_budget=None, verifier=None)
    with pytest.raises(ValueError, match="dimension"):
        cache.add_text("ctx", "q", entry("a"), vector=np.ones(10))
    with pytest.raises(ValueError, match="non-empty"):
        cache.add_text("ctx", "  ", entry("a"))
    with pytest.raises(TypeError, match="CacheEntry"):
        cache.add_many("ctx", ["q"], [{"answer": "a"}])  # type: ignore[list-item]
    assert cache.add("t", "small", [{"role": "assistant", "content": "x"}], PARAMS, entry("a")) is None
    # A budget with no verifier to check it (set after construction) rejects rather than serves unverified.
    cache.add("t", "small", ask("How do I make bread?"), PARAMS, entry("knead"))
    cache.error_budget = 0.2
    d = cache.decide(context_key("t", "small", ask("x"), PARAMS), "How do you make bread?")
    assert d.hit is None and d.reason == "rejected"


def test_a_request_memo_embeds_each_text_once_and_a_cache_with_its_own_embedder_keeps_out(embedder, monkeypatch):
    cache = SemanticCache(None, threshold=0.8, error_budget=0.2)    # the shared default MiniLM
    calls: list[list[str]] = []
    real = cache._embed
    monkeypatch.setattr(cache, "_embed", lambda texts: calls.append(list(texts)) or real(texts))
    egg, egg2 = "How long do I boil an egg?", "How long should I boil an egg?"
    memo: dict = {}
    assert cache.lookup("t1", "small", ask(egg), PARAMS, memo=memo) is None and calls == []  # empty: no embedding
    cache.add("t1", "small", ask(egg), PARAMS, entry("8 minutes"), memo=memo)
    assert calls == [[egg]] and list(memo) == [egg]
    memo2: dict = {}
    cache.lookup("t1", "small", ask(egg2), PARAMS, memo=memo2)
    cache.add("t1", "small", ask(egg2), PARAMS, entry("8 minutes"), memo=memo2)
    assert calls == [[egg], [egg2]]                                    # the add reused the lookup's vector
    # What the memo holds is what the lookup searches with: egg's vector planted under another text finds egg.
    ctx = context_key("t1", "small", ask("x"), PARAMS)
    planted = cache.decide(ctx, "Is Paris in France?", memo={"Is Paris in France?": memo[egg]})
    assert planted.candidate_text == egg and planted.similarity > 0.999 and len(calls) == 2
    # A cache with its own embedder neither reads nor fills the memo (its vectors may differ).
    own = make(None, embedder, threshold=0.8, error_budget=0.2)
    memo3: dict = {}
    own.add("t1", "small", ask(egg), PARAMS, entry("8 minutes"), memo=memo3)
    assert memo3 == {}
    d = own.decide(ctx, "Is Paris in France?", memo={"Is Paris in France?": memo[egg]})
    assert d.similarity < 0.8
