"""Explore and online error control: the cache stage in process, with the real embedder and shipped verifier."""

from __future__ import annotations

import asyncio
import random

import pytest

from tokenomy.cache.error_control import EVIDENCE, ErrorControl
from tokenomy.cache.judge import same_answer
from tokenomy.cache.semantic import SemanticCache
from tokenomy.embedding.embedder import default_embedder
from tokenomy.generation import GenRequest, Usage
from tokenomy.ledger.row import row_from_context
from tokenomy.pipeline.cache import Cache
from tokenomy.pipeline.request import RequestContext, Result

STORED, PARAPHRASE = "What is the capital of France?", "What's the capital of France?"


@pytest.fixture(scope="module")
def embedder():
    return default_embedder()


def make(embedder, explore: float) -> tuple[SemanticCache, Cache]:
    cache = SemanticCache(None, embedder=embedder, threshold=0.8, error_budget=0.2, explore=explore,
                          rng=random.Random(7))
    return cache, Cache(None, cache, cost=lambda model, usage, batch: 0.0)


def ask(stage: Cache, text: str, answer: str, store: bool = True) -> tuple[RequestContext, bool]:
    """One request through the stage; the model answers ``answer``. Returns the context and whether the model
    was asked."""
    asked = []

    async def model(ctx: RequestContext) -> None:
        asked.append(text)
        ctx.model, ctx.finish_reason = "small", "stop"
        ctx.usage = Usage(prompt_tokens=10, completion_tokens=5)
        ctx.result = Result(text=answer, finish_reason="stop", usage=ctx.usage)

    ctx = RequestContext(gen=GenRequest(model="small", messages=[{"role": "user", "content": text}],
                                        params={"temperature": 0}),
                         headers={} if store else {"cache-control": "no-store"})
    asyncio.run(stage(ctx, model))
    return ctx, bool(asked)


def test_explore_zero_serves_on_the_calibration_as_before(embedder) -> None:
    cache, stage = make(embedder, explore=0.0)
    assert cache.control is None
    assert ask(stage, STORED, "Paris")[0].cache == "miss"
    ctx, asked = ask(stage, PARAPHRASE, "not asked")
    assert ctx.cache == "semantic" and not asked and ctx.result.text == "Paris"


def test_nothing_is_served_before_evidence_and_an_explore_returns_the_fresh_answer(embedder) -> None:
    cache, stage = make(embedder, explore=0.02)
    ask(stage, STORED, "Paris")
    ctx, asked = ask(stage, PARAPHRASE, "Paris, of course", store=False)
    # a would-be hit, but the cache has no evidence yet: the model answers, and the client gets that answer
    assert asked and ctx.cache == "explore" and ctx.result.text == "Paris, of course"
    row = row_from_context(ctx, None)
    assert row.cache == "explore" and row.completion_tokens == 5 and not row.cache_hit
    # the comparison was judged (different words: wrong, for the strict default judge) and raised the entry's bar
    assert cache.control.state()[1] == 0 and ask(stage, PARAPHRASE, "Paris", store=False)[0].cache == "miss"


def test_evidence_lets_it_serve_and_a_wrong_answer_found_by_exploring_stops_the_entry(embedder) -> None:
    cache, stage = make(embedder, explore=0.02)
    ask(stage, STORED, "Paris")
    outcomes = [ask(stage, PARAPHRASE, "Paris", store=False)[0].cache for _ in range(3 * EVIDENCE)]
    first_served = outcomes.index("semantic")
    assert first_served >= EVIDENCE and set(outcomes[:first_served]) == {"explore"}
    # the model now answers differently (the cached answer went stale or was never right for this question):
    # the first explore that sees it stops the entry serving at that score
    for _ in range(200):
        ctx, _ = ask(stage, PARAPHRASE, "Lyon", store=False)
        if ctx.cache == "explore":
            break
        assert ctx.cache == "semantic" and ctx.result.text == "Paris"
    assert ctx.cache == "explore" and ctx.result.text == "Lyon"
    ctx, asked = ask(stage, PARAPHRASE, "Lyon", store=False)
    assert ctx.cache == "miss" and asked
    d = cache.decide(next(iter(cache._meta.values())).ctx, PARAPHRASE)
    assert d.reason == "entry-bar"


def test_wrong_outcomes_raise_the_bar_for_everyone_below_them() -> None:
    control = ErrorControl(0.1, 0.02, window=1000, rng=random.Random(1))
    assert control.serve(0.99) is False                  # no evidence: explore
    for _ in range(40):
        control.observe(0.9, wrong=False)
    tau, n = control.state()
    assert tau <= 0.9 and 38 < n <= 40
    served = sum(control.serve(0.95) for _ in range(1000))
    assert 700 < served < 1000                            # explore rate max(floor, EVIDENCE / n) = 12.5%
    for _ in range(10):
        control.observe(0.93, wrong=True)
    assert control.state()[0] > 0.93 and not control.serve(0.92)


def test_the_default_judge_compares_structured_answers_parsed() -> None:
    assert same_answer("q", {"text": '{"a": 1, "b": [2]}'}, '{"b":[2],"a":1}')
    assert same_answer("q", {"text": " Paris\n"}, "Paris")
    assert not same_answer("q", {"text": "Paris"}, "paris, France")
    call = {"function": {"name": "f", "arguments": '{"x": 1}'}}
    assert same_answer("q", {"text": "", "tool_calls": [call]}, "",
                       [{"function": {"name": "f", "arguments": '{ "x":1 }'}}])
    assert not same_answer("q", {"text": "", "tool_calls": [call]}, "", None)


BELOW = ("How do I learn Python quickly?", "What is the fastest way to learn Python?")  # cos 0.92, under the point


def test_a_candidate_under_the_calibrated_point_is_checked_for_free_and_stays_a_miss(embedder) -> None:
    fixed, fixed_stage = make(embedder, explore=0.0)
    ask(fixed_stage, BELOW[0], "Practice")
    assert fixed.decide(next(iter(fixed._meta.values())).ctx, BELOW[1]).reason == "rejected"
    cache, stage = make(embedder, explore=0.02)
    ask(stage, BELOW[0], "Practice")
    ctx, asked = ask(stage, BELOW[1], "Practice", store=False)
    # the model answers it as the miss it is, the row says miss (no cost over a miss), and the comparison counts
    assert asked and ctx.cache == "miss" and row_from_context(ctx, None).cache == "miss"
    assert len(cache.control._live) == 1


def test_online_control_serves_under_the_calibrated_point_once_checks_there_came_back_right(embedder) -> None:
    cache, stage = make(embedder, explore=0.02)
    ask(stage, BELOW[0], "Practice")
    outcomes = [ask(stage, BELOW[1], "Practice", store=False)[0].cache for _ in range(60)]
    # checked (free) until the live outcomes certify the budget at this score, then mostly served
    first = outcomes.index("semantic")
    assert first >= EVIDENCE and set(outcomes[:first]) <= {"miss", "explore"}
    assert outcomes[first:].count("semantic") > len(outcomes[first:]) // 2   # explore rate EVIDENCE / n, falling
    # once online control would serve it, holding it back is an explore (a cost), no longer a free check
    assert set(outcomes[first:]) <= {"semantic", "explore"}
    # and the traffic turning wrong there stops it again
    for _ in range(200):
        ctx, _ = ask(stage, BELOW[1], "Read books", store=False)
        if ctx.cache != "semantic":
            break
    assert ask(stage, BELOW[1], "Read books", store=False)[0].cache == "miss"
