"""Read a .safetensors file into numpy arrays without the `safetensors` package (or torch).

The format: an 8-byte little-endian header length, a JSON header naming each tensor's dtype, shape and byte range
(`data_offsets`, relative to the end of the header), then the raw little-endian data. The arrays returned are
read-only views of one memory map, so reading a file costs no copy until an array is used, and reading only one
tensor of a large file reads only its pages.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np

_DTYPES = {
    "F64": "<f8", "F32": "<f4", "F16": "<f2", "I64": "<i8", "I32": "<i4", "I16": "<i2", "I8": "i1", "U8": "u1",
    "BOOL": "?",
}


def read_safetensors(path: str | Path) -> dict[str, np.ndarray]:
    """Every tensor of the file by name. BF16 tensors come back widened to float32 (numpy has no bfloat16);
    any other dtype numpy lacks raises ValueError naming it, as does a file whose header is not one."""
    path = Path(path)
    with path.open("rb") as f:
        head = f.read(8)
        if len(head) != 8:
            raise ValueError(f"{path}: not a safetensors file (shorter than its header length)")
        (n,) = struct.unpack("<Q", head)
        if n > path.stat().st_size - 8:
            raise ValueError(f"{path}: not a safetensors file (header length {n} exceeds the file)")
        try:
            header = json.loads(f.read(n))
        except ValueError as e:
            raise ValueError(f"{path}: not a safetensors file (header is not JSON: {e})") from None
    data = np.memmap(path, dtype=np.uint8, mode="r", offset=8 + n)
    out: dict[str, np.ndarray] = {}
    for name, spec in header.items():
        if name == "__metadata__":
            continue
        start, end = spec["data_offsets"]
        raw = data[start:end]
        dtype, shape = spec["dtype"], tuple(spec["shape"])
        if dtype == "BF16":
            out[name] = (raw.view("<u2").astype(np.uint32) << 16).view(np.float32).reshape(shape)
        elif dtype in _DTYPES:
            out[name] = raw.view(_DTYPES[dtype]).reshape(shape)
        else:
            raise ValueError(f"{path}: tensor {name} has dtype {dtype}, which numpy cannot hold")
    return out
