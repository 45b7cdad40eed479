"""The few ONNX protobuf messages tokenomy/embedding/bert_onnx.py writes, encoded here: no `onnx` package (27 MB
installed, and a second or more to import on a cold start, most of it ml_dtypes).

Each function returns one serialised message, fields in field-number order and repeated scalars unpacked, as
onnx.proto (proto2) declares them and protobuf writes them; so a model built with these is byte for byte the model
built with `onnx.helper` (tests/embedding/test_embedder.py compares the two where onnx is installed). Field numbers:
onnx.proto.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Sequence

FLOAT, INT64, BOOL = 1, 7, 9            # TensorProto.DataType
_ATTR_FLOAT, _ATTR_INT, _ATTR_INTS = 1, 2, 7  # AttributeProto.AttributeType


def _varint(n: int) -> bytes:
    n &= (1 << 64) - 1                   # int64 fields: a negative value as its 64-bit two's complement
    out = bytearray()
    while n > 0x7F:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _int(field: int, value: int) -> bytes:
    return _varint(field << 3) + _varint(value)


def _bytes(field: int, value: bytes) -> bytes:
    return _varint(field << 3 | 2) + _varint(len(value)) + value


def _str(field: int, value: str) -> bytes:
    return _bytes(field, value.encode())


def attribute(name: str, value: float | int | Sequence[int]) -> bytes:
    """AttributeProto as onnx.helper.make_attribute makes it for a float, an int or a list of ints."""
    if isinstance(value, float):
        return _str(1, name) + _varint(2 << 3 | 5) + struct.pack("<f", value) + _int(20, _ATTR_FLOAT)
    if isinstance(value, int):
        return _str(1, name) + _int(3, value) + _int(20, _ATTR_INT)
    return _str(1, name) + b"".join(_int(8, v) for v in value) + _int(20, _ATTR_INTS)


def node(op_type: str, inputs: Iterable[str], outputs: Iterable[str], name: str,
         **attrs: float | int | Sequence[int]) -> bytes:
    """NodeProto as onnx.helper.make_node makes it: attributes sorted by name."""
    return (b"".join(_str(1, i) for i in inputs) + b"".join(_str(2, o) for o in outputs) + _str(3, name)
            + _str(4, op_type) + b"".join(_bytes(5, attribute(k, v)) for k, v in sorted(attrs.items())))


def value_info(name: str, elem_type: int, shape: Iterable[int | str]) -> bytes:
    """ValueInfoProto of a tensor, as onnx.helper.make_tensor_value_info: a dimension is a size or a name."""
    dims = b"".join(_bytes(1, _int(1, d) if isinstance(d, int) else _str(2, d)) for d in shape)
    tensor_type = _int(1, elem_type) + _bytes(2, dims)
    return _str(1, name) + _bytes(2, _bytes(1, tensor_type))


def tensor(name: str, data_type: int, dims: Iterable[int], raw: bytes) -> bytes:
    """TensorProto with its data as raw little-endian bytes."""
    return b"".join(_int(1, d) for d in dims) + _int(2, data_type) + _str(8, name) + _bytes(9, raw)


def model(nodes: Iterable[bytes], graph_name: str, inputs: Iterable[bytes], outputs: Iterable[bytes],
          initializers: Iterable[bytes], ir_version: int, opset: int, producer: str) -> bytes:
    """ModelProto of one graph, the default domain at `opset` (onnx.helper.make_graph, make_model)."""
    graph = (b"".join(_bytes(1, n) for n in nodes) + _str(2, graph_name)
             + b"".join(_bytes(5, t) for t in initializers) + b"".join(_bytes(11, i) for i in inputs)
             + b"".join(_bytes(12, o) for o in outputs))
    return (_int(1, ir_version) + _str(2, producer) + _bytes(7, graph)
            + _bytes(8, _str(1, "") + _int(2, opset)))
