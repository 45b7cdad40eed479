"""The embedded backend: requests run on tokenomy's own engine, in a child process per model (engine/client.py).

The gateway side tokenizes and renders the chat template; the engine process compiles grammars, decodes and
samples. An engine crash ends the requests it held with a 503 (an error event on streams) and restarts it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import AsyncIterator
from typing import Any

from tokenomy.backends.base import BackendError, InvalidRequest, Overloaded
from tokenomy.config import StructuredSettings
from tokenomy.context.tokens import TokenCount
from tokenomy.engine.client import EngineClient, EngineUnavailable
from tokenomy.engine.config import EngineConfig
from tokenomy.engine.core import ConstraintSpec
from tokenomy.engine.launch import Launch
from tokenomy.engine.sampling_params import SamplingParams
from tokenomy.engine.sequence import TokenEvent
from tokenomy.engine.sequence_output import TokenLogprob
from tokenomy.engine.tokenizer import TemplateError
from tokenomy.generation import Delta, GenRequest, Usage
from tokenomy.telemetry import trace


def sampling_params(params: dict[str, Any], default_max: int, n_vocab: int,
                    priority: str = "interactive", req: GenRequest | None = None) -> SamplingParams:
    """The engine's SamplingParams for OpenAI sampling fields (and `req`'s token-routing fields, when given);
    ValueError (a 400) names what is out of range."""
    stop = params.get("stop") or []
    if isinstance(stop, str):
        stop = [stop]
    temperature = params.get("temperature")
    routing = req.token_routing if req is not None else None
    return SamplingParams(
        max_tokens=params.get("max_tokens") or default_max,
        temperature=1.0 if temperature is None else float(temperature),
        top_p=1.0 if params.get("top_p") is None else float(params["top_p"]),
        top_k=int(params.get("top_k") or 0),
        min_p=float(params.get("min_p") or 0.0),
        seed=params.get("seed"),
        presence_penalty=float(params.get("presence_penalty") or 0.0),
        frequency_penalty=float(params.get("frequency_penalty") or 0.0),
        repetition_penalty=float(params.get("repetition_penalty") or 1.0),
        stop=list(stop),
        logprobs=bool(params.get("logprobs")),
        top_logprobs=int(params.get("top_logprobs") or 0),
        logit_bias=logit_bias(params.get("logit_bias") or {}, n_vocab),
        ignore_eos=bool(params.get("ignore_eos")),
        speculative=params.get("speculative") is not False,
        priority="batch" if priority == "batch" else "interactive",
        signal=routing.signal if routing is not None else None,
        handover_below=routing.handover_below if routing is not None else None,
        handover_after=routing.handover_after if routing is not None else 0,
        pin_s=req.pin_s if req is not None else 0.0,
    )


def logit_bias(bias: dict[str, Any], n_vocab: int) -> dict[int, float]:
    out: dict[int, float] = {}
    for key, value in bias.items():
        try:
            token = int(key)
        except (TypeError, ValueError):
            raise ValueError(f"logit_bias key {key!r} is not a token id") from None
        if not 0 <= token < n_vocab:
            raise ValueError(f"logit_bias key {key} is not a token id of this model (0 to {n_vocab - 1})")
        if not -100.0 <= float(value) <= 100.0:
            raise ValueError(f"logit_bias value for {key} must be between -100 and 100")
        out[token] = float(value)
    return out


# A strict json_schema's answer must close: one cut at max_tokens is a 422. A model without a measured wrap-up
# share (a GGUF path) still gets wrap-up for it, at a share of 1: the soft limit is then where the schema's
# shortest way to the end barely fits (Constraint.plan_wrap_up), so an answer that would end anyway is untouched.
STRICT_WRAP_UP = 1.0


def wrap_up_share(configured: float | None, strict: bool) -> float | None:
    """The wrap-up share a constrained answer is planned with: the model's, or STRICT_WRAP_UP for a strict
    json_schema when the model has none."""
    return configured if configured is not None or not strict else STRICT_WRAP_UP


class EmbeddedBackend:
    def __init__(self, name: str, gguf_path: str, cfg: EngineConfig | None = None,
                 structured: StructuredSettings | None = None, address: str | None = None,
                 wait: bool = True, launched: Launch | None = None) -> None:
        """`address`: the Unix socket of an engine process already running this model (server.workers), which
        the backend connects to instead of starting its own; `launched`: the engine process started for it before
        the gateway was built (embedded_launch.py), taken over; `wait`: as EngineClient's (False: the engine
        finishes starting in self.engine.wait_ready())."""
        self.name = name
        self.structured = structured or StructuredSettings()
        self.path = gguf_path
        self.engine = EngineClient(gguf_path, cfg, name=name, address=address, wait=wait, launched=launched)
        self._wait_ewma = 0.0

    # ---- structured output -------------------------------------------------------------------------------
    def output_format(self, req: GenRequest) -> Any:
        """The request's OutputFormat (response_format / tools), or None. The engine process compiles its grammar
        against the loaded vocabulary; a schema it cannot compile comes back as an invalid_schema error."""
        if req.kind != "chat" or not (req.response_format or req.tools):
            return None
        from tokenomy.structured import SchemaError, output_format

        try:
            st = self.structured
            return output_format(req.response_format, req.tools, req.tool_choice,
                                 req.params.get("parallel_tool_calls", True) is not False,
                                 max_string_length=st.max_string_length, max_array_items=st.max_array_items)
        except SchemaError as e:
            raise InvalidRequest(f"Invalid schema: {e.reason}", param=e.param, code="invalid_schema") from e

    # ---- prompt ----------------------------------------------------------------------------------------
    def prompt_tokens(self, req: GenRequest) -> list[int]:
        """The prompt as the engine is fed it: a chat's template rendered with the tools' system text when the
        model may call a tool (so a count of it counts the tools too)."""
        if req.token_routing is not None and req.token_routing.prompt_ids is not None:
            return list(req.token_routing.prompt_ids)
        memo = req.counted
        if (memo is not None and memo[0] == self.name and memo[1] == req.kind and memo[2] is req.messages
                and memo[3] is req.tools and memo[4] is req.prompt):
            return list(memo[5])
        tok = self.engine.tokenizer
        if req.kind == "chat":
            try:
                return tok.encode_chat(self._described(req).messages or [], req.tools)
            except TemplateError as e:
                raise InvalidRequest(str(e), param="messages") from e
        return tok.encode(req.prompt or "")

    def _described(self, req: GenRequest) -> GenRequest:
        """The request as the model reads it: tools it may call are described in its system message (the grammar
        enforces the call convention; SmolLM2's template has no tool syntax of its own). Counting and generating
        both render this, so a prompt's count includes its tools."""
        if not req.tools:
            return req
        fmt = self.output_format(req)
        if fmt is None or not fmt.may_call:
            return req
        from tokenomy.structured import tools_prompt

        return _with_system(req, tools_prompt(req.tools))

    def count_tokens(self, req: GenRequest) -> TokenCount:
        ids = self.prompt_tokens(req)
        req.counted = (self.name, req.kind, req.messages, req.tools, req.prompt, tuple(ids))
        return TokenCount(len(ids), exact=True)

    def check_length(self, prompt: list[int], params: dict[str, Any]) -> int:
        """Tokens left for the answer after `prompt` (the default max_tokens); InvalidRequest
        (context_length_exceeded) when the prompt, or the prompt and the asked max_tokens, do not fit the model's
        context (a max_tokens past it is allowed when the engine shifts its context, `context_overflow: shift`)."""
        limit = self.engine.max_model_len
        if len(prompt) >= limit:
            raise InvalidRequest(
                f"This model's maximum context length is {limit} tokens. However, your prompt is "
                f"{len(prompt)} tokens long.", param="messages", code="context_length_exceeded")
        max_tokens = params.get("max_tokens")
        shifts = self.engine.cfg.context_overflow == "shift"
        if max_tokens is not None and len(prompt) + max_tokens > limit and not shifts:
            raise InvalidRequest(
                f"This model's maximum context length is {limit} tokens. However, you requested "
                f"{len(prompt) + max_tokens} tokens ({len(prompt)} in the prompt, {max_tokens} for the "
                f"completion). Please reduce the prompt or max_tokens.", param="max_tokens",
                code="context_length_exceeded")
        return limit - len(prompt)

    # ---- generation ------------------------------------------------------------------------------------
    async def stream(self, req: GenRequest) -> AsyncIterator[Delta]:
        """The answer's deltas. With `n` > 1 the n choices run as n sequences sharing one prefill, each piece
        saying its choice; with `best_of` > n all best_of run, unstreamed, and the n with the highest mean logprob
        per token are sent, best first. A predicted output (`prediction`) is tokenized once and drafted from."""
        t0 = time.perf_counter()
        fmt = self.output_format(req)
        prompt = self.prompt_tokens(req)
        room = self.check_length(prompt, req.params)
        try:
            sp = sampling_params(req.params, default_max=room, n_vocab=self.engine.vocab.n_vocab,
                                 priority=req.priority, req=req)
        except ValueError as e:
            param = next((f for f in ("logit_bias", "repetition_penalty", "temperature", "top_p", "max_tokens")
                          if f in str(e)), None)
            raise InvalidRequest(str(e), param=param) from e
        predicted = prediction_text(req.params)
        if predicted is not None:
            sp.prediction = self.engine.tokenizer.encode(predicted, add_special=False)[:self.engine.max_model_len]
        n = int(req.params.get("n") or 1)
        best_of = max(int(req.params.get("best_of") or n), n)
        spec = None if fmt is None else ConstraintSpec(fmt, self.structured.break_loops, wrap_up_share(
            self.structured.wrap_up, fmt.strict))
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[tuple[int, TokenEvent]] = asyncio.Queue()

        def on_event_of(i: int) -> Any:
            def on_event(ev: TokenEvent) -> None:   # called on the engine client's reader thread
                loop.call_soon_threadsafe(queue.put_nowait, (i, ev))
            return on_event

        ranked = best_of > n           # every candidate must finish before any is sent
        try:
            handles = self.engine.submit_n(prompt, [sp.for_choice(i) for i in range(best_of)],
                                           [on_event_of(i) for i in range(best_of)], constraint=spec,
                                           request_id=req.request_id, stream=req.stream and not ranked)
        except EngineUnavailable as e:
            raise BackendError(str(e), status=503, retryable=True, retry_after=1.0) from e
        calls = [_tool_calls(fmt) for _ in range(best_of)]
        finals: dict[int, TokenEvent] = {}
        held: dict[int, list[Delta]] = {i: [] for i in range(best_of)}
        try:
            while len(finals) < best_of:
                i, ev = await queue.get()
                if ev.finish_reason == "error":
                    raise _error(ev)
                d = _piece(i, ev, calls[i], self._wire(ev.logprobs))
                if ev.finish_reason is not None:
                    finals[i] = ev
                if d is None:
                    continue
                if ranked or len(finals) == best_of:
                    held[i].append(d)      # ranked: sent once all have finished; else the last piece, with usage
                else:
                    yield d
            usage = self._usage([finals[i] for i in range(best_of)], handles[0].submitted_at, t0,
                                predicted is not None)
            if req.trace is not None:    # the engine's queue, prefill and decode, from its timings
                trace.engine(req.trace, req, self.name, t0, handles[0].submitted_at, usage)
            if ranked:      # the n likeliest, best first
                best = sorted(range(best_of), key=lambda i: -(finals[i].mean_logprob or 0.0))[:n]
                rest = [dataclasses.replace(d, index=k) for k, i in enumerate(best) for d in held[i]]
            else:           # the piece that ended the last choice to finish
                rest = [d for i in range(best_of) for d in held[i]]
            rest[-1].usage = usage
            for d in rest:
                yield d
        finally:
            for i, h in enumerate(handles):
                if i not in finals:      # the consumer went away (client disconnect), or a choice failed
                    self.engine.cancel(h)

    def _usage(self, finals: list[TokenEvent], arrival: float, t0: float, predicted: bool) -> Usage:
        """One usage for the request's sequences' final events: the prompt once (the first sequence computed it),
        the completion tokens of them all."""
        first = finals[0]
        completion = sum(ev.completion_tokens for ev in finals)
        starts = [ev.first_token_at for ev in finals if ev.first_token_at]
        drafted, accepted = sum(ev.draft_tokens for ev in finals), sum(ev.draft_accepted for ev in finals)
        usage = Usage(
            prompt_tokens=first.prompt_tokens, completion_tokens=completion, cached_tokens=first.cached_tokens,
            queue_s=max((first.scheduled_at or arrival) - arrival, 0.0),
            ttft_s=(min(starts) - arrival) if starts else None,
            e2e_s=time.perf_counter() - t0,
            mean_logprob=(sum((ev.mean_logprob or 0.0) * ev.completion_tokens for ev in finals) / completion
                          if completion else first.mean_logprob),
            min_logprob=min(ev.min_logprob or 0.0 for ev in finals),
            draft_tokens=drafted, draft_accepted=accepted,
            accepted_prediction_tokens=accepted if predicted else None,
            rejected_prediction_tokens=drafted - accepted if predicted else None,
        )
        self._wait_ewma = 0.8 * self._wait_ewma + 0.2 * max(usage.queue_s, 0.0)
        return usage

    def _wire(self, logprobs: list[TokenLogprob]) -> list[dict[str, Any]]:
        """OpenAI's logprobs content entries: token text, logprob, bytes and top_logprobs."""
        piece = self.engine.vocab.piece

        def entry(token: int, lp: float) -> dict[str, Any]:
            b = piece(token)
            return {"token": b.decode("utf-8", errors="replace"), "logprob": lp, "bytes": list(b)}

        return [dict(entry(x.token, x.logprob), top_logprobs=[entry(t, lp) for t, lp in x.top]) for x in logprobs]

    def expected_wait_s(self) -> float:
        """Queue wait a new request should expect: the current head-of-queue age, or recent waits if busier."""
        if self.engine.queue_depth == 0:
            return 0.0
        return max(self.engine.oldest_wait_s, self._wait_ewma)

    def queued(self) -> float | None:
        """Requests waiting in the engine's queue."""
        return float(self.engine.queue_depth)

    async def health(self) -> bool:
        return self.engine.state == "ready"

    async def close(self) -> None:
        await asyncio.to_thread(self.engine.stop)


def prediction_text(params: dict[str, Any]) -> str | None:
    """The text of a request's predicted output (the dialect's `prediction`: {"type": "content", "content": text}),
    or None."""
    pred = params.get("prediction")
    text = pred.get("content") if isinstance(pred, dict) else None
    return text if isinstance(text, str) and text else None


def _tool_calls(fmt: Any) -> Any:
    """A ToolCallStream for one choice when the answer may call tools (a CallStream when it may call custom
    tools), else None."""
    if fmt is None or not fmt.may_call:
        return None
    from tokenomy.structured import ToolCallStream
    from tokenomy.structured.custom_tools import CallStream

    return CallStream() if fmt.customs else ToolCallStream()


def _piece(i: int, ev: TokenEvent, calls: Any, logprobs: list[dict[str, Any]]) -> Delta | None:
    """The delta of choice `i` for one of its events (its tool calls parsed out of the text by `calls`); None for an
    event that carries nothing to send. A final event gives the choice's last piece, with its finish_reason."""
    text, tool_deltas = calls.feed(ev.text) if calls is not None else (ev.text, [])
    finish = ev.finish_reason
    if finish is None and not (text or tool_deltas or ev.logprobs or ev.token_ids):
        return None
    if finish is not None and calls is not None:
        rest, _ = calls.close()
        text += rest
        if calls.calls and finish == "stop":
            finish = "tool_calls"
    return Delta(text=text, logprobs=logprobs, finish_reason=finish, confidence=ev.token_logprobs,
                 tool_calls=tool_deltas or None, token_ids=ev.token_ids, signals=ev.signals, index=i,
                 stop_sequence=ev.stop_sequence if finish is not None else None)


def _error(ev: TokenEvent) -> Exception:
    """The exception for an engine's error event: the request's own fault is a 4xx and never counts against the
    model; a full queue is a 429; a crashed engine or a failed step is a 503 another model may serve."""
    code = ev.error_code
    if code == "queue_full":
        return Overloaded(ev.error or "the engine's queue is full", retry_after=1.0)
    if code == "invalid_schema" and ev.error and not ev.error.startswith("Invalid schema"):
        return InvalidRequest(f"Invalid schema: no answer can satisfy it ({ev.error})", param="response_format",
                              code=code)
    if code in ("invalid_schema", "invalid_request"):
        return InvalidRequest(ev.error or "invalid request", param=ev.error_param, code=code)
    if code == "engine_died":
        return BackendError(ev.error or "the engine died", status=503, retryable=True, retry_after=1.0)
    if code == "sequence_failed":   # this request's own sequence failed; the engine serves on
        return BackendError(f"the model failed on this request: {ev.error}", status=500, retryable=False)
    return BackendError(f"engine error: {ev.error}", status=500, retryable=True)


def _with_system(req: GenRequest, text: str) -> GenRequest:
    """The request with `text` added to its system message (SmolLM2's template has no tool syntax of its own)."""
    msgs = [dict(m) for m in (req.messages or [])]
    if msgs and msgs[0].get("role") == "system":
        msgs[0]["content"] = f"{msgs[0].get('content') or ''}\n\n{text}".strip()
    else:
        msgs.insert(0, {"role": "system", "content": text})
    return dataclasses.replace(req, messages=msgs)
