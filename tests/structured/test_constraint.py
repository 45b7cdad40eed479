import time

import numpy as np
import pytest

from tokenomy.structured.constraint import Constraint, ConstraintError
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
    c.advance(tokenizer.tokenize_str("[1,2"))
    assert not c.allowed()[eos] and not c.is_complete()
    c.advance(tokenizer.tokenize_str("]"))
    assert c.is_complete()
    assert c.is_done() or c.allowed()[eos]


def test_fast_forward_writes_what_the_grammar_fixes(compiler, tokenizer):
    schema = {"type": "object", "properties": {"kind": {"const": "point"}, "x": {"type": "integer"}},
              "required": ["kind", "x"], "additionalProperties": False}
    c = Constraint(compiler.compile(json_schema_format(schema)))
    ff = c.forced()
    # Forcing stops where the next token may merge with a choice (here the optional space after ':').
    assert _bytes(tokenizer, ff) == b'{"kind'
    c.advance(ff)
    c.advance(tokenizer.tokenize_str('":"'))
    rest = c.forced()
    assert _bytes(tokenizer, rest).startswith(b'point')  # the const value is written without sampling
    assert c.forced_tokens == len(ff) + len(rest)
    c.advance(rest)
    text = _bytes(tokenizer, ff) + b'":"' + _bytes(tokenizer, rest)
    assert b'{"kind":"point","x":7}'.startswith(text), text
    c.advance(tokenizer.tokenize_str(b'{"kind":"point","x":7}'[len(text):].decode()))
    assert c.is_complete() and c.forced() == []


def test_bad_token_raises_and_rollback(compiler, tokenizer):
    c = Constraint(compiler.compile(json_schema_format({"type": "object"})))
    c.advance(tokenizer.tokenize_str("{"))
    key = tokenizer.tokenize_str('"a":')
    c.advance(key)
    assert not c.is_complete()
    c.rollback(len(key))
    c.advance(tokenizer.tokenize_str("}"))
    assert c.is_complete()
    d = Constraint(compiler.compile(json_schema_format({"type": "object"})))
    with pytest.raises(ConstraintError):
        d.advance(tokenizer.tokenize_str("hello"))


def test_apply_sets_disallowed_logits_to_minus_inf(compiler, tokenizer):
    c = Constraint(compiler.compile(json_schema_format({"type": "boolean"})))
    logits = np.zeros(tokenizer.vocab_size, dtype=np.float32)
    c.apply(logits)
    ok = np.flatnonzero(np.isfinite(logits))
    assert {_bytes(tokenizer, [int(t)]) for t in ok} <= {b"t", b"tr", b"tru", b"true", b"f", b"fa", b"fal",
                                                           b"fals", b"false"}


def test_mask_is_fast(compiler, tokenizer):
    """Mask plus unpack well under a decode step (13 ms here); a loose bound for a shared 2-core machine."""
    schema = {"type": "object", "properties": {"name": {"type": "string"}, "tags": {"type": "array",
              "items": {"type": "string"}}}, "required": ["name", "tags"]}
    c = Constraint(compiler.compile(json_schema_format(schema)))
    text = tokenizer.tokenize_str('{"name":"Ada Lovelace, the first programmer","tags":["math","poetry"')
    times = []
    for t in text:
        if not c.allowed()[t]:
            break
        t0 = time.perf_counter()
        c.allowed()
        times.append(time.perf_counter() - t0)
        c.advance([t])
    assert len(times) == len(text)
    assert float(np.median(times)) < 2e-3
