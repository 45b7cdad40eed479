"""Compile grammars with llguidance, bounded in time and cached by grammar hash.

A compile builds an ``LLMatcher`` for the model's tokenizer and computes its first token mask, so that every
error llguidance finds lazily (unsupported keyword, bad regex, lexer blow-up) surfaces here as a SchemaError
instead of in the middle of decoding. Bounds, two layers deep:

- llguidance's own fuel limits (``LLParserLimits``) stop runaway lexer/parser construction deterministically;
- a wall-clock ``timeout_s`` on the calling side: compilation runs on a small worker pool and the caller
  stops waiting after ``timeout_s`` with ``SchemaError("... exceeded ... s")``, so no request ever hangs. The
  outcome (grammar or refusal) is cached either way, so a slow schema is paid for once.

Each sequence gets its own matcher as a ``deep_copy`` of the compiled prototype (microseconds, versus a fresh
build per request).
"""

from __future__ import annotations

import json
import re
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import llguidance
import numpy as np
from cachetools import LRUCache

from tokenomy.structured.normalize import PATTERN_MAX_LENGTH, unenforced_pattern, walk
from tokenomy.structured.schema import JSON_OPTIONS, OutputFormat, SchemaError, json_schema_format
from tokenomy.structured.token_tables import TokenTables

DEFAULT_TIMEOUT_S = 5.0
MAX_PATTERN_PROBES = 64  # bounds the probing cost on schemas with hundreds of patterns

# llguidance messages that name an option the API user cannot set: say what is unsupported instead.
_REWORDED = {
    "oneOf constraints are not supported": "oneOf whose branches may overlap is not supported "
                                           "(only provably exclusive oneOf compiles)",
}
_STOP_REASONS = {   # llguidance's stop reasons, when one is all its error says
    "NoExtension": "the schema allows no continuation of the answer here",
    "NoExtensionBias": "the schema allows no continuation of the answer here",
    "MaxTokensTotal": "the answer the schema requires is longer than the grammar engine's token limit",
    "MaxTokensParser": "the answer the schema requires is longer than the grammar engine's token limit",
    "ParserTooComplex": "the schema is too complex for the grammar engine's limits",
    "LexerTooComplex": "the schema's patterns are too complex for the grammar engine's limits",
    "InternalError": "the grammar engine failed on this schema",
}


def default_limits() -> llguidance.LLParserLimits:
    """llguidance's defaults (about 20 ms of initial lexer work, 500k grammar symbols), without echoing the
    schema back in error messages."""
    return llguidance.LLParserLimits(verbose_errors=False)


@dataclass(frozen=True)
class CompiledGrammar:
    """A validated grammar bound to one tokenizer; ``matcher()`` hands out independent per-sequence copies."""

    key: str
    fmt: OutputFormat | None
    tables: TokenTables  # the tokenizer and its per-token tables, shared by every grammar of one compiler
    compile_ms: float
    _proto: llguidance.LLMatcher

    @property
    def tokenizer(self) -> llguidance.LLTokenizer:
        return self.tables.tokenizer

    @property
    def n_vocab(self) -> int:
        return self.tokenizer.vocab_size

    def matcher(self) -> llguidance.LLMatcher:
        return self._proto.deep_copy()

    @cached_property
    def pattern_examples(self) -> list[bytes]:
        """Example matches of the schema's ``pattern``s, as string-body bytes (see structured/example.py)."""
        from tokenomy.structured.example import pattern_examples

        if self.fmt is None:
            return []
        return pattern_examples([self.fmt.schema, list(self.fmt.tools.values())])


class GrammarCompiler:
    """Compiles OutputFormats (or raw llguidance grammar strings) for one tokenizer; thread-safe.

    ``compile`` returns a CompiledGrammar or raises SchemaError(reason); both outcomes are kept in an LRU of
    ``max_entries`` keyed by the grammar's SHA-256. Concurrent requests for the same grammar share one compile.
    """

    def __init__(self, tokenizer: llguidance.LLTokenizer, timeout_s: float = DEFAULT_TIMEOUT_S,
                 max_entries: int = 512, limits: llguidance.LLParserLimits | None = None,
                 workers: int = 2) -> None:
        self.tables = TokenTables(tokenizer)
        self.timeout_s = timeout_s
        self.limits = limits or default_limits()
        self.hits = 0
        self.misses = 0
        self._cache: LRUCache[str, CompiledGrammar | SchemaError] = LRUCache(max_entries)  # guarded by self._lock
        self._pending: dict[str, Future[CompiledGrammar]] = {}
        self._lock = threading.RLock()  # a done-callback may run inside compile() under the lock
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="grammar-compile")

    @property
    def tokenizer(self) -> llguidance.LLTokenizer:
        return self.tables.tokenizer

    @property
    def max_entries(self) -> int:
        return self._cache.maxsize

    def compile(self, fmt: OutputFormat | str) -> CompiledGrammar:
        """Compile ``fmt`` (an OutputFormat, or an llguidance grammar string) or raise SchemaError."""
        grammar = fmt.grammar if isinstance(fmt, OutputFormat) else fmt
        key = fmt.key if isinstance(fmt, OutputFormat) else OutputFormat("raw", grammar).key
        with self._lock:
            cached = self._cache.get(key)
            if cached is not None:
                self.hits += 1
                if isinstance(cached, SchemaError):
                    raise SchemaError(cached.reason, cached.param)
                return cached
            self.misses += 1
            future = self._pending.get(key)
            if future is None:
                future = self._pool.submit(self._build, key, fmt if isinstance(fmt, OutputFormat) else None,
                                           grammar)
                self._pending[key] = future
                future.add_done_callback(lambda f, k=key: self._store(k, f))
        param = fmt.param if isinstance(fmt, OutputFormat) else "response_format"
        try:
            return future.result(timeout=self.timeout_s)
        except FutureTimeout:
            # The worker keeps going (llguidance's fuel limits end it); remember the refusal for this key.
            err = SchemaError(f"grammar compilation exceeded {self.timeout_s:g} s; simplify the schema", param)
            with self._lock:
                self._cache[key] = err
            raise err from None
        except SchemaError as e:
            raise SchemaError(e.reason, param) from None

    def compile_schema(self, schema: dict) -> CompiledGrammar:
        """Compile a bare JSON Schema (the ``response_format: json_schema`` path)."""
        return self.compile(json_schema_format(schema))

    def _build(self, key: str, fmt: OutputFormat | None, grammar: str) -> CompiledGrammar:
        t0 = time.perf_counter()
        matcher = llguidance.LLMatcher(self.tokenizer, grammar, log_level=0, limits=self.limits)
        if matcher.is_error():
            raise SchemaError(clean_reason(matcher.get_error()))
        # Force the lazy parts (lexer states for the first token) now rather than on the first decode step.
        bits = np.zeros((self.tokenizer.vocab_size + 31) // 32, dtype=np.int32)
        matcher.unsafe_compute_mask_ptr(bits.ctypes.data, bits.nbytes)
        if matcher.is_error():
            raise SchemaError(clean_reason(matcher.get_error()))
        if not bits.any():
            raise SchemaError("the schema accepts no document (no token can start it)")
        if fmt is not None:
            self._probe_patterns(fmt)
        return CompiledGrammar(key, fmt, self.tables, (time.perf_counter() - t0) * 1000, matcher)

    def _probe_patterns(self, fmt: OutputFormat) -> None:
        """Refuse string patterns whose lexer blows up on the first character.

        llguidance builds a pattern's lexer states lazily; a pattern crossed with a large maxLength (e.g.
        ``(\\S+\\s+){0,99}`` within 5000 characters) compiles, then fails with "too many expressions" the moment
        generation enters the string. Entering each distinct pattern once here moves that failure to compile
        time, where it is a 400 instead of a broken answer.
        """
        quote = self.tokenizer.tokenize_str('"')
        bits = np.zeros((self.tokenizer.vocab_size + 31) // 32, dtype=np.int32)
        for spec in _string_patterns(fmt)[:MAX_PATTERN_PROBES]:
            grammar = llguidance.LLMatcher.grammar_from_json_schema(spec, overrides=JSON_OPTIONS)
            m = llguidance.LLMatcher(self.tokenizer, grammar, log_level=0, limits=self.limits)
            if m.consume_tokens(quote):
                m.unsafe_compute_mask_ptr(bits.ctypes.data, bits.nbytes)
            if m.is_error():
                reason = clean_reason(m.get_error())
                raise SchemaError(f"pattern {spec['pattern'][:80]!r} is too complex to enforce ({reason})")

    def _store(self, key: str, future: Future[CompiledGrammar]) -> None:
        exc = future.exception()
        with self._lock:
            self._pending.pop(key, None)
            if key in self._cache:  # a timeout already recorded a refusal; keep the first answer
                return
            if exc is None:
                self._cache[key] = future.result()
            elif isinstance(exc, SchemaError):
                self._cache[key] = exc
            else:
                self._cache[key] = SchemaError(f"grammar compiler failed: {exc}")

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


def _string_patterns(fmt: OutputFormat) -> list[dict[str, Any]]:
    """Distinct {type: string, pattern, minLength, maxLength} specs found in the format's schemas."""
    found: dict[str, dict[str, Any]] = {}

    def visit(node: dict[str, Any]) -> None:
        # a pattern the grammar cannot express is not in it (normalize.relax): the answer is validated instead
        if isinstance(node.get("pattern"), str) and not unenforced_pattern(node["pattern"]):
            spec = {"type": "string", "pattern": node["pattern"]}
            for k in ("minLength", "maxLength"):
                if isinstance(node.get(k), int):
                    spec[k] = node[k]
            if spec.get("maxLength", 0) > PATTERN_MAX_LENGTH:      # as normalize.cap_pattern_lengths does
                spec["maxLength"] = max(PATTERN_MAX_LENGTH, spec.get("minLength", 0))
            found.setdefault(json.dumps(spec, sort_keys=True), spec)

    for schema in [fmt.schema, *fmt.tools.values()]:
        if isinstance(schema, dict):
            walk(schema, visit)
    return list(found.values())


def clean_reason(message: str) -> str:
    """llguidance's error as one short line for an API 400: no grammar echo, no internal option names."""
    text = message.strip()
    if text in _STOP_REASONS:
        return f"{text}: {_STOP_REASONS[text]}"
    m = re.search(r"failed to compile JSON schema: ", text)
    if m:
        text = text[m.end():]
    text = re.split(r"\n\s*\d+ \| ", text)[0]  # drop the Lark source echo
    text = re.sub(r"^(at )+\d+\(\d+\):\s*", "", text)       # a grammar-internal position means nothing to a user
    text = text.replace("<non-verbose/>", "").split("<state>")[0]  # drop parser-state dumps
    for prefix, better in _REWORDED.items():
        if text.startswith(prefix):
            text = better + text[text.find("\n"):] if "\n" in text else better
    text = " ".join(line.strip() for line in text.splitlines() if line.strip())
    return text if len(text) <= 300 else text[:297] + "..."
