"""The usage object on the wire: OpenAI's shape, plus each model's own tokens and the handovers for an answer several
models wrote (token-level routing). No model runs: the usage is written down."""

from __future__ import annotations

import json

from tokenomy.dialect.chat_wire import usage_body
from tokenomy.generation import Usage

OPENAI_KEYS = {"prompt_tokens", "completion_tokens", "total_tokens", "prompt_tokens_details",
               "completion_tokens_details"}


def test_a_one_model_answer_has_only_openais_keys():
    body = usage_body(Usage(prompt_tokens=40, cached_tokens=32, completion_tokens=7, handovers=None))
    assert set(body) == OPENAI_KEYS
    assert body["total_tokens"] == 47 and body["prompt_tokens_details"] == {"cached_tokens": 32}
    assert set(usage_body(None)) == OPENAI_KEYS and usage_body(None)["total_tokens"] == 0
    # handovers alone (no parts: e.g. the small model finished without the large one writing) add nothing
    assert set(usage_body(Usage(prompt_tokens=1, handovers=0))) == OPENAI_KEYS
    assert body["completion_tokens_details"] == {"reasoning_tokens": 0, "accepted_prediction_tokens": 0,
                                                 "rejected_prediction_tokens": 0}
    predicted = usage_body(Usage(completion_tokens=7, accepted_prediction_tokens=5, rejected_prediction_tokens=3))
    assert predicted["completion_tokens_details"]["accepted_prediction_tokens"] == 5
    assert predicted["completion_tokens_details"]["rejected_prediction_tokens"] == 3


def test_an_answer_several_models_wrote_names_each_models_tokens_and_the_handovers():
    s = Usage(prompt_tokens=40, cached_tokens=32, completion_tokens=30)
    lg = Usage(prompt_tokens=55, cached_tokens=0, completion_tokens=6)
    u = Usage(prompt_tokens=95, cached_tokens=32, completion_tokens=36, parts=[("small", s), ("large", lg)],
              handovers=2)
    body = json.loads(json.dumps(usage_body(u)))              # what a client parses
    assert set(body) == OPENAI_KEYS | {"models", "handovers"}
    assert body["handovers"] == 2
    assert list(body["models"]) == ["small", "large"]          # in the order first used
    assert body["models"]["small"] == {"prompt_tokens": 40, "completion_tokens": 30,
                                       "prompt_tokens_details": {"cached_tokens": 32}}
    assert body["models"]["large"] == {"prompt_tokens": 55, "completion_tokens": 6,
                                       "prompt_tokens_details": {"cached_tokens": 0}}
    for key in ("prompt_tokens", "completion_tokens"):         # the top-level counts are the models' sums
        assert body[key] == sum(m[key] for m in body["models"].values())
    assert body["total_tokens"] == body["prompt_tokens"] + body["completion_tokens"]
    # parts without a handover count still say how many: none
    assert usage_body(Usage(parts=[("small", s)]))["handovers"] == 0
