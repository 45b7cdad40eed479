"""Canonical request hashing for the response caches.

Two requests share an exact-cache entry only when everything that can change the generated output is equal:
tenant, model (or route), the full message list, tools, response_format and every sampling parameter. The
semantic cache splits a request into the last user turn (embedded and compared approximately) and its context
(everything else, compared exactly by hash), so that two different conversations never share an answer.

Hashes are SHA-256 over canonical JSON: keys sorted, no whitespace, ``None`` values dropped (absent and null
mean the same on the OpenAI wire), integral floats written as integers (``temperature: 0`` == ``0.0``).
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

from tokenomy.generation import message_dicts

# Request fields that never change the generated text or its shape; they are left out of every key. Anything
# not listed here is part of the key, so an unknown new parameter can only cost a hit, never serve a wrong one.
NON_OUTPUT_PARAMS = frozenset({
    "stream", "stream_options", "user", "metadata", "store", "service_tier", "timeout", "extra_headers",
    "extra_query", "messages", "model",
})

# Parameters that only change which sample is drawn, not what a right answer is. A semantic hit already serves
# an answer written for a different wording, so these stay out of the semantic context: splitting partitions by
# temperature would cost hits and buy no safety. They are part of the exact key.
SAMPLING_ONLY_PARAMS = frozenset({
    "temperature", "top_p", "top_k", "min_p", "typical_p", "seed", "presence_penalty", "frequency_penalty",
    "repetition_penalty", "repeat_penalty",
})

_VERSION = "tokenomy-cache-key-v1"


def _canonical(value: Any) -> Any:
    """Normalise a JSON-able value so that equal requests serialise to equal bytes."""
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"cache key: non-finite number {value!r} in request")
        return int(value) if value.is_integer() else value
    if isinstance(value, Mapping):
        out = {}
        for k, v in value.items():
            if not isinstance(k, str):
                raise TypeError(f"cache key: mapping keys must be strings, got {type(k).__name__}")
            if v is not None:
                out[k] = _canonical(v)
        return out
    if isinstance(value, Sequence) and not isinstance(value, bytes | bytearray):
        return [_canonical(v) for v in value]
    if hasattr(value, "model_dump"):  # pydantic models from the API layer
        return _canonical(value.model_dump(exclude_none=True))
    raise TypeError(f"cache key: cannot hash a value of type {type(value).__name__}")


def canonical_json(value: Any) -> str:
    """The canonical JSON text of ``value`` (sorted keys, compact, None dropped, 1.0 written as 1)."""
    return json.dumps(_canonical(value), sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def _digest(parts: dict[str, Any]) -> str:
    return hashlib.sha256(canonical_json({"v": _VERSION, **parts}).encode()).hexdigest()


def _check_messages(messages: Any) -> list[Mapping[str, Any]]:
    try:
        return message_dicts(messages)
    except TypeError as e:
        raise TypeError(f"cache key: {e}") from None


def _output_params(params: Mapping[str, Any] | None, drop: frozenset[str]) -> dict[str, Any]:
    if params is None:
        return {}
    if not isinstance(params, Mapping):
        raise TypeError("cache key: params must be a mapping")
    return {k: v for k, v in params.items() if k not in NON_OUTPUT_PARAMS and k not in drop}


def exact_key(tenant: str, model: str, messages: Sequence[Mapping[str, Any]],
              params: Mapping[str, Any] | None = None) -> str:
    """SHA-256 hex of (tenant, model, full messages, tools, response_format, every output-changing param)."""
    return _digest({"kind": "exact", "tenant": tenant, "model": model, "messages": _check_messages(messages),
                    "params": _output_params(params, frozenset())})


def normalise(text: str) -> str:
    """Case and spacing aside: the text as caches and calibration compare it."""
    return " ".join(text.split()).casefold()


def question_key(text: str) -> str:
    """What makes two questions the same question for the semantic cache: ``normalise`` and no trailing
    question mark or full stop ("what is the capital of France" asks "What is the capital of France?"). Such a
    pair is served without verification; any other difference goes through the verifier."""
    return normalise(text).rstrip("?. ")


def context_key(tenant: str, model: str, messages: Sequence[Mapping[str, Any]],
                params: Mapping[str, Any] | None = None) -> str:
    """SHA-256 hex of everything but the last user turn: tenant, model, system prompt, earlier turns, tools,
    response_format and the output-shaping params (not the pure sampling ones, see SAMPLING_ONLY_PARAMS).

    The last message's role and non-content fields (e.g. ``name``) stay in the key; only its text is left out.
    """
    msgs = _check_messages(messages)
    last = {k: v for k, v in msgs[-1].items() if k != "content"} if msgs else {}
    return _digest({"kind": "context", "tenant": tenant, "model": model, "history": msgs[:-1], "last": last,
                    "params": _output_params(params, SAMPLING_ONLY_PARAMS)})


def is_deterministic(params: Mapping[str, Any] | None) -> bool:
    """True when the request asks for a reproducible output: temperature 0, or a seed given.

    An absent temperature means the backend's default (1.0 on the OpenAI API), so it is not deterministic.
    ``n > 1`` asks for several different samples and is never deterministic.
    """
    if not params:
        return False
    n = params.get("n")
    if n is not None and n != 1:
        return False
    if params.get("seed") is not None:
        return True
    temperature = params.get("temperature")
    return isinstance(temperature, int | float) and not isinstance(temperature, bool) and temperature == 0
