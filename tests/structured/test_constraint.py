import json
import types

import numpy as np
import pytest

from tokenomy.structured.constraint import Constraint, ConstraintError, loop_continuation
from tokenomy.structured.schema import json_schema_format


def _bytes(tokenizer, tokens):
    return tokenizer.decode_bytes(tokens)


def test_mask_shape_and_bits_agree(compiler, tokenizer):
    c = Constraint(compiler.compile(json_schema_format({"type": "object"})))
    mask = c.allowed()
    assert mask.shape == (tokenizer.vocab_size,) and mask.dtype == np.bool_
    bits = c.bitmask()
    for t in np.flatnonzero(mask)[:50]:
        assert (int(bits[t // 32]) >> (t % 32)) & 1
    # An object must start with "{": every allowed first token does.
    allowed = np.flatnonzero(mask)
    assert 0 < len(allowed) < tokenizer.vocab_size // 10
    assert all(_bytes(tokenizer, [int(t)]).startswith(b"{") for t in allowed)


def test_eos_allowed_only_when_complete(compiler, tokenizer):
    c = Constraint(compiler.compile(json_schema_format({"type": "array", "items": {"type": "integer"}})))
    eos = tokenizer.eos_token
    assert not c.allowed()[eos] and not c.is_complete()
    c.advance(tokenizer.tokenize_str("[1, 2"))
    assert not c.allowed()[eos] and not c.is_complete()
    c.advance(tokenizer.tokenize_str("]"))
    assert c.is_complete()
    assert c.is_done() or c.allowed()[eos]


def test_fast_forward_writes_what_the_grammar_fixes(compiler, tokenizer):
    schema = {"type": "object", "properties": {"kind": {"const": "point"}, "x": {"type": "integer"}},
              "required": ["kind", "x"], "additionalProperties": False}
    c = Constraint(compiler.compile(json_schema_format(schema)))
    ff = c.forced()
    # With fixed separators everything up to the integer is dictated: keys in schema order, the const value,
    # ", " and ": ". Forcing stops before the last space, which may merge with the first digit (" 7").
    assert _bytes(tokenizer, ff) == b'{"kind": "point", "x":'
    assert c.forced_tokens == len(ff)
    c.advance(ff)
    assert c.forced() == []  # the value is the model's to choose
    c.advance(tokenizer.tokenize_str(" 7}"))
    assert c.is_complete() and c.forced() == []


def test_bad_token_raises(compiler, tokenizer):
    c = Constraint(compiler.compile(json_schema_format({"type": "object"})))
    c.advance(tokenizer.tokenize_str('{"a":'))
    assert not c.is_complete()
    c.advance(tokenizer.tokenize_str(' 1}'))
    assert c.is_complete()
    d = Constraint(compiler.compile(json_schema_format({"type": "object"})))
    with pytest.raises(ConstraintError):
        d.advance(tokenizer.tokenize_str("hello"))


def test_allowed_admits_only_prefixes_of_valid_documents(compiler, tokenizer):
    c = Constraint(compiler.compile(json_schema_format({"type": "boolean"})))
    ok = np.flatnonzero(c.allowed())
    assert {_bytes(tokenizer, [int(t)]) for t in ok} <= {b"t", b"tr", b"tru", b"true", b"f", b"fa", b"fal",
                                                           b"fals", b"false"}


def test_mask_admits_each_token_of_a_valid_document(compiler, tokenizer):
    """Along a document the schema accepts, each next token is in the mask, a second mask at the same position
    included. (What a mask costs against a decode step: bench/structured.py, figures in docs/structured.md.)"""
    schema = {"type": "object", "properties": {"name": {"type": "string"}, "tags": {"type": "array",
              "items": {"type": "string"}}}, "required": ["name", "tags"]}
    c = Constraint(compiler.compile(json_schema_format(schema)))
    text = tokenizer.tokenize_str('{"name": "Ada Lovelace, the first programmer", "tags": ["math", "poetry"')
    for i, t in enumerate(text):
        assert c.allowed()[t] and c.allowed()[t], (i, _bytes(tokenizer, text[:i + 1]))
        c.advance([t])
    assert not c.allowed()[tokenizer.eos_token]          # the array and the object are still open


def test_loop_continuation_finds_the_shortest_verbatim_cycle():
    assert loop_continuation([9, 8] + [1, 2, 3, 4] * 3) == 1
    assert loop_continuation([5] * 12) == 5
    assert loop_continuation([5] * 11) is None  # shorter than the minimum span
    assert loop_continuation([1, 2, 3] * 2 + [4]) is None
    assert loop_continuation(list(range(100))) is None


def test_loop_breaker_bans_only_the_loop_token_and_keeps_the_grammar(compiler, tokenizer):
    schema = {"type": "array", "items": {"type": "string", "enum": ["a", "b"]}}
    grammar = compiler.compile(json_schema_format(schema))
    c, plain = Constraint(grammar), Constraint(grammar, break_loops=False)
    looped = '["a", "a", "a", "a", "a", "a", "a'  # ends inside the 7th item
    for d in (c, plain):
        d.advance(tokenizer.tokenize_str(looped))
    history = list(c.history)
    banned = loop_continuation(history)
    assert banned is not None and history == plain.history
    m, p = c.allowed(), plain.allowed()
    assert p[banned] and not m[banned] and c.loops_broken == 1
    assert not (m & ~p).any() and np.count_nonzero(p & ~m) == 1  # a subset of the grammar's mask, one less


def test_wrap_up_keeps_only_closing_tokens_past_the_soft_limit(compiler, tokenizer):
    grammar = compiler.compile(json_schema_format({"type": "object", "properties": {
        "tags": {"type": "array", "items": {"type": "string"}, "minItems": 2}}, "required": ["tags"]}))
    c, plain = Constraint(grammar, soft_limit=4), Constraint(grammar)

    def step(text: str) -> tuple[set[bytes], np.ndarray, np.ndarray]:
        for d in (c, plain):
            d.advance(tokenizer.tokenize_str(text))
        m, p = c.allowed(), plain.allowed()
        assert not (m & ~p).any()  # never outside the grammar's mask
        return {_bytes(tokenizer, [int(t)])[:1] for t in np.flatnonzero(m)}, m, p

    firsts, m, _ = step('{"tags": ["a long tag')  # inside a string: only tokens that close it
    assert firsts == {b'"'}
    # ... and of those, the ones that close the most: '"' followed by nothing or by closers only
    assert all(set(_bytes(tokenizer, [int(t)])[1:]) <= set(b"]}") for t in np.flatnonzero(m))
    firsts, m, p = step('"')  # one item, minItems 2: "]" is not allowed yet, so the next item is the way out
    assert firsts == {b","} and p[tokenizer.tokenize_str("]")[0]] == np.False_
    firsts, _, _ = step(', "b"')
    assert firsts == {b"]"}
    _, m, _ = step("]}")
    assert np.flatnonzero(m).tolist() == [tokenizer.eos_token] or c.is_done()
    assert c.wrapups >= 2


def test_wrap_up_prefers_scalars_and_ends_numbers(compiler, tokenizer):
    """Past the soft limit no new object or array is opened where a scalar will do, and a number ends at the
    next "," when a required key is still due; always a subset of the grammar's mask."""
    schema = {"type": "object", "properties": {"n": {"type": "integer"}, "any": {}, "s": {"type": "string"}},
              "required": ["n", "any", "s"], "additionalProperties": False}
    grammar = compiler.compile(json_schema_format(schema))
    c, plain = Constraint(grammar, soft_limit=0), Constraint(grammar)
    for d in (c, plain):
        d.advance(tokenizer.tokenize_str('{"n": 12'))
    m, p = c.allowed(), plain.allowed()
    assert not (m & ~p).any() and any(_bytes(tokenizer, [int(t)])[:1].isdigit() for t in np.flatnonzero(p))
    assert {_bytes(tokenizer, [int(t)])[:1] for t in np.flatnonzero(m)} == {b","}
    for d in (c, plain):
        d.advance(tokenizer.tokenize_str(', "any":'))
    m, p = c.allowed(), plain.allowed()
    opener = [t for t in np.flatnonzero(p) if _bytes(tokenizer, [int(t)]).strip()[:1] in (b"{", b"[")]
    assert opener and not m[opener].any() and m.any() and not (m & ~p).any()


@pytest.fixture
def replan_any(monkeypatch):
    """Re-plan every grammar, however long its walk took (the gate is about stalls, not what these test)."""
    monkeypatch.setattr("tokenomy.structured.constraint.REPLAN_MAX_WALK_S", float("inf"))


def test_plan_wrap_up_starts_early_enough_for_the_shortest_answer(compiler, tokenizer, replan_any):
    from tokenomy.structured.constraint import closing_length

    small = compiler.compile(json_schema_format({"type": "object", "properties": {"a": {"type": "string"}}}))
    names = [f"field_{i}" for i in range(40)]
    big = compiler.compile(json_schema_format({"type": "object", "properties": {n: {"type": "string"} for n in names},
                                               "required": names, "additionalProperties": False}))
    short, long = closing_length(small), closing_length(big)
    assert 1 <= short < 10 < 40 < long < 400  # every required key is written out
    assert Constraint(small).plan_wrap_up(100, 0.6) == 60
    c = Constraint(big)
    assert c.plan_wrap_up(long + 20, 0.9) == 20 and c.soft_limit == 20
    assert Constraint(big).plan_wrap_up(long // 2, 0.6) == 0  # cannot fit at all: wind down from the start


def test_a_grammar_too_slow_to_replan_keeps_the_replan_margin_from_the_start(compiler, monkeypatch):
    from tokenomy.structured.constraint import REPLAN_EVERY, REPLAN_MARGIN, closing_length

    monkeypatch.setattr("tokenomy.structured.constraint.REPLAN_MAX_WALK_S", -1.0)
    names = [f"field_{i}" for i in range(40)]
    big = compiler.compile(json_schema_format({"type": "object", "properties": {n: {"type": "string"} for n in names},
                                               "required": names, "additionalProperties": False}))
    need = closing_length(big)
    c = Constraint(big)
    budget = 2 * need + 100
    assert c.plan_wrap_up(budget, 0.9) == budget - int(need * REPLAN_MARGIN) - REPLAN_EVERY
    assert c.max_tokens is None and c.strict_past_soft_limit   # never re-planned: strict from the soft limit


def test_replan_starts_wrap_up_once_an_opened_object_needs_the_rest_of_the_budget(compiler, tokenizer, replan_any):
    names = [f"field_{i}" for i in range(30)]
    big = {"type": "object", "properties": {n: {"type": "string"} for n in names}, "required": names,
           "additionalProperties": False}
    grammar = compiler.compile(json_schema_format({"anyOf": [{"type": "integer"}, big]}))
    c = Constraint(grammar)
    assert c.plan_wrap_up(300, 0.9) == 270  # from an empty answer an integer will do
    c.advance(tokenizer.tokenize_str('{"field_0": "a very long value that goes on and on and on and on'))
    while len(c.history) < 40:
        c.advance(tokenizer.tokenize_str(" and on"))
    c.allowed()
    need = c.closing_need(300)
    assert need > 150 and c.replans == 1 and c.soft_limit == len(c.history)  # 30 keys cannot wait until 270
    quiet = Constraint(grammar)
    assert quiet.plan_wrap_up(4000, 0.9) == 3600
    quiet.advance(list(c.history))
    quiet.allowed()
    assert quiet.replans == 0 and quiet.soft_limit == 3600  # plenty of room: the plan stands


def test_first_token_may_not_open_a_container_that_cannot_fit(compiler, tokenizer):
    """A root that takes an integer or an object with 40 required keys: when the object's shortest completion
    does not fit in max_tokens, the first token may not open it; when it fits, nothing is banned; and a root
    that must be an object keeps its `{` whatever the budget."""
    from tokenomy.structured.constraint import closing_length

    names = [f"field_{i}" for i in range(40)]
    big = {"type": "object", "properties": {n: {"type": "string"} for n in names}, "required": names,
           "additionalProperties": False}
    grammar = compiler.compile(json_schema_format({"anyOf": [{"type": "integer"}, big]}))
    need = closing_length(compiler.compile(json_schema_format(big)))
    first = grammar.tables.first_bytes

    def opens(c: Constraint) -> bool:
        m = c.allowed()
        return bool((m & (first[: len(m)] == ord("{"))).any())

    tight = Constraint(grammar)
    tight.plan_wrap_up(need // 2, 0.6)
    assert tight.root_bans == {ord("{")} and not opens(tight) and tight.allowed().any()
    roomy = Constraint(grammar)
    roomy.plan_wrap_up(need * 3, 0.6)
    assert roomy.root_bans == frozenset() and opens(roomy)
    assert opens(Constraint(grammar))                    # unplanned: the grammar's mask as it is
    only = Constraint(compiler.compile(json_schema_format(big)))
    only.plan_wrap_up(need // 2, 0.6)
    assert only.root_bans == frozenset()   # `{` is forced or the only choice: never banned
    tokens = tokenizer.tokenize_str("12")
    tight.advance(tokens)                                 # the ban is for the first token only
    assert tight.is_complete()


def _wind_down(c, tokenizer, limit=120):
    """Follow wrap-up's choices (forced tokens, else the first allowed token) to the end of the document."""
    n = 0
    while not c.is_done() and n < limit:
        ff = c.forced()
        if not ff:
            allowed = np.flatnonzero(c.allowed())
            if len(allowed) == 1 and allowed[0] == tokenizer.eos_token:
                break
            ff = [int(allowed[0])]
        c.advance(ff)
        n += len(ff)
    return tokenizer.decode_bytes(c.history)


@pytest.mark.parametrize("string, written", [
    ({"type": "string", "format": "email"}, '"john.doe.json.json'),   # no "@" yet: the quote is not allowed
    ({"type": "string", "format": "uuid"}, '"12'),
    ({"type": "string", "pattern": "^[A-Z]{3}-[0-9]{4}$"}, '"AB'),
    ({"type": "string", "pattern": "^/api/v1/exports/\\d+/export_files/\\d+$"}, '"/api/v1/exp'),
    # unanchored (JSON Schema's default): every byte stays valid, so only an example match of the pattern ends it
    ({"type": "string", "pattern": "/api/v1/exports/\\d+/export_files/\\d+"}, '"see '),
])
def test_wrap_up_steers_a_string_that_cannot_end_yet_to_a_valid_end(compiler, tokenizer, string, written):
    import jsonschema

    schema = {"type": "object", "properties": {"v": string}, "required": ["v"], "additionalProperties": False}
    c = Constraint(compiler.compile(json_schema_format(schema)), soft_limit=0)
    c.advance(tokenizer.tokenize_str('{"v": ' + written))
    quote = tokenizer.tokenize_str('"')[0]
    assert not c.allowed()[quote] or string.get("pattern", "").startswith("/")  # stuck without steering
    text = _wind_down(c, tokenizer)
    assert c.is_complete() and c.steered > 0
    jsonschema.validate(json.loads(text), schema, format_checker=jsonschema.FormatChecker())


def test_closing_path_gives_up_within_its_budget_on_a_string_that_can_never_end(compiler, tokenizer):
    from tokenomy.structured.constraint import closing_path

    g = compiler.compile(json_schema_format({"type": "string", "pattern": "^a{3}$"}))
    c = Constraint(g)
    c.advance(tokenizer.tokenize_str('"aaa'))
    t = g.tables
    assert closing_path(c._matcher, t.byte_tokens, t.byte_tokens[0x22]) is None  # the quote is due now, not later
    assert c.allowed()[t.byte_tokens[0x22]]


def test_start_constraint_refuses_a_schema_whose_shortest_answer_cannot_fit(compiler, replan_any):
    from tokenomy.structured.constraint import NoRoom, closing_length, start_constraint

    keys = {f"required_field_number_{i}": {"type": "string"} for i in range(12)}
    g = compiler.compile(json_schema_format({"type": "object", "properties": keys, "required": list(keys)}))
    need = closing_length(g)
    assert need > 40
    with pytest.raises(NoRoom) as e:
        start_constraint(g, need - 1, wrap_up=0.6)
    assert e.value.need == need and str(need) in str(e.value)
    c = start_constraint(g, need + 10, wrap_up=0.6)
    assert c.soft_limit == 10 and c.break_loops
    assert start_constraint(g, need, wrap_up=None).soft_limit is None


def _adversary(c, tokenizer, max_tokens):
    """A model that always takes the shortest token the mask allows (the slowest way to the end)."""
    lengths = c.grammar.tables.lengths
    n = 0
    while not c.is_done() and n < max_tokens:
        ff = c.forced()
        if not ff:
            ids = np.flatnonzero(c.allowed())
            if len(ids) == 1 and ids[0] == tokenizer.eos_token:
                break
            ids = ids[ids != tokenizer.eos_token]
            ff = [int(ids[np.argmin(np.where(lengths[ids] > 0, lengths[ids], 1 << 30))])]
        c.advance(ff[: max_tokens - n])
        n += len(ff[: max_tokens - n])
    return n


def test_past_the_soft_limit_strict_mode_ends_the_answer_within_max_tokens(compiler, tokenizer, replan_any):
    from tokenomy.structured.constraint import closing_length

    # each string needs 40 characters: the walk writes them in a few long tokens, the adversary one byte at a time
    names = [f"field_{i}" for i in range(6)]
    schema = {"type": "object", "properties": {n: {"type": "string", "minLength": 40} for n in names},
              "required": names, "additionalProperties": False}
    grammar = compiler.compile(json_schema_format(schema))
    budget = closing_length(grammar) + 48
    c = Constraint(grammar)
    c.plan_wrap_up(budget, 0.9)
    n = _adversary(c, tokenizer, budget)
    assert c.is_complete() and n <= budget and c.strict
    json.loads(tokenizer.decode_bytes(c.history))
    loose = Constraint(grammar)           # the same plan without the strict switch runs out of tokens
    loose.plan_wrap_up(budget, 0.9)
    loose._replan = lambda: None
    _adversary(loose, tokenizer, budget)
    assert not loose.is_complete()


def test_a_strict_schema_gets_wrap_up_on_a_model_without_a_wrap_up_share(compiler, tokenizer, replan_any):
    """A model given as a GGUF path has no wrap-up share; a strict json_schema's answer is planned at
    STRICT_WRAP_UP all the same, and ends within max_tokens where the unplanned one is cut (a 422)."""
    from tokenomy.backends.embedded import STRICT_WRAP_UP, wrap_up_share
    from tokenomy.structured.constraint import closing_length, start_constraint

    assert wrap_up_share(None, strict=False) is None and wrap_up_share(0.6, strict=True) == 0.6
    names = [f"field_{i}" for i in range(6)]
    schema = {"type": "object", "properties": {n: {"type": "string", "minLength": 40} for n in names},
              "required": names, "additionalProperties": False}
    grammar = compiler.compile(json_schema_format(schema))
    budget = closing_length(grammar) + 48
    c = start_constraint(grammar, budget, wrap_up=wrap_up_share(None, strict=True))
    assert c.soft_limit is not None and c.soft_limit <= STRICT_WRAP_UP * budget
    assert _adversary(c, tokenizer, budget) <= budget and c.is_complete()
    cut = start_constraint(grammar, budget, wrap_up=wrap_up_share(None, strict=False))
    _adversary(cut, tokenizer, budget)
    assert not cut.is_complete()


def test_a_grammar_too_slow_to_replan_is_strict_from_its_soft_limit_and_ends_in_time(compiler, tokenizer,
                                                                                     monkeypatch):
    from tokenomy.structured.constraint import REPLAN_EVERY, REPLAN_MARGIN, closing_length

    monkeypatch.setattr("tokenomy.structured.constraint.REPLAN_MAX_WALK_S", -1.0)
    names = [f"field_{i}" for i in range(6)]
    schema = {"type": "object", "properties": {n: {"type": "string", "minLength": 40} for n in names},
              "required": names, "additionalProperties": False}
    grammar = compiler.compile(json_schema_format(schema))
    budget = int(closing_length(grammar) * REPLAN_MARGIN) + REPLAN_EVERY + 16
    c = Constraint(grammar)
    c.plan_wrap_up(budget, 0.9)
    n = _adversary(c, tokenizer, budget)
    assert c.is_complete() and n <= budget and not c.strict and c.strict_past_soft_limit


def test_the_first_grammar_walk_is_timed_without_the_tokenizers_one_time_tables(tokenizer, monkeypatch):
    """Issue 49: the first walk of a process also built the per-token tables and was judged too slow to re-plan.
    The clock here advances only while a table is built: the walk's own time must not include it."""
    from tokenomy.structured import constraint
    from tokenomy.structured.grammar import GrammarCompiler

    clock = [0.0]
    real = constraint.wrap_up_ranks

    def slow_table(tables):
        if tables.wrap_up_ranks is None:
            clock[0] += 10.0   # a one-time cost far above REPLAN_MAX_WALK_S
        return real(tables)

    monkeypatch.setattr(constraint, "wrap_up_ranks", slow_table)
    monkeypatch.setattr(constraint, "time", types.SimpleNamespace(thread_time=lambda: clock[0]))
    fresh = GrammarCompiler(tokenizer, timeout_s=10.0)   # its own tables, not yet built
    try:
        grammar = fresh.compile(json_schema_format({"type": "object", "properties": {
            "status": {"type": "string"}, "value": {"type": "integer"}}, "required": ["status", "value"],
            "additionalProperties": False, "x-fresh": True}))
        c = Constraint(grammar)
        soft = c.plan_wrap_up(48, 0.6)
    finally:
        fresh.close()
    assert clock[0] == 10.0                               # the tables were built, once
    assert soft == int(0.6 * 48) and c.max_tokens == 48   # re-planned like any quick grammar, not wound down early
    assert not c.strict_past_soft_limit


def test_a_limit_planned_from_an_empty_answer_waits_until_wrap_up_is_needed(compiler, tokenizer, replan_any):
    """The plan reserves the walk from an empty answer; by the time the answer reaches that limit most of it is
    written, so the limit moves on and the mask stays the grammar's; it narrows once the walk from here no longer
    fits."""
    from tokenomy.structured.constraint import closing_length

    grammar = compiler.compile(json_schema_format({"type": "object", "properties": {
        "status": {"type": "string"}, "value": {"type": "integer"}}, "required": ["status", "value"],
        "additionalProperties": False}))
    need = closing_length(grammar)
    written = tokenizer.tokenize_str('{"status": "ok", "value": 4')
    budget = need + len(written)
    c = Constraint(grammar)
    assert c.plan_wrap_up(budget, 0.9) == len(written) < int(0.9 * budget)
    c.advance(written)
    plain = Constraint(grammar)
    plain.advance(list(c.history))
    assert (c.allowed() == plain.allowed()).all() and c.wrapups == 0 and c.soft_limit > len(c.history)
    c.advance(tokenizer.tokenize_str("2"))
    while len(c.history) < c.soft_limit:
        c.advance(tokenizer.tokenize_str("2"))
    c.allowed()
    assert c.wrapups == 1   # the walk from here no longer fits with its margin: wrap-up is due
