"""Drafts from a second, smaller model with the target's vocabulary: speculative decoding's classic form.

Each sequence that drafts gets a slot (a KV stream) in the draft model's own context, holding the KV of a prefix
of the sequence's tokens (`fed`). `propose` first cuts every slot back to the part of `fed` its sequence still
starts with (verification kept only the accepted drafts), then runs rounds of one batched `llama_decode`: the
first feeds each sequence the tokens its slot has not seen (all of the prompt the first time, in chunks of
max_batch_tokens), every later one the token the previous round chose; each round takes the argmax of every
sequence's logits row. A sequence that asks for k tokens takes part in k rounds, so a step's drafting costs about
as many draft steps as its longest draft: `seconds(k)` predicts that from the draft's own measured steps, and
`catch_up_seconds` what feeding a sequence's unseen tokens costs; `cost.plan` weighs both against the
target's step (the engine spreads a catch-up over the answer's next CATCH_UP_HORIZON tokens (tuning.py) at most).

Drafts are greedy: a greedy request then accepts exactly the drafted tokens the target would have chosen, and a
sampled one treats the draft as a point mass (SequenceOutput's verification), which keeps the target distribution.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from tokenomy.engine import tuning
from tokenomy.engine.config import EngineConfig
from tokenomy.engine.kv.prefix_cache import common_length
from tokenomy.engine.runner import Chunk, ModelRunner
from tokenomy.engine.spec.cost import StepCost
from tokenomy.engine.vocab import Vocab


class VocabMismatch(ValueError):
    pass


@dataclass
class _Slot:
    slot: int
    fed: list[int] = field(default_factory=list)     # tokens whose KV the slot holds, positions 0..len-1
    used: float = 0.0


class DraftModel:
    def __init__(self, path: str, cfg: EngineConfig, target: Vocab) -> None:
        """A context for cfg.max_running drafting sequences, each stream as long as the target's streams would be
        with the same cells; refuses a model whose vocabulary is not the target's token for token."""
        dcfg = cfg.model_copy(update={"n_ctx": cfg.kv_cells, "max_model_len": None, "max_retired": 0,
                                      "kv_unified": False, "draft_model": None, "prefix_caching": False,
                                      "kv_tier_ram_mb": 0})
        self.runner = ModelRunner(path, dcfg)
        if not self.runner.same_tokens(target):
            self.runner.close()
            raise VocabMismatch(f"draft model {path} has another vocabulary than the model it drafts for "
                                f"({self.runner.n_vocab} vs {target.n_vocab} tokens, or different pieces): "
                                "speculative decoding needs the same tokenizer")
        self.cost = StepCost()
        self._slots: dict[int, _Slot] = {}
        self._free = list(range(dcfg.n_seqs))

    # ---- cost ------------------------------------------------------------------------------------------
    def calibrate(self) -> None:
        """Measure a draft step of one token, of one token per slot and of a chunk of prompt (on the calling
        thread: the engine's, when it starts)."""
        free = sorted(self._free)
        if not free:
            return
        tok = self.runner.bos if self.runner.bos >= 0 else 0
        size = min(tuning.CALIBRATE_CHUNK, self.runner.cfg.max_batch_tokens)
        for width in (1, len(free)) * 3:
            rows = free[:width]
            t = time.perf_counter()
            self.runner.decode([Chunk(s, [tok], 0, 1) for s in rows])
            self.cost.observe(width, time.perf_counter() - t)
            for s in rows:
                self.runner.remove(s)
        t = time.perf_counter()           # a chunk of prompt: catching up costs about its multiple
        self.runner.decode([Chunk(free[0], [tok] * size, 0, 1)])
        self.cost.observe(size, time.perf_counter() - t)
        self.runner.remove(free[0])

    def seconds(self, k: int, width: int) -> float | None:
        """Predicted seconds to draft up to k tokens for `width` sequences: k rounds of `width` tokens."""
        if k <= 0:
            return 0.0
        t = self.cost.predict(width)
        return None if t is None else k * t

    def catch_up_seconds(self, key: int, tokens: list[int]) -> float:
        """Predicted seconds to feed the draft model the tokens of sequence `key` its slot has not seen, beyond
        the one each round feeds anyway (all of its prompt the first time)."""
        s = self._slots.get(key)
        n = len(tokens) - 1 - (min(common_length(s.fed, tokens), len(tokens) - 1) if s else 0)
        if n <= 0:
            return 0.0
        size = self.runner.cfg.max_batch_tokens
        full, rest = divmod(n, size)
        last = (self.cost.predict(rest) or 0.0) if rest else 0.0
        return full * (self.cost.predict(size) or 0.0) + last

    # ---- drafting --------------------------------------------------------------------------------------
    def propose(self, requests: list[tuple[int, list[int], int]]) -> dict[int, list[int]]:
        """Drafts for (sequence id, its tokens, k) requests, by sequence id: up to k tokens each that follow its
        tokens. A sequence is left out when no slot is free or its tokens and draft would not fit the slot."""
        now = time.perf_counter()
        todo: list[tuple[int, _Slot, list[int], int]] = []
        wanted = {key for key, _, _ in requests}
        for key, tokens, k in requests:
            if k <= 0 or not tokens or len(tokens) + k > self.runner.n_ctx_seq:
                continue
            s = self._slots.get(key) or self._take_slot(key, wanted)
            if s is None:
                continue
            keep = min(common_length(s.fed, tokens), len(tokens) - 1)     # the last token is always fed: its logits
            if keep < len(s.fed):
                self.runner.remove(s.slot, keep)
                del s.fed[keep:]
            s.used = now
            todo.append((key, s, tokens[keep:], k))
        out: dict[int, list[int]] = {key: [] for key, _, _, _ in todo}
        if not todo:
            return out
        # round 1: catch up, in chunks that fit a batch; a sequence's logits come with its last new token
        left = {key: new for key, _, new, _ in todo}
        slot = {key: s for key, s, _, _ in todo}
        while left:
            budget, chunks, keys = self.runner.cfg.max_batch_tokens, [], []
            for key in list(left):
                if budget <= 0:
                    break
                s, new = slot[key], left[key]
                take = new[:budget]
                last = len(take) == len(new)
                chunks.append(Chunk(s.slot, take, len(s.fed), 1 if last else 0))
                s.fed.extend(take)
                budget -= len(take)
                if last:
                    keys.append(key)
                    del left[key]
                else:
                    left[key] = new[len(take):]
            rows = self._decode(chunks)
            for key, tok in zip(keys, rows.argmax(axis=1).tolist(), strict=True):
                out[key].append(tok)
        # later rounds: each feeds the token the last round chose
        want = {key: k for key, _, _, k in todo}
        while active := [key for key in out if len(out[key]) < want[key]]:
            chunks = []
            for key in active:
                s = slot[key]
                chunks.append(Chunk(s.slot, [out[key][-1]], len(s.fed), 1))
                s.fed.append(out[key][-1])
            rows = self._decode(chunks)
            for key, tok in zip(active, rows.argmax(axis=1).tolist(), strict=True):
                out[key].append(tok)
        return out

    def release(self, key: int) -> None:
        """The sequence ended: its slot is free again."""
        s = self._slots.pop(key, None)
        if s is not None:
            self.runner.remove(s.slot)
            self._free.append(s.slot)

    def close(self) -> None:
        self.runner.close()

    def _take_slot(self, key: int, wanted: set[int]) -> _Slot | None:
        if not self._free:      # a slot of a sequence not drafting now (preempted, or finished unseen)
            idle = [k for k in self._slots if k not in wanted]
            if not idle:
                return None
            self.release(min(idle, key=lambda k: self._slots[k].used))
        s = self._slots[key] = _Slot(self._free.pop())
        return s

    def _decode(self, chunks: list[Chunk]) -> np.ndarray:
        t = time.perf_counter()
        rows = self.runner.decode(chunks)
        self.cost.observe(sum(len(c.tokens) for c in chunks), time.perf_counter() - t)
        return rows

