import re

import pytest

from tokenomy.structured.example import pattern_examples, shortest_match


@pytest.mark.parametrize("pattern", [
    r"/api/v1/exports/\d+/export_files/\d+", r"^[A-Z]{3}-[0-9]{4}$", r"^(foo|ba)+x?$", r"[^abc]{2}",
    r"^\w+@\w+\.com$", r"^#[0-9a-fA-F]{6}$", r"^\S+\s\D$", r"(?:ab){2,5}c", r"^.{3}$",
])
def test_shortest_match_matches_its_pattern(pattern):
    ex = shortest_match(pattern)
    assert ex is not None and re.search(pattern, ex)


def test_shortest_match_takes_the_fewest_repeats_and_the_shortest_branch():
    assert shortest_match(r"^(long|s)+x*$") == "s"
    assert shortest_match(r"^a{3,9}$") == "aaa"


@pytest.mark.parametrize("pattern", [r"(a)\1", r"(?=x)a", r"[", r"a(?<!b)"])
def test_unmodelled_or_broken_patterns_give_none(pattern):
    assert shortest_match(pattern) is None


def test_pattern_examples_are_escaped_string_bodies_shortest_first():
    schema = {"properties": {"a": {"type": "string", "pattern": r"^\\d$"},
                             "b": {"items": {"pattern": "^x+$"}},
                             "c": {"enum": [{"pattern": "not a schema"}]}}}
    assert pattern_examples(schema) == [b"x", b"\\\\d"]
