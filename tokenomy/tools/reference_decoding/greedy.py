"""Reference constrained decoding: one sequence, greedy, on the engine's own ModelRunner.

This is the semantics the engine's sampler reproduces per sequence (see tokenomy/structured/constraint.py and
tokenomy/engine/engine.py's ``_postprocess``), small enough to read in one screen; tests and
``bench/structured.py`` use it to measure compliance and TPOT with and without a grammar. It drives
``tokenomy.engine.runner.ModelRunner`` (flash attention, unified KV, the engine's batch layout), so what it times
is the kernels the engine runs.

Fast-forward, as in the engine: after a token is sampled, the tokens the grammar then forces are appended too,
and the sampled token plus the forced run go into ONE ``llama_decode``; a constrained answer thus takes fewer
decode calls than it has tokens.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from tokenomy.engine.config import EngineConfig
from tokenomy.engine.runner import Chunk, ModelRunner
from tokenomy.structured.constraint import Constraint
from tokenomy.structured.token_tables import packaged_model_path

SLOT = 0  # the one llama.cpp sequence this runner uses


@dataclass
class Generation:
    text: str
    tokens: list[int]
    finish_reason: str  # "stop" (EOS or grammar finished) | "length"
    decode_calls: int  # llama_decode calls after the prompt
    forced: int  # tokens fed by fast-forward (not sampled)
    seconds: float  # from the end of the first step to the end (TPOT numerator)
    mask_seconds: float  # time inside Constraint.allowed()
    prompt_tokens: int
    first_tokens: int  # tokens emitted by the first step (more than one when it was fast-forwarded)
    cpu_seconds: float = 0.0  # process CPU time over the same span (steadier than wall time on a shared host)

    @property
    def tpot_ms(self) -> float:
        """Time per output token after the first step, in ms: ``seconds / (len(tokens) - first_tokens)``
        (NaN when nothing followed the first step)."""
        n = len(self.tokens) - self.first_tokens
        return self.seconds * 1000 / n if n > 0 else float("nan")

    @property
    def tpot_cpu_ms(self) -> float:
        """Process CPU time per output token after the first step, in ms (same span as ``tpot_ms``)."""
        n = len(self.tokens) - self.first_tokens
        return self.cpu_seconds * 1000 / n if n > 0 else float("nan")


class GreedyRunner:
    """A ModelRunner with one sequence slot, for single-sequence greedy generation."""

    def __init__(self, model_path: str | None = None, n_ctx: int = 4096, n_threads: int = 0,
                 n_batch: int = 512, flash_attn: bool = True) -> None:
        """Load the model (default: packaged SmolLM2); pair it with ``load_tokenizer(same path)``."""
        from tokenomy.structured.token_tables import _quiet_llama

        _quiet_llama()
        self.runner = ModelRunner(model_path or packaged_model_path(), EngineConfig(
            n_ctx=n_ctx, max_running=1, max_retired=0, max_batch_tokens=n_batch, n_threads=n_threads,
            flash_attn=flash_attn))
        self.n_ctx = self.runner.n_ctx
        self.n_vocab = self.runner.n_vocab
        self.eog = self.runner.eog

    def chat_prompt(self, system: str, user: str) -> str:
        """A system + user turn, ready for the assistant's answer."""
        return self.render([{"role": "system", "content": system}, {"role": "user", "content": user}])

    @staticmethod
    def render(messages: list[dict[str, str]]) -> str:
        """ChatML, the template SmolLM2-Instruct was trained with, ending with an open assistant turn."""
        turns = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)
        return turns + "<|im_start|>assistant\n"

    def tokenize(self, text: str) -> list[int]:
        """Token ids of ``text`` (special tokens such as ``<|im_start|>`` parsed, no BOS added)."""
        return self.runner.tokenize(text, add_special=False, parse_special=True)

    def piece(self, token: int) -> bytes:
        return self.runner.piece(token)

    def _decode(self, tokens: list[int], start: int) -> np.ndarray:
        """Feed ``tokens`` at positions start.. (in n_batch slices); logits after the last one."""
        n_batch = self.runner.cfg.max_batch_tokens
        for i in range(0, len(tokens), n_batch):
            part = tokens[i:i + n_batch]
            rows = self.runner.decode([Chunk(SLOT, part, start + i, logits=i + n_batch >= len(tokens))])
        return rows[0].copy()

    def generate(self, prompt: str, constraint: Constraint | None = None, max_tokens: int = 128,
                 ignore_eos: bool = False) -> Generation:
        """Greedy continuation of ``prompt``; with a constraint, masked and fast-forwarded.

        ``ignore_eos`` (free runs only) keeps decoding to exactly ``max_tokens`` tokens, so a free run can be
        timed over the same number of tokens at the same context length as a constrained one.
        """
        self.runner.clear()
        prompt_ids = self.tokenize(prompt)
        if len(prompt_ids) + max_tokens > self.n_ctx:
            raise ValueError(f"prompt of {len(prompt_ids)} tokens + {max_tokens} exceeds n_ctx {self.n_ctx}")
        logits = self._decode(prompt_ids, 0)
        out: list[int] = []
        calls = forced = 0
        mask_s = 0.0
        t_first: float | None = None
        c_first = 0.0
        first = 0
        finish = "length"
        if constraint is not None and (ff := constraint.forced()):
            # The grammar dictates the opening (e.g. '{"'): feed it before the first sample.
            ff = ff[:max_tokens]
            constraint.advance(ff)
            out += ff
            forced += len(ff)
            t_first, c_first, first = time.perf_counter(), time.process_time(), len(out)
            logits = self._decode(ff, len(prompt_ids))
            calls += 1
        while len(out) < max_tokens:
            if constraint is not None:
                t0 = time.perf_counter()
                logits[~constraint.allowed()] = -np.inf
                mask_s += time.perf_counter() - t0
            elif ignore_eos:
                logits[list(self.eog)] = -np.inf
            tok = int(np.argmax(logits))
            if tok in self.eog:
                finish = "stop"
                break
            step = [tok]
            if constraint is not None:
                constraint.advance(step)
                ff = constraint.forced()[: max_tokens - len(out) - 1]
                if ff:
                    constraint.advance(ff)
                    step += ff
                    forced += len(ff)
            out += step
            if t_first is None:
                t_first, c_first, first = time.perf_counter(), time.process_time(), len(out)
            if constraint is not None and constraint.is_done():
                finish = "stop"
                break
            if len(out) >= max_tokens:
                break
            logits = self._decode(step, len(prompt_ids) + len(out) - len(step))
            calls += 1
        seconds = time.perf_counter() - t_first if t_first is not None else 0.0
        cpu = time.process_time() - c_first if t_first is not None else 0.0
        text = b"".join(self.piece(t) for t in out).decode("utf-8", errors="replace")
        return Generation(text, out, finish, calls, forced, seconds, mask_s, len(prompt_ids), first, cpu)

    def close(self) -> None:
        self.runner.close()
