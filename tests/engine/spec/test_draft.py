"""Speculative decoding with a draft model: vocabulary check, KV kept in step with verification, exact greedy
answers, drafts sized with the draft's own cost."""

from __future__ import annotations

import numpy as np
import pytest

from tests.engine.spec.test_speculate import COPY, _cost
from tests.engine.test_engine import run
from tests.helpers.noise import assert_same_up_to_noise
from tokenomy.engine.config import EngineConfig
from tokenomy.engine.engine import Engine
from tokenomy.engine.runner import Chunk
from tokenomy.engine.spec import cost
from tokenomy.engine.spec.draft import DraftModel, VocabMismatch
from tokenomy.engine.vocab import Vocab
from tokenomy.models.catalog import resolve_gguf

pytestmark = pytest.mark.slow       # a real engine, client or process (docs/testing.md)

CFG = dict(n_ctx=4096, max_running=4, max_retired=0, max_batch_tokens=256, prefix_caching=False)


@pytest.fixture(scope="module")
def path() -> str:
    return str(resolve_gguf("smollm2-135m-instruct"))


def test_a_draft_model_with_another_vocabulary_is_refused(path):
    target = Vocab(path, vocab_only=True)
    try:
        with pytest.raises(VocabMismatch, match="same tokenizer"):
            DraftModel(str(resolve_gguf("gemma3-270m")), EngineConfig(**CFG), target)
    finally:
        target.close()


def test_drafts_follow_the_tokens_after_verification_cut_them(path):
    """The slot keeps only the tokens the sequence still starts with: after a rejection, the next drafts are
    those a fresh draft context gives for the new tokens."""
    target = Vocab(path, vocab_only=True)
    d = DraftModel(path, EngineConfig(**CFG), target)
    fresh = DraftModel(path, EngineConfig(**CFG), target)
    try:
        toks = target.tokenize("The capital of France is Paris. The capital of Italy is")
        first = d.propose([(1, toks, 4)])[1]
        assert len(first) == 4
        assert d._slots[1].fed == toks + first[:3]          # the last draft is chosen, not fed
        # the target accepted one draft and chose another token than the second
        other = next(t for t in range(100, 200) if t != first[1])
        after = toks + [first[0], other]
        got = d.propose([(1, after, 3)])[1]
        assert d._slots[1].fed[:len(after)] == after
        want = fresh.propose([(2, after, 3)])[2]
        if got != want:      # kernel noise between batch shapes: allowed only where the top two nearly tie
            i = next(j for j, (g, w) in enumerate(zip(got, want, strict=True)) if g != w)
            row = fresh.runner.decode([Chunk(3, after + want[:i], 0, 1)])[0]
            top = np.sort(row - np.logaddexp.reduce(row))[-2:]
            assert top[1] - top[0] < 0.6, ("drafts diverged without a near-tie", got, want)
        d.release(1)
        assert 1 not in d._slots and len(d._free) == d.runner.cfg.n_seqs
    finally:
        d.close()
        fresh.close()
        target.close()


def test_a_sequence_takes_an_idle_slot_when_all_are_held(path):
    target = Vocab(path, vocab_only=True)
    d = DraftModel(path, EngineConfig(**{**CFG, "max_running": 2}), target)
    try:
        toks = target.tokenize("One two three")
        d.propose([(1, toks, 1), (2, toks, 1)])
        assert not d._free
        assert d.propose([(3, toks, 1)])[3]                 # 1 and 2 are not drafting now: the older is taken
        assert set(d._slots) == {2, 3}
        assert 4 not in d.propose([(2, toks, 1), (3, toks, 1), (4, toks, 1)])   # both busy: no draft, no error
    finally:
        d.close()
        target.close()


def test_plan_counts_the_time_drafts_take_to_make():
    free_verify = _cost(per_token=0.0, fixed=0.010)
    assert cost.plan(1, 1, [(0.8, 8)], free_verify, 100, lambda k: 0.0005 * k) == [8]     # cheap draft
    assert cost.plan(1, 1, [(0.8, 8)], free_verify, 100, lambda k: 0.010 * k) == [0]      # a step per token
    assert 0 < cost.plan(1, 1, [(0.8, 8)], free_verify, 100, lambda k: 0.002 * k)[0] < 8
    assert cost.plan(1, 1, [(0.8, 8)], free_verify, 100, lambda k: None) == [0]           # not measured
    # a catch-up that costs a step's worth for one sequence keeps it from drafting; the other still drafts
    ks = cost.plan(2, 2, [(0.8, 8), (0.8, 8)], free_verify, 100, lambda k: 0.0005 * k, [0.5, 0.0])
    assert ks[0] == 0 and ks[1] == cost.plan(2, 2, [(0.8, 8)], free_verify, 100, lambda k: 0.0005 * k)[0] > 0


def test_catching_up_costs_what_the_slot_has_not_seen(path):
    target = Vocab(path, vocab_only=True)
    d = DraftModel(path, EngineConfig(**CFG), target)
    try:
        d.calibrate()
        toks = target.tokenize("one two three four five six seven eight nine ten " * 4)
        cold = d.catch_up_seconds(1, toks)
        assert cold > 0
        d.propose([(1, toks, 2)])
        assert d.catch_up_seconds(1, toks) == 0.0                  # seen: only the last token, fed anyway
        # three new tokens, the last fed anyway: two to catch up, priced by the cost model as it stands now (the
        # step just taken measured it again, so a comparison with `cold` would compare two timings)
        assert d.catch_up_seconds(1, toks + [5, 6, 7]) == d.cost.predict(2) > 0
    finally:
        d.close()
        target.close()


def test_greedy_answers_with_a_draft_model_equal_those_without(path):
    plain = Engine(path, EngineConfig(**CFG, speculative=False)).start()
    spec = Engine(path, EngineConfig(**CFG, speculative=True, draft_model=path)).start()
    try:
        spec.step_cost = _cost(per_token=0.00001, fixed=0.01)   # make drafting pay, whatever this CPU measures
        spec.step_cost.observe = lambda n, dt: None
        assert spec.drafter is not None
        spec.drafter.cost = _cost(per_token=0.0, fixed=0.0001)
        spec.drafter.cost.observe = lambda n, dt: None
        prompts = COPY + ["Name a fruit.", "Count to five."]
        want = run(plain, prompts, max_tokens=24)
        got = run(spec, prompts, max_tokens=24)
        for g, w in zip(got, want, strict=True):
            assert_same_up_to_noise(g, w)
            assert len(g) == len(w)
        st = spec.stats
        assert st.spec_drafts > 0
        # the draft is the target itself: nearly every drafted token is what the target picks
        assert st.spec_accepted_tokens >= 0.8 * st.spec_draft_tokens
        assert not spec.drafter._slots                           # finished sequences gave their slots back
    finally:
        plain.stop()
        spec.stop()


def test_an_engine_whose_draft_model_is_not_there_fails_at_start(path, tmp_path):
    with pytest.raises(FileNotFoundError):
        Engine(path, EngineConfig(**CFG, draft_model=str(tmp_path / "missing.gguf")))
