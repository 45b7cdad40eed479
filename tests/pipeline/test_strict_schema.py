"""A strict json_schema is a promise (pipeline/generate.py): every answer returned validates against the schema, or
the request ends with a 422 schema_unsatisfied that says why; the tokens are billed either way."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import jsonschema
import openai
import pytest

from tests.conftest import NO_CACHE, SMALL_ENGINE, live_server
from tests.helpers.upstream_stub import Stub
from tests.pipeline.test_gateway_upstream import StubServer

pytestmark = pytest.mark.slow       # a real engine, client or process (docs/testing.md)

SCHEMA = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"], "additionalProperties": False}


def fmt(strict: bool = True) -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": "count", "schema": SCHEMA, "strict": strict}}


@contextmanager
def gateway(stub: Stub) -> Iterator[tuple[Any, Stub]]:
    with StubServer(stub) as s:
        cfg = {"cache": NO_CACHE, "models": [{"name": "up", "backend": "openai", "model": "stub",
                                              "base_url": f"http://127.0.0.1:{s.port}/v1",
                                              "tokenizer": "cl100k_base"}]}
        with live_server(cfg) as gw:
            yield gw, s.stub


def ask(gw: Any, strict: bool = True, **extra: Any) -> httpx.Response:
    return httpx.post(gw.base_url + "/chat/completions", timeout=60, json={
        "model": "up", "messages": [{"role": "user", "content": "a number"}], "response_format": fmt(strict),
        "max_tokens": 20, **extra})


def row(gw: Any, r: httpx.Response) -> Any:
    gw.gateway.ledger.flush()
    return gw.gateway.ledger.get(r.headers["x-tokenomy-request-id"])


def test_a_valid_answer_is_returned() -> None:
    with gateway(Stub(texts=['{"n": 3}'])) as (gw, stub):
        r = ask(gw)
        assert r.status_code == 200 and json.loads(r.json()["choices"][0]["message"]["content"]) == {"n": 3}
        assert stub.hits == 1


def test_an_answer_that_breaks_the_schema_is_repaired_once_then_refused_with_why() -> None:
    with gateway(Stub(texts=['{"n": "three"}'])) as (gw, stub):
        r = ask(gw)
        assert r.status_code == 422 and stub.hits == 2                  # the answer and one repair
        err = r.json()["error"]
        assert err["code"] == "schema_unsatisfied" and err["param"] == "response_format"
        assert "$.n" in err["message"] and "three" in err["message"]
        rec = row(gw, r)
        assert rec.status == 422 and rec.completion_tokens > 0          # both attempts were generated: billed
        # the same answer without strict is returned as it is (flagged), as before
        loose = ask(gw, strict=False)
        assert loose.status_code == 200 and loose.headers["x-tokenomy-schema"] == "invalid"


def test_a_repair_that_validates_is_returned() -> None:
    with gateway(Stub(texts=['{"n": "three"}', '{"n": 3}'])) as (gw, stub):
        r = ask(gw)
        assert r.status_code == 200 and r.headers["x-tokenomy-schema"] == "repaired" and stub.hits == 2
        jsonschema.validate(json.loads(r.json()["choices"][0]["message"]["content"]), SCHEMA)


def test_each_broken_choice_of_several_is_repaired_on_its_own() -> None:
    # n=3: choices 1 and 2 break the schema; each is asked again alone (n=1), and both repairs validate
    stub = Stub(texts=[['{"n": 1}', '{"n": "two"}', '{"n": "three"}'], '{"n": 2}', '{"n": 3}'])
    with gateway(stub) as (gw, stub):
        r = ask(gw, n=3)
        assert r.status_code == 200 and r.headers["x-tokenomy-schema"] == "repaired", r.text
        answers = [json.loads(c["message"]["content"]) for c in r.json()["choices"]]
        for a in answers:
            jsonschema.validate(a, SCHEMA)
        assert answers[0] == {"n": 1} and stub.hits == 3
        assert [b.get("n") for b in stub.bodies] == [3, 1, 1]
    # a choice whose repair breaks it again ends the strict request with which choice and why
    with gateway(Stub(texts=[['{"n": 1}', '{"n": "two"}'], '{"n": "still two"}'])) as (gw, stub):
        r = ask(gw, n=2)
        assert r.status_code == 422 and stub.hits == 2
        assert r.json()["error"]["message"].startswith("choice 1: ") and "still two" in r.json()["error"]["message"]


def test_an_answer_cut_at_max_tokens_is_refused_without_a_repair() -> None:
    with gateway(Stub(texts=['{"n": 12'], finish="length")) as (gw, stub):
        r = ask(gw)
        assert r.status_code == 422 and stub.hits == 1
        assert "cut at max_tokens (20)" in r.json()["error"]["message"]
        # the OpenAI SDK raises its own error for it, with the message
        client = openai.OpenAI(base_url=gw.base_url, api_key="x", max_retries=0)
        with pytest.raises(openai.UnprocessableEntityError, match="raise max_tokens"):
            client.chat.completions.create(model="up", messages=[{"role": "user", "content": "a number"}],
                                           response_format=fmt(), max_tokens=20)  # type: ignore[arg-type]


def test_a_stream_that_breaks_the_schema_ends_with_the_error_not_a_finish() -> None:
    with gateway(Stub(texts=['{"n": "three"}'])) as (gw, _):
        events = []
        with httpx.stream("POST", gw.base_url + "/chat/completions", timeout=60, json={
                "model": "up", "messages": [{"role": "user", "content": "a number"}], "response_format": fmt(),
                "stream": True}) as r:
            events = [json.loads(line[6:]) for line in r.iter_lines()
                      if line.startswith("data: ") and line != "data: [DONE]"]
        assert events[-1]["error"]["code"] == "schema_unsatisfied" and "$.n" in events[-1]["error"]["message"]
        assert not any(c.get("finish_reason") for e in events[:-1] for c in e.get("choices", []))
        # the Responses API ends the same answer with response.failed
        with httpx.stream("POST", gw.base_url + "/responses", timeout=60, json={
                "model": "up", "input": "a number", "stream": True,
                "text": {"format": {"type": "json_schema", "name": "count", "schema": SCHEMA, "strict": True}}}) as r:
            last = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: ")][-1]
        assert last["type"] == "response.failed"
        error = last["response"]["error"]     # code one of the SDK's ResponseError codes, the cause as its type
        assert (error["code"], error["type"]) == ("server_error", "schema_unsatisfied") and "$.n" in error["message"]


def test_the_embedded_engine_answers_a_strict_schema_with_json_that_validates() -> None:
    with live_server({"cache": NO_CACHE, "engine": SMALL_ENGINE}) as gw:
        client = openai.OpenAI(base_url=gw.base_url, api_key="x", max_retries=0)
        r = client.chat.completions.create(
            model="smollm2-135m-instruct",
            messages=[{"role": "user", "content": "How many legs has a cat? Answer in JSON."}],
            response_format=fmt(), max_tokens=24, temperature=0)  # type: ignore[arg-type]
        jsonschema.validate(json.loads(r.choices[0].message.content or ""), SCHEMA)


def test_a_stream_of_several_choices_checks_each_before_its_finish() -> None:
    """n > 1: each choice's finish goes out only once that choice validates; the second one's breaks the schema,
    so the stream ends with the error, naming it, in place of that finish."""
    with gateway(Stub(texts=[['{"n": 1}', '{"n": "two"}']])) as (gw, _):
        with httpx.stream("POST", gw.base_url + "/chat/completions", timeout=60, json={
                "model": "up", "messages": [{"role": "user", "content": "a number"}], "response_format": fmt(),
                "n": 2, "stream": True}) as r:
            events = [json.loads(line[6:]) for line in r.iter_lines()
                      if line.startswith("data: ") and line != "data: [DONE]"]
        err = events[-1]["error"]
        assert err["code"] == "schema_unsatisfied" and err["message"].startswith("choice 1:")
        assert "$.n" in err["message"]
        finished = [c["index"] for e in events[:-1] for c in e.get("choices", []) if c.get("finish_reason")]
        assert finished == [0]                                   # the valid choice finished, the other did not
        # the same answers in one body: the broken choice is asked again on its own (the stub's next answer to
        # n=1 is its first choice's, which validates); a stream's choices went out as they were made
        r = ask(gw, n=2)
        assert r.status_code == 200 and r.headers["x-tokenomy-schema"] == "repaired"
        assert [json.loads(c["message"]["content"]) for c in r.json()["choices"]] == [{"n": 1}, {"n": 1}]


UNIQUE = {"type": "object", "properties": {"tags": {"type": "array", "items": {"type": "string"}, "uniqueItems": True}},
          "required": ["tags"], "additionalProperties": False}


def unique_fmt(strict: bool) -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": "tags", "schema": UNIQUE, "strict": strict}}


def test_a_schema_the_grammar_cannot_enforce_is_checked_even_without_strict() -> None:
    """uniqueItems is left out of the grammar (structured/normalize.relax): an answer that repeats an item is
    repaired under strict (as a one-item list: structured/normalize.narrow_for_repair), and flagged (not silently
    returned) without it."""
    with gateway(Stub(texts=['{"tags": ["a", "a"]}', '{"tags": ["a", "b"]}'])) as (gw, stub):
        r = ask(gw, response_format=unique_fmt(True))
        assert r.status_code == 200 and r.headers["x-tokenomy-schema"] == "repaired" and stub.hits == 2
        # the repair is asked under a narrower schema, where a repeated item cannot happen again
        sent = [b["response_format"]["json_schema"]["schema"]["properties"]["tags"] for b in stub.bodies]
        assert "maxItems" not in sent[0] and sent[1]["maxItems"] == 1
        loose = ask(gw, response_format=unique_fmt(False))       # the stub says its last text again: valid
        assert loose.status_code == 200 and "x-tokenomy-schema" not in loose.headers
    with gateway(Stub(texts=['{"tags": ["a", "a"]}'])) as (gw, stub):
        loose = ask(gw, response_format=unique_fmt(False))
        assert loose.status_code == 200 and loose.headers["x-tokenomy-schema"] == "invalid" and stub.hits == 1
        assert "non-unique" in row(gw, loose).error


def test_the_embedded_engine_answers_a_schema_it_cannot_fully_enforce_or_says_why() -> None:
    """A strict schema with keywords llguidance lacks (uniqueItems, an overlapping oneOf) is no longer refused with
    a 400: the answer is made under the rest of the schema, validated, repaired once, and returned only if valid."""
    schema = {"type": "object", "properties": {
        "tags": {"type": "array", "items": {"enum": ["red", "green", "blue"]}, "uniqueItems": True, "minItems": 1},
        "size": {"oneOf": [{"type": "integer", "minimum": 0}, {"type": "integer", "maximum": 100}]}},
        "required": ["tags", "size"], "additionalProperties": False}
    with live_server({"cache": NO_CACHE, "engine": SMALL_ENGINE}) as gw:
        def ask_flag(strict: bool) -> httpx.Response:
            return httpx.post(gw.base_url + "/chat/completions", timeout=120, json={
                "model": "smollm2-135m-instruct", "temperature": 0, "max_tokens": 48,
                "messages": [{"role": "user", "content": "Colours of a flag and its size, in JSON."}],
                "response_format": {"type": "json_schema", "json_schema": {"name": "flag", "schema": schema,
                                                                           "strict": strict}}})

        r = ask_flag(True)
        if r.status_code == 200:
            jsonschema.validate(json.loads(r.json()["choices"][0]["message"]["content"]), schema)
        else:
            assert r.status_code == 422 and r.json()["error"]["code"] == "schema_unsatisfied", r.text
        # without strict the answer is returned, and flagged exactly when it breaks what the grammar left out
        loose = ask_flag(False)
        assert loose.status_code == 200
        valid = jsonschema.Draft202012Validator(schema).is_valid(
            json.loads(loose.json()["choices"][0]["message"]["content"]))
        assert (loose.headers.get("x-tokenomy-schema") == "invalid") == (not valid)


def test_a_strict_stream_the_grammar_cannot_fully_enforce_is_repaired_before_it_is_sent() -> None:
    """With uniqueItems left out of the grammar, a strict stream is collected first: its broken answer is repaired
    and the repaired one streamed, with its finish; a repair that fails is a plain 422, nothing streamed."""
    def stream(gw: Any) -> tuple[httpx.Response, list[dict]]:
        with httpx.stream("POST", gw.base_url + "/chat/completions", timeout=60, json={
                "model": "up", "messages": [{"role": "user", "content": "tags"}], "stream": True,
                "response_format": unique_fmt(True)}) as r:
            r.read()
            return r, [json.loads(line[6:]) for line in r.iter_lines()
                       if line.startswith("data: ") and line != "data: [DONE]"]

    with gateway(Stub(texts=['{"tags": ["a", "a"]}', '{"tags": ["a"]}'])) as (gw, stub):
        r, events = stream(gw)
        assert r.status_code == 200 and r.headers["x-tokenomy-schema"] == "repaired" and stub.hits == 2
        text = "".join(c["delta"].get("content") or "" for e in events for c in e.get("choices", []))
        assert json.loads(text) == {"tags": ["a"]}
        assert [c["finish_reason"] for e in events for c in e.get("choices", []) if c.get("finish_reason")] == ["stop"]
    with gateway(Stub(texts=['{"tags": ["a", "a"]}'])) as (gw, _):
        r, _events = stream(gw)
        assert r.status_code == 422 and "non-unique" in r.json()["error"]["message"]


def test_a_format_the_validator_knows_is_checked_not_skipped() -> None:
    # date-time and uri are checked only with jsonschema's format-nongpl extra, a dependency: without it they pass
    schema = {"type": "object", "properties": {"at": {"type": "string", "format": "date-time"},
                                               "url": {"type": "string", "format": "uri"}},
              "required": ["at", "url"], "additionalProperties": False}
    stamped = {"type": "json_schema", "json_schema": {"name": "stamp", "schema": schema, "strict": True}}
    answers = ['{"at": "yesterday", "url": "not a uri"}', '{"at": "2026-12-03T05:00:00Z", "url": "https://x.org/a"}']
    with gateway(Stub(texts=answers)) as (gw, stub):
        r = ask(gw, response_format=stamped)
        assert r.status_code == 200 and r.headers["x-tokenomy-schema"] == "repaired" and stub.hits == 2
        repair = stub.bodies[1]["messages"][-1]["content"]
        assert "date-time" in repair and "uri" in repair
