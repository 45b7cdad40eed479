"""Check a finished answer against its schema with ``jsonschema`` (upstream backends, and the benchmark).

The validator class follows the schema's ``$schema`` (draft 4 to 2020-12; 2020-12 when absent) and checks
``format`` with that draft's format checker, so a pass here is at least as strict as a plain
``jsonschema.validate``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import jsonschema
from jsonschema.exceptions import SchemaError as JsonSchemaSchemaError

from tokenomy.structured.schema import OutputFormat, SchemaError, parse_tool_calls

MAX_ERRORS = 10


@dataclass(frozen=True)
class Validation:
    """``ok`` iff the answer parsed and satisfied the schema; ``errors`` are ``"<json path>: <message>"``."""

    ok: bool
    errors: list[str] = field(default_factory=list)
    value: Any = None  # the parsed JSON (or the tool_calls list) when parsing succeeded


def validate(text: str, schema: dict[str, Any]) -> Validation:
    """Parse ``text`` as one JSON document and validate it against ``schema``.

    Raises SchemaError when the schema itself is invalid (that is the request's fault, not the answer's).
    """
    try:
        value = json.loads(text)
    except (json.JSONDecodeError, TypeError) as e:
        return Validation(False, [f"not valid JSON: {e}"])
    return validate_value(value, schema)


def check_schema(schema: dict[str, Any]) -> None:
    """Raise SchemaError if ``schema`` is not a valid JSON Schema for its draft (before sending it upstream)."""
    _validator(json.dumps(schema, sort_keys=True))


def validate_value(value: Any, schema: dict[str, Any]) -> Validation:
    """Validate an already parsed JSON value against ``schema``."""
    validator = _validator(json.dumps(schema, sort_keys=True))
    try:
        errors = sorted(validator.iter_errors(value), key=lambda e: (len(e.path), e.json_path))
    except Exception as e:  # unresolvable $ref and similar schema-side failures surface while iterating
        return Validation(False, [f"schema could not be applied: {type(e).__name__}: {e}"], value)
    return Validation(not errors, [f"{e.json_path}: {e.message}" for e in errors[:MAX_ERRORS]], value)


def validate_tool_calls(tool_calls: list[dict[str, Any]], tools: dict[str, dict[str, Any]]) -> Validation:
    """Check OpenAI ``tool_calls``: each names a known function and its ``arguments`` (a JSON string) satisfies
    that function's parameters schema. ``tools`` maps name -> parameters (``OutputFormat.tools``)."""
    errors = []
    for i, call in enumerate(tool_calls):
        if call.get("type") == "custom":        # free-form input, which only its grammar constrains
            continue
        fn = call.get("function", {})
        name = fn.get("name")
        if name not in tools:
            errors.append(f"tool_calls[{i}]: unknown function {name!r}")
            continue
        result = validate(fn.get("arguments", ""), tools[name])
        errors.extend(f"tool_calls[{i}].arguments{e.removeprefix('$')}" for e in result.errors)
    return Validation(not errors, errors[:MAX_ERRORS], tool_calls)


def validate_output(text: str, fmt: OutputFormat) -> Validation:
    """Validate a finished answer for its OutputFormat: a tool call, or a JSON answer, or (``auto``) free text.

    Free text is ok only where the format allows a non-call answer and no answer schema applies.
    """
    if fmt.may_call and text.lstrip().startswith("<tool_call>"):
        try:
            calls = parse_tool_calls(text)
        except ValueError as e:
            return Validation(False, [str(e)])
        return validate_tool_calls(calls, fmt.tools)
    if not fmt.may_answer:
        return Validation(False, ["a tool call was required"])
    if fmt.schema is None:
        return Validation(True, [], text)
    return validate(text, fmt.schema)


@lru_cache(maxsize=256)
def _validator(schema_json: str) -> Any:
    schema = json.loads(schema_json)
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    try:
        cls.check_schema(schema)
    except JsonSchemaSchemaError as e:
        where = "/".join(str(p) for p in e.path)
        raise SchemaError(f"invalid JSON Schema at '{where}': {e.message}") from None
    return cls(schema, format_checker=cls.FORMAT_CHECKER)
