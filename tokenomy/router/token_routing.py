"""Token-level routing: a small embedded model writes the answer; where it is unsure of its next token, a larger
model writes the next segment from the text so far, and the small model goes on from there.

A token-routed request, file by file (this module is step 3):
1. `config.TokenRouteSettings`: the route's `token:` settings, the one settings class (validated with its
   `RouteSpec`: two models, the small one embedded).
2. `pipeline/route.py`, `Route._token`: a request with tools or response_format goes whole to the large model
   (one model's grammar must write all of it); any other gets the route's `TokenRouter` (built on the route's
   first such request, and again after a config reload) in `ctx.token_router`, and candidates [small, large].
   The generate stage (`pipeline/generate.py`) streams the small model's turn through that router; the large
   model stays the fallback that answers whole when the small one cannot serve.
3. Here, `TokenRouter.stream`: the loop below.
4. `backends/embedded.py` turns a part's `TokenRouting` (generation.py: the exact prompt ids, the signal, the
   handover threshold) into the engine's SamplingParams; `engine/sequence_output.py` ends the sequence with
   finish_reason "handover" before sampling a token whose signal is below the threshold
   (`engine/sampler.confidence` computes the signal).
5. `engine/stops.py`, `StopScan`: stop strings, matched here over the whole answer across the models' pieces,
   and by the engine within each part.
The threshold for a target share of large-model tokens: `tools/router_training/token_threshold.py` (`tokenomy router
calibrate --token`); figures: `bench/token_routing.py`, docs/token_routing.md.

How one answer runs:
- The small model (always embedded: its engine judges every step's logits) generates with a confidence signal
  (`top1`, `margin` or `entropy`) and a threshold. Below the threshold its sequence ends with finish_reason
  "handover", the unsure token not sampled; its KV stays in the prefix cache.
- The large model, embedded or any OpenAI-compatible upstream through `/v1/completions`, gets the conversation in
  its own prompt format plus the answer so far, and writes up to `max_segment_tokens` tokens; `segment: word`
  keeps them up to the end of their first word (the next one would start a new word), `segment: token` keeps one.
- The segment is text: it is tokenized with the small model's tokenizer and appended to the small model's tokens,
  and the small model continues from them (its earlier tokens come from the prefix cache, so only the segment
  is prefilled). Models with different tokenizers therefore meet at text boundaries; a word boundary is where
  both tokenizers agree best (docs/token_routing.md says what the handover costs).
- If the large model fails, the small model finishes the answer alone: one model's outage degrades quality, never
  the answer.

Everything the client sees is one stream. Usage sums both models and keeps each model's own usage in `parts`,
each priced at its own model's price; the large model's prompt re-reads are in its prompt tokens (cached where its
server reports a prefix-cache hit).
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from tokenomy.backends.base import BackendError
from tokenomy.config import TokenRouteSettings
from tokenomy.engine.stops import StopScan
from tokenomy.generation import Delta, GenRequest, TokenRouting, Usage


@dataclass
class Tally:
    """What one answer's routing did: tokens in the answer by who wrote them (the small model's tokenization),
    handovers, and each model's usage."""

    small_tokens: int = 0
    large_tokens: int = 0
    handovers: int = 0
    large_failed: str | None = None
    usage: dict[str, Usage] = field(default_factory=dict)

    def add(self, model: str, u: Usage | None) -> None:
        if u is None:
            return
        s = self.usage.setdefault(model, Usage())
        s.prompt_tokens += u.prompt_tokens
        s.cached_tokens += min(u.cached_tokens, u.prompt_tokens)
        s.completion_tokens += u.completion_tokens
        s.counted = s.counted or u.counted

    @property
    def large_share(self) -> float:
        total = self.small_tokens + self.large_tokens
        return self.large_tokens / total if total else 0.0


def cut_segment(text: str, segment: str) -> str:
    """The part of the large model's text that is kept: all of it for `token`; for `word`, up to the end of its
    first word (leading whitespace and any punctuation attached to the word included)."""
    if segment == "token":
        return text
    i = len(text) - len(text.lstrip())
    j = i
    while j < len(text) and not text[j].isspace():
        j += 1
    return text[:j] if j < len(text) else text


class TokenRouter:
    """A Backend over two: `small` (an EmbeddedBackend) and `large` (any Backend), routing each answer's tokens
    by `settings`. Built once per route: it holds no state of any one answer."""

    def __init__(self, small: Any, large: Any, settings: TokenRouteSettings, on_done: Any = None) -> None:
        self.small, self.large, self.s = small, large, settings
        self.name = small.name
        self.large_prefix = large_prefix(large, settings.template, small)
        self.on_done = on_done          # called with the Tally and finish reason of every answer that ends

    def count_tokens(self, req: GenRequest) -> Any:
        return self.small.count_tokens(req)

    def expected_wait_s(self) -> float:
        return self.small.expected_wait_s()

    async def health(self) -> bool:
        return await self.small.health()

    async def close(self) -> None:      # the two backends are the registry's to close
        return None

    async def stream(self, req: GenRequest) -> AsyncIterator[Delta]:
        s, small = self.s, self.small
        prompt = small.prompt_tokens(req)
        room = small.check_length(prompt, req.params)
        budget = min(req.params.get("max_tokens") or room, room)
        stop = req.params.get("stop") or []
        scan = StopScan([stop] if isinstance(stop, str) else list(stop))
        prefix = self.large_prefix(req)
        tally = Tally()
        ids = list(prompt)
        answer = ""                         # the whole answer text so far (what the large model continues)
        after = 0                           # the small model may not hand over before this many tokens
        first_at: float | None = None
        queue_s = 0.0
        t0 = time.perf_counter()
        finish = "length"
        stopped_by: str | None = None       # a stop string the small model's engine matched within its part
        try:
            while True:
                left = budget - tally.small_tokens - tally.large_tokens
                if left <= 0:
                    finish = "length"
                    break
                routing = TokenRouting(prompt_ids=list(ids), signal=s.signal, handover_after=after,
                                       handover_below=None if tally.large_failed else s.threshold)
                sreq = dataclasses.replace(req, kind="completion", params={**req.params, "max_tokens": left},
                                           token_routing=routing, counted=None)
                end = None
                fed, wrote = len(ids), 0
                part = small.stream(sreq)
                async for d in part:
                    ids += d.token_ids
                    wrote += len(d.token_ids)
                    tally.small_tokens += len(d.token_ids)
                    answer += d.text
                    out, hit = scan.feed(d.text)
                    if out or d.logprobs:
                        if first_at is None:
                            first_at = time.perf_counter()
                        yield Delta(text=out, logprobs=d.logprobs, confidence=d.confidence)
                    if hit:                     # a stop string across pieces: end this part, bill what it did
                        await part.aclose()
                        tally.add(small.name, Usage(prompt_tokens=fed, completion_tokens=wrote, counted=True))
                        end = "stop"
                        break
                    if d.finish_reason is not None:
                        end, stopped_by = d.finish_reason, d.stop_sequence
                        if d.usage is not None:
                            tally.add(small.name, d.usage)
                            if tally.handovers == 0:
                                queue_s = d.usage.queue_s
                if end != "handover":
                    finish = end or "stop"
                    break
                seg, seg_end = await self._segment(req, prefix, answer, left, tally)
                after = 0
                if seg is None:                 # the large model failed: the small model finishes alone
                    continue
                if not seg:
                    if seg_end == "stop":       # the large model ends the answer here
                        finish = "stop"
                        break
                    after = 1                   # it wrote nothing useful: the small model takes one step
                    continue
                tally.handovers += 1
                seg_ids = small.engine.tokenizer.encode(seg, add_special=False)
                ids += seg_ids
                tally.large_tokens += len(seg_ids)
                answer += seg
                out, hit = scan.feed(seg)
                if out:
                    if first_at is None:
                        first_at = time.perf_counter()
                    yield Delta(text=out)
                if hit:
                    finish = "stop"
                    break
        except BaseException:
            if self.on_done is not None:
                self.on_done(tally, None)
            raise
        rest, _ = scan.feed("", final=True)
        parts = [(name, u) for name, u in tally.usage.items()]
        total = Usage(prompt_tokens=sum(u.prompt_tokens for _, u in parts),
                      completion_tokens=sum(u.completion_tokens for _, u in parts),
                      cached_tokens=sum(u.cached_tokens for _, u in parts),
                      counted=any(u.counted for _, u in parts), queue_s=queue_s,
                      ttft_s=(first_at - t0) if first_at is not None else None,
                      e2e_s=time.perf_counter() - t0, parts=parts, handovers=tally.handovers)
        if self.on_done is not None:
            self.on_done(tally, finish)
        yield Delta(text=rest, finish_reason=finish, usage=total,
                    stop_sequence=(scan.matched or stopped_by) if finish == "stop" else None)

    async def _segment(self, req: GenRequest, prefix: list[int] | str, answer: str, left: int,
                       tally: Tally) -> tuple[str | None, str | None]:
        """The large model's next segment after `answer` (cut to the setting's boundary) and how its generation
        ended; (None, None) when it failed (the router then goes on without it)."""
        s, large = self.s, self.large
        n = 1 if s.segment == "token" else s.max_segment_tokens
        params = {k: v for k, v in req.params.items() if k in ("temperature", "top_p", "seed", "stop")}
        params["max_tokens"] = min(n, left)
        if isinstance(prefix, str):
            lreq = GenRequest(model=large.name, kind="completion", prompt=prefix + answer, params=params,
                              request_id=req.request_id, stream=False, headers=req.headers)
        else:
            tail = large.engine.tokenizer.encode(answer, add_special=False) if answer else []
            lreq = GenRequest(model=large.name, kind="completion", params=params, request_id=req.request_id,
                              stream=False, token_routing=TokenRouting(prompt_ids=prefix + tail))
        text, end = "", None
        try:
            async for d in large.stream(lreq):
                text += d.text
                if d.finish_reason is not None:
                    end = d.finish_reason
                    tally.add(large.name, d.usage)
        except BackendError as e:
            tally.large_failed = f"{large.name}: {e}"
            return None, None
        if end == "error":
            tally.large_failed = f"{large.name}: failed mid-answer"
            return None, None
        return cut_segment(text, s.segment), end


def large_prefix(large: Any, template: str | None, small: Any) -> Any:
    """`req -> the large model's prompt before the answer`: token ids of its own chat template for an embedded
    large model; for an upstream, text rendered with `template`'s chat template (a packaged model name or GGUF
    path; default the small model's), without the leading BOS of a model whose tokenizer adds one (the upstream
    adds its own)."""
    if hasattr(large, "engine") and hasattr(large, "prompt_tokens"):
        return lambda req: large.prompt_tokens(dataclasses.replace(req, model=large.name, counted=None))
    tok = _template(template) if template else small.engine.tokenizer

    def prefix(req: GenRequest) -> str:
        if req.kind != "chat":
            return req.prompt or ""
        text = tok.render_chat(req.messages or [])
        adds_bos = tok.vocab.add_bos and tok.bos_text and text.startswith(tok.bos_text)
        return text[len(tok.bos_text):] if adds_bos else text

    return prefix


@functools.cache
def _template(name: str) -> Any:
    from tokenomy.engine.tokenizer import Tokenizer
    from tokenomy.engine.vocab import Vocab
    from tokenomy.models.catalog import resolve_gguf

    return Tokenizer(Vocab(str(resolve_gguf(name)), vocab_only=True))


def observer(metrics: Any, route: str, small: str, large: str) -> Callable[[Tally, str | None], None]:
    """What counts a finished token-routed answer into `metrics` (meter.metrics.Metrics, tokenomy_token_route_*):
    its tokens by the model that wrote them, its handovers, a large model that failed."""
    def done(tally: Tally, finish: str | None) -> None:
        metrics.token_route_tokens.labels(route, small).inc(tally.small_tokens)
        metrics.token_route_tokens.labels(route, large).inc(tally.large_tokens)
        metrics.token_route_handovers.labels(route).observe(tally.handovers)
        if tally.large_failed:
            metrics.token_route_large_failures.labels(route).inc()

    return done
