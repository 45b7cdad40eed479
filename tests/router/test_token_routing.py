"""Token-level routing's pieces that need no model: segment cuts, signals, the tally, config. (Stop strings across
the models' pieces: tests/engine/test_stops.py.)"""

from __future__ import annotations

import numpy as np
import pytest
from pydantic import ValidationError

from tokenomy.config import Config
from tokenomy.engine.sampler import confidence
from tokenomy.engine.sampling_params import SamplingParams
from tokenomy.generation import Usage
from tokenomy.router.token_routing import Tally, cut_segment


def test_word_segments_end_where_the_next_word_starts():
    assert cut_segment(" Paris is", "word") == " Paris"
    assert cut_segment(" Paris, the", "word") == " Paris,"
    assert cut_segment("\n\nThe end", "word") == "\n\nThe"
    assert cut_segment(" extraordin", "word") == " extraordin"      # no boundary seen: all of it
    assert cut_segment(" Paris is", "token") == " Paris is"
    assert cut_segment("", "word") == ""


def test_confidence_signals_are_lower_when_less_sure():
    sure = np.array([10.0, 0.0, 0.0, 0.0], dtype=np.float32)
    unsure = np.array([1.0, 0.9, 0.8, 0.7], dtype=np.float32)
    for signal in ("top1", "margin", "entropy"):
        assert confidence(sure, signal) > confidence(unsure, signal), signal
    p = np.exp(sure - sure.max())
    p /= p.sum()
    assert confidence(sure, "top1") == pytest.approx(p.max(), rel=1e-5)
    assert confidence(sure, "margin") == pytest.approx(p[0] - p[1], rel=1e-5)
    assert confidence(np.zeros(4, dtype=np.float32), "entropy") == pytest.approx(-np.log(4), rel=1e-5)


def test_sampling_params_refuse_an_unknown_signal_and_a_threshold_without_one():
    with pytest.raises(ValueError, match="signal"):
        SamplingParams(signal="vibes")
    with pytest.raises(ValueError, match="needs a signal"):
        SamplingParams(handover_below=0.5)
    assert not SamplingParams(signal="top1", handover_below=0.5, temperature=0.0).may_speculate


def test_tally_sums_usage_per_model_and_the_large_share():
    t = Tally(small_tokens=6, large_tokens=2)
    t.add("s", Usage(prompt_tokens=10, cached_tokens=8, completion_tokens=3))
    t.add("s", Usage(prompt_tokens=14, cached_tokens=20, completion_tokens=3))   # cached clipped to prompt
    t.add("l", None)
    assert t.usage["s"].prompt_tokens == 24 and t.usage["s"].cached_tokens == 22
    assert "l" not in t.usage and t.large_share == 0.25


def _config(**route):
    return {"models": [{"name": "small", "gguf": "smollm2-135m-instruct"},
                       {"name": "big", "gguf": "gemma3-270m"},
                       {"name": "up", "backend": "openai", "base_url": "http://127.0.0.1:1/v1", "model": "x"}],
            "routes": {"r": route}}


def test_config_token_routes_take_two_models_and_an_embedded_small_one():
    cfg = Config.model_validate(_config(strategy="token", models=["small", "up"], token={"threshold": 0.2}))
    assert cfg.routes["r"].token.threshold == 0.2
    assert cfg.routes["r"].token.segment == "word"
    for bad, match in ((dict(strategy="token", models=["small", "big", "up"]), "two models"),
                       (dict(strategy=["token", "cascade"], models=["small", "big"]), "stands alone"),
                       (dict(strategy="token", models=["up", "small"]), "embedded small model"),
                       (dict(strategy="token", models=["small", "big"], token={"signal": "vibes"}), "signal")):
        with pytest.raises(ValidationError, match=match):
            Config.model_validate(_config(**bad))
