"""Prompt compression of long inputs, on a small embedded model's token surprisal (LLMLingua's idea), offline.

The small model reads the long part of a prompt once, with logits at every position; a token's surprisal is
-log p(token | the text before it). Words (a token starting with a space or a line break starts a word) are
scored by their most surprising token; the least surprising words go first until `1 / target_ratio` of the
tokens remain. Structure, names and numbers always stay: words with a digit or a capital letter, line breaks,
and sentence punctuation. `protect` keeps whole parts verbatim: system messages, the question (the short
paragraphs at either end of the last user message: the instruction and the question), and fenced code.

Compression must pay for itself (`decide`): it reads every token of the part it compresses to remove
(1 - 1/ratio) of them. For a priced upstream the saving is removed tokens x the input price and the cost is the
tokens read x the compressor model's price; for the embedded engine both are time, removed tokens x the target's
measured prefill seconds per token against tokens read x the compressor's measured seconds per token. A
compressor as costly as the prefill it saves (the same small model on the same CPU) never pays, and is skipped.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

KEEP_WORD = re.compile(r"[0-9A-Z\n]|^\s*[.?!:;]+\s*$")
CODE = re.compile(r"```.*?(?:```|$)", re.DOTALL)
PROTECT_PARAGRAPH_CHARS = 300


@dataclass
class Scored:
    pieces: list[str]
    surprisal: np.ndarray           # one per piece; inf for a window's first token (no context to judge it)
    seconds: float


class Scorer:
    """Token surprisal from a small GGUF model, scored in an engine process of its own (engine/client.py; the
    gateway holds only the model's vocabulary): `window` tokens a decode, logits at every position."""

    def __init__(self, model: str, n_threads: int = 1, window: int = 512) -> None:
        from tokenomy.engine.client import EngineClient
        from tokenomy.engine.config import EngineConfig
        from tokenomy.models.catalog import resolve_gguf

        self.window = window
        self.engine = EngineClient(str(resolve_gguf(model)), EngineConfig(
            n_ctx=max(window, 256), max_running=1, max_retired=0, max_batch_tokens=window, n_threads=n_threads,
            kv_tier_ram_mb=0, speculative=False), name=f"compressor {model}")

    def tokenize(self, text: str) -> list[int]:
        return self.engine.vocab.tokenize(text, add_special=False, parse_special=False)

    def count(self, text: str) -> int:
        return len(self.tokenize(text)) if text else 0

    def score_ids(self, ids: list[int]) -> tuple[np.ndarray, float]:
        """(each token's surprisal, the model's seconds) (engine.core.Core.score)."""
        if not ids:
            return np.zeros(0, dtype=np.float32), 0.0
        surprisal, seconds = self.engine.score(ids, self.window)
        return np.asarray(surprisal, dtype=np.float32), float(seconds)

    def score(self, text: str) -> Scored:
        ids = self.tokenize(text)
        surprisal, seconds = self.score_ids(ids)
        pieces = [self.engine.vocab.piece(t).decode("utf-8", errors="replace") for t in ids]
        return Scored(pieces, surprisal, seconds)

    def close(self) -> None:
        self.engine.stop()


def compress_text(scored: Scored, ratio: float) -> str:
    """Keep the most surprising words, and every protected one, until len(pieces) / ratio tokens remain."""
    words: list[tuple[str, int, float, bool]] = []      # text, tokens, score, protected
    for piece, s in zip(scored.pieces, scored.surprisal, strict=True):
        prev = words[-1][0] if words else ""
        if not prev or (piece[:1].isspace() or "\n" in prev) and not prev.isspace() or prev.endswith("\n"):
            words.append((piece, 1, float(s), False))
        else:
            text, n, best, _ = words[-1]
            words[-1] = (text + piece, n + 1, max(best, float(s)), False)
    words = [(t, n, s, bool(KEEP_WORD.search(t)) or s == np.inf) for t, n, s, _ in words]
    budget = len(scored.pieces) / ratio
    kept = sum(n for _, n, _, _ in words)
    drop: set[int] = set()
    for i in sorted((i for i, w in enumerate(words) if not w[3]), key=lambda i: words[i][2]):
        if kept <= budget:
            break
        drop.add(i)
        kept -= words[i][1]
    return "".join(w[0] for i, w in enumerate(words) if i not in drop)


@dataclass
class Costs:
    """What one token costs each side, as measured or priced."""

    compressor_s_per_token: float
    target_prefill_s_per_token: float | None = None     # None: unknown, taken as the compressor's (same engine)
    target_usd_per_token: float = 0.0                   # a priced (not notional) upstream's input price
    compressor_usd_per_token: float = 0.0


@dataclass
class Decision:
    run: bool
    unit: str                # usd | s
    saving: float
    cost: float

    def __str__(self) -> str:
        return f"{'on' if self.run else 'off'} (saves {self.saving:.3g} {self.unit}, costs {self.cost:.3g})"


def decide(tokens: int, ratio: float, c: Costs) -> Decision:
    """Does compressing `tokens` at `ratio` pay for itself? See the module docstring."""
    removed = tokens * (1 - 1 / ratio)
    if c.target_usd_per_token > 0:
        saving, cost = removed * c.target_usd_per_token, tokens * c.compressor_usd_per_token
        return Decision(saving > cost, "usd", saving, cost)
    prefill = c.target_prefill_s_per_token if c.target_prefill_s_per_token is not None else c.compressor_s_per_token
    saving, cost = removed * prefill, tokens * c.compressor_s_per_token
    return Decision(saving > cost, "s", saving, cost)


def _split_question(text: str) -> tuple[str, str, str]:
    """(the instruction, the long middle, the question) of a message: the first paragraph when it is short,
    and up to three short last paragraphs, each side at most a quarter of the message."""
    paras = re.split(r"(\n\s*\n)", text)              # paragraphs at even indexes, separators at odd ones
    limit = min(PROTECT_PARAGRAPH_CHARS, len(text) // 4)
    lo = 2 if len(paras) > 2 and len(paras[0]) <= limit else 0
    hi, tail = len(paras), 0
    while hi - 2 > lo and len(paras) - hi < 6 and tail + len(paras[hi - 1]) <= len(text) // 4 \
            and len(paras[hi - 1]) <= PROTECT_PARAGRAPH_CHARS:
        tail += len(paras[hi - 1])
        hi -= 2
    return "".join(paras[:lo]), "".join(paras[lo:hi]), "".join(paras[hi:])


@dataclass
class Part:
    message: int
    text: str
    protected: bool


@dataclass
class Compression:
    messages: list[dict[str, Any]]
    tokens_read: int = 0          # tokens the compressor scored
    tokens_removed: int = 0
    seconds: float = 0.0
    parts: int = 0


def long_parts(messages: Sequence[dict[str, Any]], protect: Sequence[str], min_tokens: int,
               count: Any) -> list[list[Part]]:
    """Each message as parts, the long unprotected ones marked for compression."""
    last_user = max((i for i, m in enumerate(messages) if m.get("role") == "user"), default=-1)
    out: list[list[Part]] = []
    for i, m in enumerate(messages):
        content = m.get("content")
        if not isinstance(content, str) or (m.get("role") in ("system", "developer") and "system" in protect):
            out.append([Part(i, content if isinstance(content, str) else "", True)])
            continue
        pieces: list[Part] = []
        head, body, tail = _split_question(content) if i == last_user and "question" in protect else ("", content, "")
        if head:
            pieces.append(Part(i, head, True))
        pos = 0
        for mc in (CODE.finditer(body) if "code" in protect else ()):
            pieces.append(Part(i, body[pos:mc.start()], False))
            pieces.append(Part(i, mc.group(), True))
            pos = mc.end()
        pieces.append(Part(i, body[pos:], False))
        if tail:
            pieces.append(Part(i, tail, True))
        out.append([Part(p.message, p.text, p.protected or count(p.text) < min_tokens) for p in pieces if p.text])
    return out


def compress_messages(messages: list[dict[str, Any]], scorer: Scorer, ratio: float, protect: Sequence[str],
                      min_tokens: int, parts: list[list[Part]] | None = None) -> Compression:
    parts = parts if parts is not None else long_parts(messages, protect, min_tokens, scorer.count)
    res = Compression([dict(m) for m in messages])
    for i, ps in enumerate(parts):
        if all(p.protected for p in ps):
            continue
        texts = []
        for p in ps:
            if p.protected:
                texts.append(p.text)
                continue
            scored = scorer.score(p.text)
            short = compress_text(scored, ratio)
            res.tokens_read += len(scored.pieces)
            res.tokens_removed += len(scored.pieces) - scorer.count(short)
            res.seconds += scored.seconds
            res.parts += 1
            texts.append(short)
        res.messages[i]["content"] = "".join(texts)
    return res


@dataclass
class Compressor:
    """One scorer shared by the routes that compress with it, and its measured speed (an EWMA)."""

    scorer: Scorer
    s_per_token: float | None = None
    calls: int = 0
    history: list[float] = field(default_factory=list)

    def calibrate(self, tokens: int = 256) -> float:
        """Time one scoring pass over `tokens` tokens (the timing does not depend on the words)."""
        ids = list(range(1000, 1000 + min(tokens, self.scorer.window)))
        _, seconds = self.scorer.score_ids(ids)
        self.observe(seconds, len(ids))
        return seconds / len(ids)

    def observe(self, seconds: float, tokens: int) -> None:
        if tokens <= 0:
            return
        rate = seconds / tokens
        self.s_per_token = rate if self.s_per_token is None else 0.8 * self.s_per_token + 0.2 * rate
