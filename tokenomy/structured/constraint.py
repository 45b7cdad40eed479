"""The per-sequence grammar constraint the engine's sampler consults at every decode step.

Protocol for one step (the engine owns the loop)::

    ff = c.forced()                 # tokens the grammar dictates: append them without sampling
    if ff: append(ff); c.advance(ff)
    else:  logits[~c.allowed()] = -inf; t = sample(logits); append([t]); c.advance([t])
    stop when c.is_done() (or EOS was sampled, which c.advance also records)

``allowed()`` lets EOS through exactly when the output so far is a complete document; ``is_complete()`` says
whether stopping now (e.g. at max_tokens) leaves a valid document.
The mask is computed by llguidance in Rust straight into a packed int32 bitmap (one bit per token) and
unpacked with one vectorised ``np.unpackbits``; there is no per-token Python work.

Loop breaker: a small model inside a long schema sometimes repeats one span verbatim until max_tokens (the same
array item, the same words in a string, the same nested object one level deeper). When the output ends with
``LOOP_REPEATS`` back-to-back copies of a span of at most ``LOOP_MAX_PERIOD`` tokens (two copies once the span
is ``LOOP_LONG_PERIOD`` tokens or more; at least ``LOOP_MIN_SPAN`` tokens in all), ``allowed()`` also bans
the one token that would continue the copy, as long as the grammar allows some other token. That only
removes tokens from the grammar's mask, so every answer still conforms to the grammar.

Wrap-up (opt-in, ``soft_limit``): past ``soft_limit`` tokens, the mask keeps only the allowed tokens of the
best tier that has any, so the answer takes the shortest way to its end (``wrap_up_ranks``):

    0  EOS (the document is complete)
    inside a JSON string:     1 ``"`` then only ``]`` / ``}``   2 ``"`` then no ``,`` ``[`` ``{``   3 ``"`` first
    outside:                  1 only ``]`` / ``}``   2 ``]`` / ``}`` first   3 ``,`` first, no ``[`` ``{``
                              4 no ``[`` ``{`` at all (a scalar, or a string that tier 1 will close)
    inside a string that cannot end yet (a ``format`` or ``pattern`` still unmet): the next byte of the
    shortest way to a closing ``"`` (``closing_path``)
    anything else: the grammar's mask unchanged.

So a string ends as soon as the grammar lets it, a container closes instead of taking another item or
property, a number ends at the next ``,`` when a required key is still due, and no new object or array is
opened unless the schema requires one. The grammar still decides what is legal (required keys, minItems), so
this only removes tokens from its mask: every answer still conforms.

``plan_wrap_up(max_tokens, share)`` sets the soft limit to ``min(share * max_tokens, max_tokens - L)``, with L
the length of the wrap-up walk from an empty answer (``closing_length``): a schema whose smallest answer is
long (many required keys) starts winding down early enough to finish, a small one keeps ``share``. When the
answer reaches a limit set by L, the walk is taken again from where the answer is, and wrap-up waits until that
walk no longer fits (``_defer``): it never starts before it is needed. After that
call the limit is also re-planned every ``REPLAN_EVERY`` tokens from the answer's current state (``_replan``),
and the first token may not open an object or array whose shortest completion cannot fit in ``max_tokens``
when the grammar offers something else there (``root_open_bans``: a root with no ``type`` takes a number as
well as an object with hundreds of required keys).
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
from cachetools import LRUCache, cached

from tokenomy.structured.grammar import CompiledGrammar, clean_reason
from tokenomy.structured.token_tables import TokenTables

LOOP_REPEATS = 3  # back-to-back copies of a span that count as a loop
LOOP_MAX_PERIOD = 128  # longest span (tokens) looked for
LOOP_MIN_SPAN = 12  # a loop covers at least this many tokens (so "0000" or "[1, 1, 1]" is left alone)
LOOP_LONG_PERIOD = 16  # a span at least this long counts as a loop after two copies (e.g. a repeated array item)

OTHER = 9  # wrap-up tier of tokens that end nothing
_CLOSERS = frozenset(b"]}")


def wrap_up_ranks(tables: TokenTables) -> np.ndarray:
    """int8 array of shape (2, vocab): each token's wrap-up tier outside (row 0) and inside (row 1) a JSON
    string, lower ends sooner (see the module docstring); computed once per tokenizer, kept in ``tables``."""
    if tables.wrap_up_ranks is None:
        tokenizer = tables.tokenizer
        out = np.full((2, tokenizer.vocab_size), OTHER, dtype=np.int8)
        for t in range(tokenizer.vocab_size):
            b = tokenizer.decode_bytes([t])
            if not b:
                continue
            opens = b"[" in b or b"{" in b
            if set(b) <= _CLOSERS:
                out[0, t] = 1
            elif b[0] in _CLOSERS:
                out[0, t] = 2
            elif b[:1] == b"," and not opens:
                out[0, t] = 3
            elif not opens:
                out[0, t] = 4
            if b[:1] == b'"':
                rest = b[1:]
                out[1, t] = 1 if set(rest) <= _CLOSERS else 2 if not (opens or b"," in rest or b'"' in rest) else 3
        tables.wrap_up_ranks = out
    return tables.wrap_up_ranks


REPLAN_EVERY = 32  # tokens between re-plans of the soft limit (each costs one walk to the end)
REPLAN_MARGIN = 1.25  # the model's own way to the end is longer than the walk's
# Re-plans run inside mask computation, on the engine's thread, where they stall every sequence in the batch:
# only grammars whose walk from an empty answer took at most this much CPU time are re-planned (most take a few
# ms; the slowest dev grammar takes about 0.5 s). The walk is timed without the tokenizer's one-time tables.
REPLAN_MAX_WALK_S = 0.02
CLOSING_ENTRIES = 512
CLOSING_CAP = 4096  # longest wrap-up walk taken to name a schema's minimum (a longer one is "more than" this)


def closing_length(grammar: CompiledGrammar, limit: int = CLOSING_CAP) -> int:
    """Tokens a document takes when every step is wrap-up's choice: the forced tokens, else the longest (or, in a
    second walk, the shortest) allowed token of the best tier, from an empty answer to its end; the fewer of the
    two. An estimate (an upper bound) of the shortest answer the grammar allows; ``limit`` when the walk does not
    end by then. Cached per grammar."""
    n = _closing_walk(grammar)[0]
    return limit if n is None else min(n, limit)


def build_tables(tables: TokenTables) -> None:
    """Compute every per-token table a walk reads (one pass over the vocabulary each, once per tokenizer), so
    that no walk pays for them and no grammar's timing counts them."""
    wrap_up_ranks(tables)
    tables.build()


@cached(LRUCache(CLOSING_ENTRIES), key=lambda grammar: grammar.key)
def _closing_walk(grammar: CompiledGrammar) -> tuple[int | None, float, str | None]:
    """(closing length, or None past CLOSING_CAP or when the walk failed; seconds the walk took; the grammar's
    error when it failed), cached per grammar.

    The seconds are what one re-plan (a longest-token walk) of this grammar costs and nothing else: the
    tokenizer's tables are built before the clock starts (the first grammar of a process would otherwise carry
    their one-time cost and be judged too slow to re-plan for the life of the process), and the clock is this
    thread's CPU time, so a walk that waited for the GIL or a busy core is not judged by the wait."""
    build_tables(grammar.tables)
    try:   # long tokens write required text in few steps; short ones close `{` at once: the fewer wins
        walk = Constraint(grammar, break_loops=False, soft_limit=0)
        started = time.thread_time()
        n = _walk_to_end(walk, CLOSING_CAP, strict=True)
        seconds = time.thread_time() - started
        n = min(n, _walk_to_end(Constraint(grammar, break_loops=False, soft_limit=0), CLOSING_CAP,
                                strict=True, longest=False))
    except ConstraintError as e:   # the grammar failed on its own shortest answer: nothing can satisfy it
        return None, 0.0, str(e)
    return (None if n >= CLOSING_CAP else n), seconds, None


class NoRoom(ValueError):
    """The shortest answer the schema allows (``need`` tokens, None: more than CLOSING_CAP) does not fit in the
    ``max_tokens`` the request leaves for it; the request should be refused before anything is generated."""

    def __init__(self, need: int | None, max_tokens: int) -> None:
        self.need, self.max_tokens = need, max_tokens
        size = f"more than {CLOSING_CAP}" if need is None else f"about {need}"
        super().__init__(f"the shortest answer this schema allows takes {size} tokens, but this request leaves "
                         f"{max_tokens} for the completion; raise max_tokens (or shorten the prompt) to at least "
                         f"{CLOSING_CAP if need is None else need}")


def start_constraint(grammar: CompiledGrammar, max_tokens: int, break_loops: bool = True,
                     wrap_up: float | None = None) -> Constraint:
    """The constraint for one answer of at most ``max_tokens``, wrap-up planned when ``wrap_up`` is a share.
    Raises NoRoom when even the shortest answer cannot fit, so an answer is refused instead of cut inside its
    JSON, and ConstraintError when the grammar fails on the way to any end (a required property that recurses
    forever). The first call for a grammar walks it (milliseconds; about 0.5 s for the slowest dev schemas)."""
    need, _, failed = _closing_walk(grammar)
    if failed is not None:
        raise ConstraintError(failed)
    if need is None or need > max_tokens:
        raise NoRoom(need, max_tokens)
    c = Constraint(grammar, break_loops=break_loops)
    if wrap_up is not None:
        c.plan_wrap_up(max_tokens, wrap_up)
    return c


@cached(LRUCache(CLOSING_ENTRIES), key=lambda grammar, max_tokens: (grammar.key, max_tokens))
def root_open_bans(grammar: CompiledGrammar, max_tokens: int) -> frozenset[int]:
    """First bytes (``{`` / ``[``) the answer's first token may not start with: opening that container leaves a
    document whose wrap-up walk (``_walk_to_end``), times REPLAN_MARGIN, does not end within ``max_tokens``,
    while the grammar allows some other first token. Empty when nothing needs banning. Cached per (grammar,
    max_tokens)."""
    return _find_root_bans(grammar, max_tokens)


def _find_root_bans(grammar: CompiledGrammar, max_tokens: int) -> frozenset[int]:
    start = Constraint(grammar, break_loops=False)
    if start.forced():
        return frozenset()
    mask = start.allowed()
    first = grammar.tables.first_bytes[: start.n_vocab]
    single = grammar.tables.lengths[: start.n_vocab] == 1
    bans: set[int] = set()
    for byte in (0x7B, 0x5B):  # { [
        opens = first == byte
        tokens = np.flatnonzero(mask & opens & single)
        if not len(tokens) or not (mask & ~opens).any():
            continue
        walk = Constraint(grammar, break_loops=False, soft_limit=0)
        try:
            walk.advance([int(tokens[0])])
        except ConstraintError:
            continue
        if (1 + _walk_to_end(walk, max_tokens)) * REPLAN_MARGIN >= max_tokens:  # the model's way is longer
            bans.add(byte)
    if not (mask & ~np.isin(first, list(bans))).any():
        return frozenset()  # nothing else is allowed: leave the model its best chance
    return frozenset(bans)


def _walk_to_end(walk: Constraint, limit: int, strict: bool = False, longest: bool = True) -> int:
    """Advance ``walk`` (a wrap-up-from-now constraint) by wrap-up's choices, the longest allowed token of the
    best tier each step (``longest=False``: the shortest), until its document ends; the tokens taken, or
    ``limit`` when it has not ended by then (or the grammar failed: ``strict`` raises that instead)."""
    lengths = walk.grammar.tables.lengths[: walk.n_vocab]
    if not longest:
        lengths = -np.where(lengths > 0, lengths, np.iinfo(np.int32).max)
    eos = walk.grammar.tokenizer.eos_token
    n = 0
    try:
        while n < limit and not walk.is_done():
            ff = walk.forced()
            if not ff:
                allowed = np.flatnonzero(walk.allowed())
                if not len(allowed):
                    break
                ff = [int(allowed[np.argmax(lengths[allowed])])]  # e.g. '"}]' rather than '"', '}', ']'
                if ff[0] == eos:
                    break
            walk.advance(ff)
            n += len(ff)
    except ConstraintError:
        if strict:
            raise
        return limit
    return min(n, limit) if walk.is_complete() else limit


CLOSE_SEARCH_TRIES = 8192  # byte extensions closing_path may try before it gives up (about 1 us each)
CLOSE_RETRY = 8  # tokens written before a search that found nothing is tried again
CLOSE_SEARCH_DEPTH = 64    # longest byte path it looks for
CLOSE_SEARCH_WIDTH = 32    # most paths it keeps per length
CLOSE_STEER_BYTES = 16     # a longer searched path is not steered to: a string that only needs length (minLength)
                           # ends sooner in the long tokens the mask already allows than one byte at a time


def _byte_class(b: int) -> int:
    """Bytes of one class (lower-case letters, upper-case letters, digits) stand for each other in the search;
    any other byte is its own class."""
    ch = chr(b)
    return -1 if ch.islower() else -2 if ch.isupper() else -3 if ch.isdigit() else b


def closing_path(matcher: Any, byte_tokens: dict[int, int], quote: int,
                 examples: Sequence[bytes] = (), max_bytes: int = CLOSE_SEARCH_DEPTH) -> list[int] | None:
    """Single-byte tokens after which the grammar allows the ``quote`` token; None when none turns up. Steers a
    string whose ``format`` or ``pattern`` is not met yet to a valid end.

    First the shortest of ``examples`` (matches of the schema's patterns, which complete an unanchored pattern
    written after anything) that the grammar takes from here; else a search for the fewest bytes, of at most
    ``max_bytes`` within CLOSE_SEARCH_TRIES tries: breadth-first over bytes (never a backslash, so the
    quote is never an escaped one), tried with ``matcher.validate_tokens`` so the matcher's state is not
    changed. A path's state is the set of bytes valid
    after it: at each length, paths in the same state count as one, one byte per class is followed from each,
    and paths from states not met at any shorter length go first (a Kleene star such as an email's local part
    keeps its state, so the search moves past it to the ``@``)."""
    for ex in examples:
        path = [byte_tokens.get(b, -1) for b in ex]
        if -1 not in path and matcher.validate_tokens([*path, quote]) == len(path) + 1:
            return path
    if max_bytes <= 0:
        return None
    candidates = [(b, t) for b, t in byte_tokens.items() if b != 0x5C]
    frontier: list[list[int]] = [[]]
    tries = 0
    met: set[tuple[int, ...]] = set()
    for _ in range(max_bytes):
        states: set[tuple[int, ...]] = set()
        fresh: list[list[int]] = []
        stale: list[list[int]] = []
        for path in frontier:
            valid = []
            for b, t in candidates:
                tries += 1
                if matcher.validate_tokens([*path, t]) == len(path) + 1:
                    valid.append((b, t))
            if tries > CLOSE_SEARCH_TRIES:
                return None
            state = tuple(b for b, _ in valid)
            if state in states:
                continue
            states.add(state)
            if path and matcher.validate_tokens([*path, quote]) == len(path) + 1:
                return path
            nxt = stale if state in met else fresh
            classes: set[int] = set()
            for b, t in valid:
                if _byte_class(b) not in classes:
                    classes.add(_byte_class(b))
                    nxt.append([*path, t])
        met |= states
        frontier = (fresh + stale)[:CLOSE_SEARCH_WIDTH]
        if not frontier:
            return None
    return None


def loop_continuation(history: list[int], repeats: int = LOOP_REPEATS, max_period: int = LOOP_MAX_PERIOD,
                      min_span: int = LOOP_MIN_SPAN) -> int | None:
    """The token that would extend a verbatim loop at the end of ``history``, or None.

    A loop of period p: the last ``max(r * p, min_span)`` tokens satisfy ``h[i] == h[i - p]``, with r =
    ``repeats``, or 2 once p >= LOOP_LONG_PERIOD; the token that continues it is ``h[-p]``. The shortest such p
    wins.
    """
    n = len(history)
    if n < min_span:
        return None
    tail = np.asarray(history[-(max_period * repeats + min_span):], dtype=np.int64)
    # Only periods p with tail[-1] == tail[-1 - p] can qualify: one vectorised compare finds them.
    back = tail[-2:-max_period - 2:-1]
    for p in (np.flatnonzero(back == tail[-1]) + 1).tolist():
        span = max((repeats if p < LOOP_LONG_PERIOD else min(repeats, 2)) * p, min_span)
        if span > len(tail):
            continue
        window = tail[-span:]
        if np.array_equal(window[p:], window[:-p]):
            return int(tail[-p])
    return None


class ConstraintError(RuntimeError):
    """The grammar cannot go on: a token outside the mask was appended (a sampler bug), or llguidance hit a
    lexer/parser limit mid-answer (rare: compile probes the usual causes; a schema whose required properties
    recurse forever is one). End the sequence with an error, blamed on the schema (`error_code`)."""

    error_code = "invalid_schema"


class Constraint:
    """One sequence's position in a compiled grammar."""

    def __init__(self, grammar: CompiledGrammar, break_loops: bool = True, soft_limit: int | None = None) -> None:
        self.grammar = grammar
        self.break_loops = break_loops
        self.soft_limit = soft_limit  # tokens after which the mask prefers closing tokens (None: never)
        self.max_tokens: int | None = None  # set by plan_wrap_up: then the soft limit is re-planned as it goes
        self.root_bans: frozenset[int] = frozenset()  # first bytes the first token may not start with
        self.replans = 0  # times _replan moved the soft limit earlier
        self.strict = False  # past the soft limit with no room to spare: follow the walk to the end exactly
        self.strict_past_soft_limit = False  # set by plan_wrap_up for a grammar too slow to re-plan
        self._next_replan = REPLAN_EVERY
        self._share_limit = 0   # share * max_tokens, set by plan_wrap_up
        self._deferrable = False  # the soft limit is the walk's from an earlier state: checked again when reached
        self._last_need: int | None = None   # the walk to the end at the last check past the soft limit
        self.wrapups = 0  # masks narrowed by the wrap-up rule
        self.steered = 0  # of those, steps steered toward the end of a string that could not end yet
        self._path: list[int] = []  # the rest of the steered path, valid while len(history) == _path_at
        self._path_at = -1
        self._search_after = 0  # no closing search before this many tokens (one found nothing lately)
        self._in_string = False  # JSON lexer state of the text so far (for the wrap-up rule)
        self._escape = False
        self.history: list[int] = []  # tokens consumed so far (the loop breaker reads it)
        self.loops_broken = 0
        self.n_vocab = grammar.n_vocab
        self._matcher = grammar.matcher()
        self._bits = np.zeros((self.n_vocab + 31) // 32, dtype=np.int32)
        self.steps = 0  # masks computed
        self.forced_tokens = 0  # tokens returned by forced(), i.e. fed without sampling

    def plan_wrap_up(self, max_tokens: int, share: float) -> int:
        """Set and return the soft limit for an answer of at most ``max_tokens``: ``share * max_tokens``, or
        earlier when the shortest answer (``closing_length``) would not fit in what is left after it. A grammar
        too slow to re-plan keeps the re-planning margin from the start (REPLAN_MARGIN, plus REPLAN_EVERY) and
        is strict from the soft limit on."""
        need, walk_s, _ = _closing_walk(self.grammar)
        need = max_tokens if need is None else min(need, max_tokens)
        replans = walk_s <= REPLAN_MAX_WALK_S  # see REPLAN_MAX_WALK_S
        if not replans:  # nothing will catch a detour later: leave the margin a re-plan would have kept
            need = min(max_tokens, int(need * REPLAN_MARGIN) + REPLAN_EVERY)
        self._share_limit = int(share * max_tokens)
        self.soft_limit = max(0, min(self._share_limit, max_tokens - need))
        self.max_tokens = max_tokens if replans else None
        self._deferrable = replans and self.soft_limit < self._share_limit
        self.strict_past_soft_limit = not replans   # no walk will tell when to turn strict: be strict at once
        self.root_bans = root_open_bans(self.grammar, max_tokens)
        return self.soft_limit

    def closing_need(self, limit: int) -> int:
        """Tokens wrap-up would take from here to the end of the document (``_walk_to_end`` on a copy of this
        constraint's state), or ``limit``."""
        walk = Constraint(self.grammar, break_loops=False, soft_limit=0)
        walk._matcher = self._matcher.deep_copy()
        walk._in_string, walk._escape = self._in_string, self._escape
        return _walk_to_end(walk, limit)

    def _replan(self) -> None:
        """Every REPLAN_EVERY tokens before the soft limit: start wrapping up now if what is left of
        ``max_tokens`` no longer covers the walk to the end from here (with REPLAN_MARGIN and one interval of
        slack). Catches what the plan from an empty answer cannot see: an object the model chose to open whose
        required keys alone fill the budget, or long optional detours. Past the soft limit, every
        REPLAN_EVERY / 4 tokens: once the walk to the end (plus that interval) no longer fits in what is left,
        or has grown since the last check (a detour), switch to ``strict``, where the mask keeps only the walk's
        own token, so the answer ends in time."""
        n = len(self.history)
        if self.max_tokens is None or self.soft_limit is None or self.strict:
            return
        if self._deferrable and n >= self.soft_limit:
            self._defer(n)
        if n < self._next_replan:
            return
        left = self.max_tokens - n
        if n < self.soft_limit:
            self._next_replan = min(n + REPLAN_EVERY, self.soft_limit)   # and once more at the soft limit
            if self.closing_need(left) * REPLAN_MARGIN + REPLAN_EVERY >= left:
                self.soft_limit = self._next_replan = n
                self.replans += 1
            return
        self._next_replan = n + REPLAN_EVERY // 4
        # Past the soft limit the way to the end should shrink. When it grows instead, the model is taking a
        # detour (in WashingtonPost wp_83 it added one optional key after another before the one still required:
        # 55, 81, 58, 73, 50 tokens to go, then 188 with 95 left, and the answer was cut at max_tokens), so the
        # walk takes over at once rather than when the detour no longer fits, which can be too late.
        need = self.closing_need(left)
        if need + REPLAN_EVERY // 4 >= left or (self._last_need is not None and need > self._last_need):
            self.strict = True
        self._last_need = need

    def _defer(self, n: int) -> None:
        """At a soft limit set by the walk from an earlier state (the plan's, from an empty answer): wrap-up is
        due only once the walk from here, times REPLAN_MARGIN, no longer fits in what is left; until then the
        limit moves to where it would be due if the answer made no progress (never past the share's limit).
        So an answer that is nearly written when the plan's limit comes is left to end on its own."""
        assert self.max_tokens is not None
        due = self.max_tokens - math.ceil(self.closing_need(self.max_tokens - n) * REPLAN_MARGIN)
        if due <= n:
            self._deferrable = False
            return
        self.soft_limit = min(self._share_limit, due)
        self._deferrable = self.soft_limit == due < self._share_limit
        self._next_replan = min(n + REPLAN_EVERY, self.soft_limit)

    def bitmask(self) -> np.ndarray:
        """Packed mask for the next token: int32 words, bit ``t % 32`` of word ``t // 32`` set iff allowed."""
        self._matcher.unsafe_compute_mask_ptr(self._bits.ctypes.data, self._bits.nbytes)
        self.steps += 1
        return self._bits

    def allowed(self) -> np.ndarray:
        """Bool mask of shape (n_vocab,) for the next token: the grammar's, minus a loop's continuation."""
        packed = self.bitmask().view(np.uint8)
        mask = np.unpackbits(packed, count=self.n_vocab, bitorder="little").view(np.bool_)
        if self.break_loops and not self.strict:
            tok = loop_continuation(self.history)
            if tok is not None and tok < self.n_vocab and mask[tok] and np.count_nonzero(mask) > 1:
                mask[tok] = False
                self.loops_broken += 1
        if self.root_bans and not self.history:
            keep = mask & ~np.isin(self.grammar.tables.first_bytes[: self.n_vocab], list(self.root_bans))
            if keep.any():
                mask = keep
        self._replan()
        if self.soft_limit is not None and len(self.history) >= self.soft_limit:
            self._wrap_up(mask)
            if self.strict or self.strict_past_soft_limit:   # the walk's choice: the longest of the best tier
                ids = np.flatnonzero(mask)
                if len(ids) > 1:
                    keep = ids[np.argmax(self.grammar.tables.lengths[ids])]
                    mask[:] = False
                    mask[keep] = True
        return mask

    def _wrap_up(self, mask: np.ndarray) -> None:
        """Narrow ``mask`` in place to the best wrap-up tier it allows (see the module docstring)."""
        eos = self.grammar.tokenizer.eos_token
        if eos < self.n_vocab and mask[eos]:
            mask[:] = False
            mask[eos] = True
            self.wrapups += 1
            return
        rank = wrap_up_ranks(self.grammar.tables)[int(self._in_string), : self.n_vocab]
        best = int(np.where(mask, rank, OTHER).min())
        if best < OTHER:
            mask &= rank == best
            self.wrapups += 1
        elif self._in_string:
            n = len(self.history)
            if (n != self._path_at or not self._path) and n >= self._search_after:   # off any path found before
                tables = self.grammar.tables
                quote = tables.byte_tokens.get(0x22)
                self._path = (None if quote is None else closing_path(
                    self._matcher, tables.byte_tokens, quote, self.grammar.pattern_examples,
                    max_bytes=CLOSE_STEER_BYTES)) or []
                if not self._path:
                    self._search_after = n + CLOSE_RETRY
            t = self._path.pop(0) if self._path else None
            if t is not None and t < self.n_vocab and mask[t]:
                mask[:] = False
                mask[t] = True
                self._path_at = len(self.history) + 1   # the rest of the path holds if exactly t comes next
                self.wrapups += 1
                self.steered += 1

    def _track(self, tokens: list[int]) -> None:
        """Follow whether the text so far ends inside a JSON string (quotes and backslash escapes)."""
        for byte in self.grammar.tokenizer.decode_bytes(tokens):
            if self._escape:
                self._escape = False
            elif self._in_string and byte == 0x5C:
                self._escape = True
            elif byte == 0x22:
                self._in_string = not self._in_string

    def forced(self) -> list[int]:
        """Tokens the grammar forces next (may be empty); the caller appends them and calls ``advance``."""
        if self._matcher.is_stopped():
            return []
        ff = list(self._matcher.compute_ff_tokens())
        self.forced_tokens += len(ff)
        return ff

    def advance(self, tokens: list[int]) -> None:
        """Consume tokens actually appended to the sequence; raises ConstraintError if one is not allowed."""
        if not tokens:
            return
        if not self._matcher.consume_tokens(list(tokens)):
            raise ConstraintError(clean_reason(self._matcher.get_error()) or f"tokens {tokens} rejected")
        self.history.extend(tokens)
        if self.soft_limit is not None:
            self._track(tokens)

    def is_done(self) -> bool:
        """The grammar accepts no further token except EOS: the answer is finished (or the matcher failed)."""
        return self._matcher.is_stopped()

    def is_complete(self) -> bool:
        """The output so far is a complete valid document (stopping here is allowed)."""
        return self._matcher.is_accepting()

    @property
    def error(self) -> str:
        """Why the grammar stopped in error, or empty."""
        return clean_reason(self._matcher.get_error()) if self._matcher.is_error() else ""
