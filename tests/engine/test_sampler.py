"""The sampler on hand-made logits: each setting's effect on which tokens can be drawn, and seeds."""

from __future__ import annotations

import numpy as np
import pytest

from tokenomy.engine.sampler import Sampler, chosen_logprob, log_softmax, token_logprobs
from tokenomy.engine.sampling_params import SamplingParams

LOGITS = np.array([4.0, 3.0, 2.0, 1.0, 0.0, -1.0], dtype=np.float32)


def draws(params: SamplingParams, logits: np.ndarray = LOGITS, n: int = 400, prompt: list[int] | None = None) -> set:
    s = Sampler(params, prompt or [])
    return {s.sample(logits) for _ in range(n)}


def test_greedy_takes_the_top_token_and_temperature_zero_is_greedy():
    assert draws(SamplingParams(temperature=0.0), n=5) == {0}
    assert SamplingParams(temperature=1e-6).greedy


def test_top_k_keeps_only_the_k_best():
    assert draws(SamplingParams(temperature=2.0, top_k=2)) == {0, 1}
    assert draws(SamplingParams(temperature=2.0, top_k=1)) == {0}


def test_top_p_keeps_the_smallest_set_reaching_p():
    p = np.exp(log_softmax(LOGITS))          # 0.64, 0.24, 0.09, ...
    assert p[0] < 0.7 < p[0] + p[1]
    assert draws(SamplingParams(top_p=0.7)) == {0, 1}
    assert draws(SamplingParams(top_p=0.5)) == {0}


def test_min_p_drops_tokens_below_a_share_of_the_best():
    # relative probabilities e^-k: token 2 has 0.135 of the best, token 3 0.05
    assert draws(SamplingParams(min_p=0.1)) == {0, 1, 2}
    assert draws(SamplingParams(min_p=0.5)) == {0}


def test_logit_bias_can_force_and_ban_tokens():
    assert draws(SamplingParams(temperature=0, logit_bias={5: 100.0}), n=3) == {5}
    assert 0 not in draws(SamplingParams(logit_bias={0: -100.0}))


def test_repetition_penalty_covers_prompt_and_output():
    s = Sampler(SamplingParams(temperature=0, repetition_penalty=4.0), prompt=[0])
    assert s.sample(LOGITS) == 1             # 4.0 / 4 = 1.0 < 3.0
    s.accept(1)
    assert s.sample(LOGITS) == 2             # 3.0 / 4 = 0.75 < 2.0


def test_presence_and_frequency_penalties_grow_with_counts():
    s = Sampler(SamplingParams(temperature=0, frequency_penalty=0.6), prompt=[])
    s.accept(0)
    assert s.sample(LOGITS) == 0             # 4.0 - 0.6 = 3.4 > 3.0
    s.accept(0)
    assert s.sample(LOGITS) == 1             # 4.0 - 1.2 = 2.8 < 3.0
    p = Sampler(SamplingParams(temperature=0, presence_penalty=1.5), prompt=[])
    p.accept(0)
    assert p.sample(LOGITS) == 1             # presence counts once: 2.5 < 3.0


def test_mask_removes_tokens_before_anything_else():
    mask = np.array([False, False, True, True, True, True])
    s = Sampler(SamplingParams(temperature=0), [])
    assert s.sample(LOGITS, mask) == 2


def test_a_seed_repeats_its_draws_and_another_seed_differs():
    flat = np.zeros(64, dtype=np.float32)

    def seq(seed: int | None) -> list[int]:
        s = Sampler(SamplingParams(seed=seed), [])
        return [s.sample(flat) for _ in range(32)]

    assert seq(7) == seq(7)
    assert seq(7) != seq(8)
    assert seq(-3) == seq(-3)                # negative seeds are accepted, as OpenAI does


def test_reported_logprobs_are_of_the_raw_distribution():
    lp, tops = token_logprobs(LOGITS, 2, top=3)
    ref = log_softmax(LOGITS)
    assert lp == pytest.approx(float(ref[2]), abs=1e-6)
    assert [t for t, _ in tops] == [0, 1, 2]
    assert tops[0][1] == pytest.approx(float(ref[0]), abs=1e-6)
    assert chosen_logprob(LOGITS, 2) == pytest.approx(float(ref[2]), abs=1e-5)
    # penalties change what is drawn, not what is reported
    s = Sampler(SamplingParams(temperature=0, logit_bias={5: 100.0}), [])
    assert s.sample(LOGITS) == 5 and chosen_logprob(LOGITS, 5) == pytest.approx(float(ref[5]), abs=1e-5)


@pytest.mark.parametrize("bad", [dict(temperature=3), dict(top_p=0), dict(top_k=-1), dict(min_p=2),
                                 dict(presence_penalty=3), dict(repetition_penalty=0), dict(top_logprobs=21),
                                 dict(max_tokens=0), dict(stop=["a", "b", "c", "d", "e"]), dict(pin_s=-1),
                                 dict(pin_s=3601)])
def test_out_of_range_settings_are_refused(bad):
    with pytest.raises(ValueError):
        SamplingParams(**bad)
