"""Whether a body the server sent is whole by the official openai SDK's typed models: it parses, every field the
model declares was sent (none left to its default), and nothing was sent that the model does not declare."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, TypeAdapter


def gaps(kind: Any, raw: dict[str, Any]) -> list[str]:
    """Problems of `raw` as an instance of `kind` (an SDK model or a union of them, e.g.
    openai.types.responses.ResponseStreamEvent): 'path: missing' for a declared field the body left out,
    'path: undeclared' for a key the SDK does not know; empty when the body is whole. Raises pydantic's
    ValidationError when it does not parse at all."""
    return _walk(TypeAdapter(kind).validate_python(raw), "$")


def _walk(value: Any, path: str) -> list[str]:
    if isinstance(value, BaseModel):
        out = [f"{path}.{name}: missing" for name in type(value).model_fields if name not in value.model_fields_set]
        out += [f"{path}.{key}: undeclared" for key in (value.model_extra or {})]
        for name in value.model_fields_set & set(type(value).model_fields):
            out += _walk(getattr(value, name), f"{path}.{name}")
        return out
    if isinstance(value, list):
        return [g for i, v in enumerate(value) for g in _walk(v, f"{path}[{i}]")]
    if isinstance(value, dict):
        return [g for k, v in value.items() for g in _walk(v, f"{path}.{k}")]
    return []
