"""JSON from outside, read one way wherever it comes from: an HTTP body, a line of a batch input file, a batch's
metadata. What parses as JSON but cannot be served is a 400 naming the field: nesting deeper than
MAX_JSON_DEPTH (Python's parser would raise RecursionError past about 1,000 levels) and text holding a lone UTF-16
surrogate ("\\ud800"), which no response, log line, ledger row or metric can encode."""

from __future__ import annotations

import json
import re
from typing import Any

from tokenomy.errors import APIError

MAX_JSON_DEPTH = 128


def loads(text: str | bytes, what: str = "The JSON body", check: bool = True) -> Any:
    """`text` parsed and checked (check_json; `check` False leaves that to the caller); APIError 400 (code
    invalid_json or invalid_encoding) for bytes that are not UTF-8, text that is not JSON, or JSON check_json
    refuses. `what` names the text in the error."""
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8-sig")      # a leading byte-order mark is not part of the JSON
        except UnicodeDecodeError as e:
            raise APIError(400, f"{what} is not valid UTF-8 (byte {e.start}).", code="invalid_encoding") from e
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise APIError(400, f"We could not parse {what[0].lower()}{what[1:]}: {e.msg} at line {e.lineno} "
                       f"column {e.colno}.", code="invalid_json") from e
    except RecursionError:
        raise APIError(400, f"{what} is nested more than {MAX_JSON_DEPTH} levels deep.",
                       code="invalid_json") from None
    if check:
        check_json(data, what)
    return data


def check_json(data: Any, what: str = "The JSON body") -> None:
    """Refuse nesting deeper than MAX_JSON_DEPTH and text (keys included) with a lone surrogate; the error names
    the field ("messages[0].content")."""
    stack: list[tuple[Any, str, int]] = [(data, "", 0)]
    while stack:
        value, path, depth = stack.pop()
        if depth > MAX_JSON_DEPTH:
            raise APIError(400, f"{what} is nested more than {MAX_JSON_DEPTH} levels deep (at {path}).",
                           param=path or None, code="invalid_json")
        if isinstance(value, str):
            _encodable(value, path)
        elif isinstance(value, dict):
            for k, v in value.items():
                _encodable(k, path)
                stack.append((v, f"{path}.{k}" if path else k, depth + 1))
        elif isinstance(value, list):
            stack.extend((v, f"{path}[{i}]", depth + 1) for i, v in enumerate(value))


def readable(value: Any) -> Any:
    """`value` (stored JSON: a dict, list or string) with every lone surrogate replaced by U+FFFD, so a row stored
    before check_json existed can still be answered."""
    if isinstance(value, str):
        return value if is_text(value) else _SURROGATE.sub("\ufffd", value)
    if isinstance(value, dict):
        return {readable(k): readable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [readable(v) for v in value]
    return value


_SURROGATE = re.compile("[\ud800-\udfff]")


def is_text(value: str) -> bool:
    """Whether `value` is valid Unicode text (no lone surrogate)."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _encodable(text: str, path: str) -> None:
    if not is_text(text):
        field = path or "the body"
        raise APIError(400, f"{field} contains a lone UTF-16 surrogate, which is not valid Unicode text.",
                       param=path or None, code="invalid_encoding") from None
