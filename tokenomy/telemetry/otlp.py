"""OTLP's protobuf wire format for tokenomy's spans (telemetry/trace.py): an ExportTraceServiceRequest's bytes, written
directly, field by field, as opentelemetry-proto's trace.proto numbers them (tests/telemetry/test_trace.py decodes them
with opentelemetry-proto).

Why not the SDK's encoder: it builds a ReadableSpan per span and a protobuf message per attribute in Python, about
100 us a span on this project's machines, on the batch processor's thread but holding the interpreter lock the
request path needs; this writes the same message in about a tenth of that (docs/telemetry.md, "What it costs").
What it writes is what the SDK's encoder writes for the same span, but for the empty status of a span that did not
fail, which it leaves out (proto3: an absent status is UNSET).
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Mapping
from typing import Any

_fixed64 = struct.Struct("<Q").pack
_double = struct.Struct("<d").pack
_fixed32 = struct.Struct("<I").pack
_SMALL = [bytes((i,)) for i in range(128)]
_INT64 = (-(2 ** 63), 2 ** 63)

KINDS = {"internal": b"\x30\x01", "server": b"\x30\x02", "client": b"\x30\x03"}     # Span.kind (SpanKind)
# Span.flags: SPAN_FLAGS_CONTEXT_HAS_IS_REMOTE, and _IS_REMOTE for a span whose parent is another process's
_LOCAL_PARENT, _REMOTE_PARENT = b"\x85\x01" + _fixed32(0x100), b"\x85\x01" + _fixed32(0x300)
_STATUS_ERROR = b"\x18\x02"       # Status.code = STATUS_CODE_ERROR


def _varint(n: int) -> bytes:
    if n < 128:
        return _SMALL[n]
    out = bytearray()
    while n >= 128:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _field(tag: bytes, payload: bytes) -> bytes:
    """A length-delimited field: its tag, the payload's length, the payload."""
    n = len(payload)
    return tag + (_SMALL[n] if n < 128 else _varint(n)) + payload


def _text(s: str) -> bytes:
    return s.encode("utf-8", "replace")          # a lone surrogate in a client's string must not lose the batch


def any_value(v: Any) -> bytes:
    """An AnyValue's bytes: str, bool, int (int64; a larger one as its decimal string), float, a list or tuple of
    those (an ArrayValue); anything else as its str()."""
    if isinstance(v, str):
        return _field(b"\x0a", _text(v))
    if isinstance(v, bool):
        return b"\x10\x01" if v else b"\x10\x00"
    if isinstance(v, int):
        if _INT64[0] <= v < _INT64[1]:
            return b"\x18" + _varint(v & 0xFFFFFFFFFFFFFFFF)      # int64: two's complement, ten bytes if negative
        return _field(b"\x0a", str(v).encode())
    if isinstance(v, float):
        return b"\x21" + _double(v)
    if isinstance(v, (list, tuple)):
        return _field(b"\x2a", b"".join([_field(b"\x0a", any_value(x)) for x in v]))
    return _field(b"\x0a", _text(str(v)))


_keys: dict[str, bytes] = {}      # an attribute name's KeyValue.key field (the names are the code's, a few dozen)
# Span.attributes fields by (name, type, value) for strings, ints and bools: most repeat from span to span
# (operation, provider, model, tenant, cache outcome, token counts ...); emptied when full, as values that never
# repeat (ids) pass through it too
_fields: dict[tuple[str, type, Any], bytes] = {}
_FIELDS_MAX = 4096
_CACHED = (str, int, bool)


def _attribute(k: str, v: Any, tag: bytes) -> bytes:
    key = _keys.get(k)
    if key is None:
        key = _keys[k] = _field(b"\x0a", _text(k))
    return _field(tag, key + _field(b"\x12", any_value(v)))


def attributes(attrs: Mapping[str, Any], tag: bytes = b"\x4a") -> bytes:
    """Repeated KeyValue fields (`tag`: Span.attributes by default), None values left out. Reads a copy of the
    items: a span of a stream that ends late may still be written on the request path."""
    out = []
    for k, v in list(attrs.items()):
        cls = v.__class__
        if cls in _CACHED and tag == b"\x4a":
            field = _fields.get((k, cls, v))
            if field is None:
                if len(_fields) >= _FIELDS_MAX:
                    _fields.clear()
                field = _fields[k, cls, v] = _attribute(k, v, tag)
            out.append(field)
        elif v is not None:
            out.append(_attribute(k, v, tag))
    return b"".join(out)


class Encoder:
    """The ExportTraceServiceRequest of one resource and one instrumentation scope (both written once, here)."""

    def __init__(self, resource: Mapping[str, Any], scope_name: str, scope_version: str | None) -> None:
        self._resource = _field(b"\x0a", attributes(resource, tag=b"\x0a"))           # ResourceSpans.resource
        scope = _field(b"\x0a", _text(scope_name))
        if scope_version:
            scope += _field(b"\x12", _text(scope_version))
        self._scope = _field(b"\x0a", scope)                                           # ScopeSpans.scope

    def request(self, spans: Iterable[bytes]) -> bytes:
        """The request carrying these encoded spans (`span`'s)."""
        scope_spans = self._scope + b"".join(spans)
        return _field(b"\x0a", self._resource + _field(b"\x12", scope_spans))

    @staticmethod
    def span(name: str, kind: str, span_id: int, parent_id: int | None, trace_id: bytes, trace_state: bytes,
             start_ns: int, end_ns: int, attrs: Mapping[str, Any], error: str | None, remote: bool) -> bytes:
        """One ScopeSpans.spans field: `kind` internal, server or client, `trace_state` the W3C tracestate's
        Span.trace_state field (b"" for none), `error` the status message of a span that failed (None: it did
        not), `remote` whether the span's parent is in another process (the caller's)."""
        parts = [b"\x0a\x10", trace_id, b"\x12\x08", span_id.to_bytes(8, "big"), trace_state]
        if parent_id is not None:
            parts += [b"\x22\x08", parent_id.to_bytes(8, "big")]
        parts += [_field(b"\x2a", _text(name)), KINDS[kind], b"\x39", _fixed64(start_ns), b"\x41",
                  _fixed64(end_ns), attributes(attrs)]
        if error is not None:
            parts.append(_field(b"\x7a", _field(b"\x12", _text(error)) + _STATUS_ERROR))
        parts.append(_REMOTE_PARENT if remote and parent_id is not None else _LOCAL_PARENT)
        return _field(b"\x12", b"".join(parts))

    @staticmethod
    def trace_state(header: str | None) -> bytes:
        """The Span.trace_state field of a W3C tracestate header (its entries, the list's blanks left out)."""
        entries = ",".join(e.strip() for e in header.split(",") if e.strip()) if header else ""
        return _field(b"\x1a", _text(entries)) if entries else b""
