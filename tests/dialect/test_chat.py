"""One mapping from an OpenAI body to the internal request, for the HTTP routes and the batch worker alike."""

from __future__ import annotations

import pytest

from tokenomy.dialect.chat import ChatCompletionRequest, gen_request
from tokenomy.errors import APIError

CHAT = {"model": "m", "messages": [{"role": "developer", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
        "max_completion_tokens": 5, "user": "u1", "stream": True}


def test_a_batch_line_maps_as_the_http_route_does_at_its_own_priority() -> None:
    http = ChatCompletionRequest.model_validate(CHAT).gen_request()
    batch = gen_request("/v1/chat/completions", CHAT, priority="batch")
    assert (http.priority, batch.priority) == ("interactive", "batch")
    assert batch.messages == http.messages == [{"role": "system", "content": "Be brief."},
                                               {"role": "user", "content": "Hi"}]
    assert batch.params == http.params == {"max_tokens": 5} and batch.user == http.user == "u1"


def test_a_completion_body_keeps_the_legacy_default_and_refuses_a_suffix() -> None:
    req = gen_request("/v1/completions", {"model": "m", "prompt": ["Once"]})
    assert (req.kind, req.prompt, req.params) == ("completion", "Once", {"max_tokens": 16})
    with pytest.raises(APIError) as e:
        gen_request("/v1/completions", {"model": "m", "prompt": "Once", "suffix": "end"})
    assert (e.value.status, e.value.param) == (400, "suffix")


def test_a_body_that_does_not_validate_is_a_400_naming_the_field() -> None:
    with pytest.raises(APIError) as missing:
        gen_request("/v1/chat/completions", {"model": "m"})
    assert missing.value.status == 400 and missing.value.param == "messages"
    assert missing.value.message == "Missing required parameter: 'messages'."
    with pytest.raises(APIError) as wrong:
        gen_request("/v1/chat/completions", {**CHAT, "temperature": "hot"})
    assert wrong.value.param == "temperature" and wrong.value.code == "invalid_value"


def test_n_best_of_and_a_prediction_map_to_the_requests_params() -> None:
    chat = gen_request("/v1/chat/completions", {**CHAT, "n": 3, "prediction": {
        "type": "content", "content": [{"type": "text", "text": "Hello "}, {"type": "text", "text": "there."}]}})
    assert chat.params == {"max_tokens": 5, "n": 3, "prediction": {"type": "content", "content": "Hello there."}}
    plain = gen_request("/v1/completions", {"model": "m", "prompt": "Once", "n": 1, "best_of": 1})
    assert plain.params == {"max_tokens": 16}            # one choice: nothing to say
    best = gen_request("/v1/completions", {"model": "m", "prompt": "Once", "n": 2, "best_of": 4})
    assert (best.params["n"], best.params["best_of"]) == (2, 4)
    for bad, param in (({"n": 17}, "n"), ({"n": 2, "best_of": 1}, "best_of"), ({"best_of": 17}, "best_of")):
        with pytest.raises(APIError) as e:
            gen_request("/v1/completions", {"model": "m", "prompt": "Once", **bad})
        assert (e.value.status, e.value.param) == (400, param)
    with pytest.raises(APIError) as e:
        gen_request("/v1/chat/completions", {**CHAT, "prediction": {"type": "content", "content": 7}})
    assert e.value.param.startswith("prediction")
