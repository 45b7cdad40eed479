"""Speculative decoding: prompt-lookup drafts, their sizing by measured step cost, exact verification."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from tests.engine.test_engine import run
from tests.helpers.noise import assert_same_up_to_noise
from tokenomy.engine import tuning
from tokenomy.engine.config import EngineConfig
from tokenomy.engine.engine import Engine
from tokenomy.engine.sampler import Sampler
from tokenomy.engine.sampling_params import SamplingParams
from tokenomy.engine.sequence import Sequence
from tokenomy.engine.spec import cost, prediction, speculate
from tokenomy.models.catalog import resolve_gguf

pytestmark = pytest.mark.slow       # a real engine, client or process (docs/testing.md)


def test_propose_continues_the_latest_earlier_occurrence_of_the_longest_suffix():
    toks = [1, 2, 3, 4, 5, 9, 2, 3, 4, 7, 8, 2, 3, 4]
    assert speculate.propose(toks, 2) == [7, 8]          # the latest "2 3 4" was followed by 7 8
    assert speculate.propose(toks, 10) == [7, 8, 2, 3, 4]
    assert speculate.propose([5, 6, 7], 3) == []          # nothing repeats
    assert speculate.propose(toks, 0) == []
    assert speculate.propose([1, 2, 9, 1, 2], 1, ngram_max=2) == [9]


def test_a_prediction_drafts_from_where_the_answer_stands_in_it_and_realigns_after_a_divergence():
    p = prediction.Prediction([10, 11, 12, 13, 14, 15, 16, 17])
    assert p.propose([], 3) == [10, 11, 12]                 # before the first token: its start
    assert p.propose([10, 11], 3) == [12, 13, 14]
    followed = p.agreement
    assert followed > tuning.PRIOR_ACCEPTANCE
    assert p.propose([10, 11, 99], 3) == [] and p.cursor is None     # the answer left it
    assert p.agreement < followed
    assert p.propose([10, 11, 99, 14], 3) == [15, 16, 17]  # ... and rejoined it
    assert p.propose([10, 11, 99, 14, 15, 16, 17], 3) == []          # past its end
    q = prediction.Prediction([1, 2, 3, 1, 2, 4])
    assert q.propose([7, 1, 2], 2) == [3, 1]                # the first occurrence ahead of where it stood
    wrong = prediction.Prediction([50, 51, 52, 53] * 4)
    wrong.propose(list(range(100, 112)), 4)
    assert wrong.agreement < 0.01                           # every token missed: its drafts are priced as worthless


def test_step_cost_interpolates_and_extrapolates_what_it_measured():
    c = cost.StepCost()
    assert c.predict(4) is None
    c.observe(1, 0.010)
    assert c.predict(4) is None                          # one point says nothing about the slope
    c.observe(9, 0.050)
    assert c.predict(5) == pytest.approx(0.030)
    assert c.predict(17) == pytest.approx(0.090)
    c.observe(1, 0.020)                                  # decaying average, not the last sample
    assert 0.010 < c.predict(1) < 0.020


def _cost(per_token: float, fixed: float) -> cost.StepCost:
    c = cost.StepCost()
    for n in (1, 64):
        c.observe(n, fixed + per_token * n)
    return c


def test_plan_drafts_where_verifying_is_cheap_and_not_where_it_costs_a_step_per_token():
    cheap = _cost(per_token=0.0001, fixed=0.010)          # memory-bound: extra tokens nearly free
    dear = _cost(per_token=0.010, fixed=0.0)              # compute-bound: k tokens cost k steps
    assert cost.plan(1, 1, [(0.8, 8)], cheap, 100) == [8]
    assert cost.plan(1, 1, [(0.8, 8)], dear, 100) == [0]
    assert cost.plan(1, 1, [(0.05, 8)], _cost(0.002, 0.010), 100) == [0]   # rarely accepted: not worth it
    assert cost.plan(1, 1, [(0.8, 8)], cheap, 3) == [3]                    # the step's token budget holds
    assert cost.plan(1, 1, [(0.8, 8)], cost.StepCost(), 100) == [0]  # unmeasured: no drafts
    # the same sequence in a fuller batch is worth fewer drafts: the step's extra cost hits every sequence
    mid = _cost(per_token=0.001, fixed=0.010)
    alone = cost.plan(1, 1, [(0.6, 8)], mid, 100)[0]
    crowded = cost.plan(32, 32, [(0.6, 8)], mid, 100)[0]
    assert alone > crowded


def test_with_kv_streams_a_sequences_drafts_beside_others_cost_a_ubatch_of_their_own():
    """llama.cpp's equal split feeds a step's first token per sequence in one ubatch and a sequence's further
    tokens in another, which reads all the weights again. Priced as one step of all the tokens, drafts looked
    free at concurrency 8 and made steps 95-117 ms instead of 60 on the grounded bench."""
    weights = _cost(per_token=0.001, fixed=0.010)           # most of a step is reading the weights
    eight = [1] * 7                                         # seven other sequences decoding beside the candidate
    assert cost.plan(8, 8, [(0.6, 8)], weights, 100)[0] > 0                 # one step of 8 + k tokens
    assert cost.plan(8, 8, [(0.6, 8)], weights, 100, apart=eight) == [0]   # 8 tokens, then k more
    assert cost.plan(1, 1, [(0.6, 8)], weights, 100, apart=[]) == cost.plan(1, 1, [(0.6, 8)], weights,
                                                                                      100)   # alone: one ubatch
    # a second ubatch is dear whatever it feeds, so one draft token never pays alone, but eight well-accepted
    # ones do: the plan takes them together
    flat = _cost(per_token=0.00001, fixed=0.010)
    assert cost.plan(4, 4, [(0.95, 8)], flat, 100, apart=[1, 1, 1]) == [8]
    assert cost.plan(4, 4, [(0.5, 8)], flat, 100, apart=[1, 1, 1]) == [0]


def test_a_step_drafts_only_for_sequences_that_decode_one_token_and_may_speculate():
    """Speculator.drafts, without an engine: a decoding sequence whose tokens repeat gets the prompt-lookup draft,
    cut to what its max_tokens and the window leave; one still prefilling, a constrained one, and one that asked
    for no speculation (a seeded sample) get none."""
    def decoding(prompt, max_tokens=64, **params):
        q = Sequence(prompt=list(prompt), params=SamplingParams(max_tokens=max_tokens, **params),
                     on_event=lambda e: None)
        q.output.append(prompt[-4])                # one sampled token, not yet fed: it decodes next
        q.n_kv, q.spec_acceptance = len(prompt), 0.95
        return q

    loop = [5, 6, 7, 8] * 6
    cheap = _cost(per_token=0.0001, fixed=0.010)
    spec = speculate.Speculator(EngineConfig(kv_unified=True), max_model_len=4096)
    free, short, seeded, constrained = decoding(loop), decoding(loop, max_tokens=3), decoding(
        loop, temperature=1.0, seed=1), decoding(loop)
    constrained.constraint = object()
    prefilling = Sequence(prompt=list(loop), params=SamplingParams(), on_event=lambda e: None)
    plan = [(free, 1), (short, 1), (seeded, 1), (constrained, 1), (prefilling, 8)]
    drafts = spec.drafts(plan, 10_000, cheap)
    assert drafts[free] == speculate.propose(free.tokens, 8) == [6, 7, 8, 5]   # all the lookup found
    assert drafts[short] == drafts[free][:1]       # max_tokens 3, one already out: one more to draft at most
    assert set(drafts) == {free, short}
    assert speculate.Speculator(EngineConfig(speculative=False), 4096).drafts(plan, 10_000, cheap) == {}
    tight = speculate.Speculator(EngineConfig(kv_unified=True), max_model_len=len(loop) + 4)
    assert len(tight.drafts([(free, 1)], 10_000, cheap)[free]) == 2      # the window leaves room for two
    # a sequence with a predicted output drafts from the prediction, never by prompt lookup
    predicted, lost = decoding(loop), decoding(loop)
    predicted.prediction = prediction.Prediction([predicted.output[0], 40, 41, 42])
    lost.prediction = prediction.Prediction([40, 41, 42])
    for q in (predicted, lost):
        q.prediction.agreement = 0.95
    drafts = spec.drafts([(predicted, 1), (lost, 1)], 10_000, cheap)
    assert drafts == {predicted: [40, 41, 42]}


def test_a_draft_keeps_the_sampled_distribution():
    logits = np.log(np.array([0.5, 0.3, 0.15, 0.05], dtype=np.float32))
    p = SamplingParams(temperature=1.0, seed=7)
    for draft in (0, 3, None):
        s = Sampler(p, [])
        draws = np.bincount([s.sample(logits, draft=draft) for _ in range(20000)], minlength=4) / 20000
        assert np.abs(draws - [0.5, 0.3, 0.15, 0.05]).max() < 0.015, (draft, draws)


def test_greedy_verification_accepts_exactly_the_argmax():
    logits = np.array([0.0, 3.0, 1.0], dtype=np.float32)
    s = Sampler(SamplingParams(temperature=0), [])
    assert s.sample(logits, draft=1) == 1 and s.sample(logits, draft=2) == 1


@pytest.fixture(scope="module")
def path() -> str:
    return str(resolve_gguf("smollm2-135m-instruct"))


# A prompt whose answer copies it: prompt lookup finds drafts, and most are accepted.
COPY = ["Repeat exactly: the quick brown fox jumps over the lazy dog, the quick brown fox jumps over the lazy dog."]


@pytest.mark.parametrize("kv_unified", [True, False], ids=["unified", "streams"])
def test_greedy_answers_with_speculation_equal_those_without(path, kv_unified):
    """With KV streams a sequence's drafts cost a ubatch of their own beside others (cost.plan), which a
    step cost of 10 ms a ubatch never pays for: there the copying prompt runs alone, in one ubatch."""
    cfg = dict(n_ctx=4096, max_running=4, max_retired=0, max_batch_tokens=256, prefix_caching=False,
               kv_unified=kv_unified)
    prompts = COPY + ["Name a fruit."] if kv_unified else COPY
    plain = Engine(path, EngineConfig(**cfg, speculative=False)).start()
    spec = Engine(path, EngineConfig(**cfg, speculative=True)).start()
    try:
        spec.step_cost = _cost(per_token=0.00001, fixed=0.01)   # make drafting pay, whatever this CPU measures
        spec.step_cost.observe = lambda n, dt: None
        want = run(plain, prompts, max_tokens=32)
        got = run(spec, prompts, max_tokens=32)
        for g, w in zip(got, want, strict=True):
            assert_same_up_to_noise(g, w)
            assert len(g) == len(w)
        st = spec.stats
        assert st.spec_drafts > 0 and 0 < st.spec_accepted_tokens <= st.spec_draft_tokens
        assert st.spec_accepted_tokens >= st.spec_draft_tokens // 4       # a quarter of drafted tokens, at least
        assert plain.stats.spec_drafts == 0
    finally:
        plain.stop()
        spec.stop()


def test_a_request_can_opt_out_and_seeded_sampling_is_never_speculated(path):
    assert not SamplingParams(temperature=0.7, seed=1).may_speculate
    assert SamplingParams(temperature=0.7).may_speculate and SamplingParams(temperature=0).may_speculate
    assert not SamplingParams(temperature=0, speculative=False).may_speculate


def _predicted(engine: Engine, ids: list[int], prediction: list[int] | None) -> tuple[list[tuple], object]:
    """A greedy answer of 24 tokens as (token, logprob, margin) per step, and its final event."""
    steps, final, done = [], [], threading.Event()

    def on(ev):
        steps.extend((e.token, e.logprob, e.top[0][1] - e.top[1][1]) for e in ev.logprobs)
        if ev.finish_reason:
            final.append(ev)
            done.set()

    engine.submit(ids, SamplingParams(max_tokens=24, temperature=0, logprobs=True, top_logprobs=2,
                                      ignore_eos=True, prediction=prediction), on)
    assert done.wait(120)
    return steps, final[0]


def test_a_predicted_output_is_drafted_from_and_never_changes_a_greedy_answer(path):
    """Its own earlier answer as the prediction: drafted from once the answer has followed it a few tokens, and
    mostly accepted; an unrelated text: drafted from hardly at all (its agreement falls at once), under step costs
    like this CPU's (verifying 8 tokens costs 5.6 steps of one). Either way the answer is the one without a
    prediction (up to the kernel noise of verifying several tokens in one step)."""
    engine = Engine(path, EngineConfig(n_ctx=4096, max_running=2, max_retired=2, max_batch_tokens=256)).start()
    try:
        engine.step_cost = _cost(per_token=0.0058, fixed=0.0042)
        engine.step_cost.observe = lambda n, dt: None
        ids = engine.tokenizer.encode_chat([{"role": "user", "content": "Write a short poem about the sea."}])
        plain, none = _predicted(engine, ids, None)
        right, hit = _predicted(engine, ids, [t for t, _, _ in plain])
        unrelated = engine.tokenizer.encode(" ".join(COPY) * 2, add_special=False)
        wrong, miss = _predicted(engine, ids, unrelated)
        for got in (right, wrong):
            assert len(got) == len(plain)
            assert_same_up_to_noise(got, plain)
        assert none.draft_tokens == 0                       # prompt lookup found nothing worth it here
        assert hit.draft_accepted >= len(plain) // 2 and hit.draft_accepted >= 0.9 * hit.draft_tokens
        assert miss.draft_tokens <= 2
    finally:
        engine.stop()
