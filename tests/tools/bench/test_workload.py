"""Builtin workloads give valid request bodies; workload files round-trip, arrival times included."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest

from tests.helpers.shared_data import shared_data
from tokenomy.tools.bench.workload import (
    BUILTINS,
    Request,
    WorkloadError,
    load_workload,
    parse_length,
    read_file,
    write_file,
)


def assert_chat_body(body: dict) -> None:
    assert body["messages"] and all(m["role"] in ("system", "user", "assistant") and isinstance(m["content"], str)
                                    and m["content"] for m in body["messages"])
    assert body["messages"][-1]["role"] == "user"


@pytest.mark.parametrize("name", [n for n in BUILTINS if n != "grounded"])
def test_builtins_give_valid_chat_bodies(name: str) -> None:
    reqs = load_workload(name)
    assert reqs
    for r in reqs:
        assert r.chat and r.arrival_s is None
        assert_chat_body(r.body)
        json.dumps(r.body)


def test_shared_prefix_has_one_system_prompt_per_tenant() -> None:
    reqs = load_workload("shared-prefix:tenants=3,system=50,questions=4")
    assert len(reqs) == 12
    systems = [r.body["messages"][0]["content"] for r in reqs]
    assert len(set(systems)) == 3
    assert systems[:3] == systems[3:6]                       # interleaved by tenant
    assert all(len(s.split()) >= 50 for s in systems)
    assert all(r.body["messages"][0]["role"] == "system" for r in reqs)


def test_multi_turn_history_grows() -> None:
    reqs = load_workload("multi-turn:conversations=2,turns=3")
    assert [len(r.body["messages"]) for r in reqs] == [1, 1, 3, 3, 5, 5]
    first, second = reqs[0].body["messages"], reqs[2].body["messages"]
    assert second[:1] == first                               # turn 2 resends conversation 0's turn 1
    assert [m["role"] for m in reqs[4].body["messages"]] == ["user", "assistant", "user", "assistant", "user"]


def test_random_lengths_follow_the_distribution() -> None:
    reqs = load_workload("random:input=10-20,output=5,count=30", seed=1)
    assert len(reqs) == 30
    assert all(r.body["max_tokens"] == 5 for r in reqs)
    words = [len(r.body["messages"][0]["content"].split(": ", 1)[1].split()) for r in reqs]
    assert min(words) >= 10 and max(words) <= 20 and len(set(words)) > 3
    assert load_workload("random:count=5", seed=1) == load_workload("random:count=5", seed=1)
    assert load_workload("random:count=5", seed=1) != load_workload("random:count=5", seed=2)


@pytest.mark.parametrize("text, n", [("7", 7), ("3-3", 3)])
def test_parse_length(text: str, n: int) -> None:
    import random

    assert parse_length(text)(random.Random(0)) == n
    draws = [parse_length("normal:50:5")(random.Random(i)) for i in range(200)]
    assert 45 < sum(draws) / len(draws) < 55


@pytest.mark.parametrize("text", ["0", "9-3", "x", "normal:5", "-4"])
def test_parse_length_rejects(text: str) -> None:
    with pytest.raises(WorkloadError):
        parse_length(text)


def test_structured_bodies_carry_valid_schemas() -> None:
    for r in load_workload("structured"):
        fmt = r.body["response_format"]
        assert fmt["type"] == "json_schema"
        jsonschema.Draft202012Validator.check_schema(fmt["json_schema"]["schema"])


def test_grounded_reads_the_shared_prompts() -> None:
    path = shared_data("grounded/dev.jsonl", "TOKENOMY_GROUNDED")
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    reqs = load_workload(f"grounded:path={path}")
    assert len(reqs) == len(rows)
    assert [r.body["messages"][0]["content"] for r in reqs] == [row["turns"][0] for row in rows]
    summaries = load_workload(f"grounded:path={path},tasks=summarize")
    assert len(summaries) == sum(row["task"] == "summarize" for row in rows)


def test_grounded_missing_file_says_how_to_point_elsewhere(tmp_path: Path) -> None:
    with pytest.raises(WorkloadError, match="grounded:path=FILE"):
        load_workload(f"grounded:path={tmp_path / 'nope.jsonl'}")


def test_file_round_trip_with_arrival_times(tmp_path: Path) -> None:
    reqs = [Request({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}, 0.0),
            Request({"prompt": "Once upon a time", "max_tokens": 8}, 1.25)]
    path = tmp_path / "w.jsonl"
    write_file(path, reqs)
    assert read_file(path) == reqs
    assert load_workload(str(path)) == reqs
    assert not read_file(path)[1].chat


def test_file_of_bare_bodies(tmp_path: Path) -> None:
    path = tmp_path / "w.jsonl"
    path.write_text('{"messages": [{"role": "user", "content": "a"}]}\n\n{"prompt": "b"}\n')
    assert [r.arrival_s for r in read_file(path)] == [None, None]


@pytest.mark.parametrize("text, words", [
    ("not json\n", "not JSON"), ("[1]\n", "not a JSON object"), ('{"model": "x"}\n', "needs `messages`"),
    ('{"body": {"prompt": "a"}, "arrival_s": -1}\n', "arrival_s"), ("", "no requests"),
    ('{"body": {"prompt": "a"}, "arrival_s": 1}\n{"prompt": "b"}\n', "every line or on none")])
def test_bad_files(tmp_path: Path, text: str, words: str) -> None:
    path = tmp_path / "w.jsonl"
    path.write_text(text)
    with pytest.raises(WorkloadError, match=words):
        read_file(path)


def test_unknown_workload_and_bad_settings() -> None:
    with pytest.raises(WorkloadError, match="unknown workload 'nonesuch'"):
        load_workload("nonesuch")
    with pytest.raises(WorkloadError, match="not key=value"):
        load_workload("shared-prefix:tenants")
    with pytest.raises(WorkloadError, match="not an integer"):
        load_workload("shared-prefix:tenants=many")
