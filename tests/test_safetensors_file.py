"""tokenomy.safetensors_file reads the format as written by the spec: every dtype it names, offsets, errors."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import pytest

from tokenomy.safetensors_file import read_safetensors


def write(path: Path, tensors: dict[str, tuple[str, tuple[int, ...], bytes]]) -> None:
    header, blob = {"__metadata__": {"format": "pt"}}, b""
    for name, (dtype, shape, data) in tensors.items():
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [len(blob), len(blob) + len(data)]}
        blob += data
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + blob)


def test_reads_each_dtype_at_its_offset(tmp_path: Path) -> None:
    f32 = np.arange(6, dtype="<f4").reshape(2, 3) / 3
    i64 = np.array([-1, 2**40], dtype="<i8")
    f16 = np.array([0.5, -2.0], dtype="<f2")
    bf16 = np.array([1.5, -0.15625, 3e38], dtype="<f4")
    write(tmp_path / "t.safetensors", {
        "a": ("F32", (2, 3), f32.tobytes()), "b": ("I64", (2,), i64.tobytes()), "c": ("F16", (2,), f16.tobytes()),
        "d": ("BF16", (3,), (bf16.view("<u4") >> 16).astype("<u2").tobytes()), "e": ("F32", (0,), b""),
    })
    t = read_safetensors(tmp_path / "t.safetensors")
    assert set(t) == {"a", "b", "c", "d", "e"}
    np.testing.assert_array_equal(t["a"], f32)
    np.testing.assert_array_equal(t["b"], i64)
    np.testing.assert_array_equal(t["c"], f16)
    np.testing.assert_array_equal(t["d"], (bf16.view("<u4") & 0xFFFF0000).view("<f4"))  # bf16 truncates
    assert t["d"].dtype == np.float32 and t["e"].shape == (0,)


def test_not_a_safetensors_file_is_a_clear_error(tmp_path: Path) -> None:
    for content, what in ((b"abc", "shorter"), (struct.pack("<Q", 999) + b"{}", "exceeds"),
                          (struct.pack("<Q", 3) + b"{x}", "not JSON")):
        (tmp_path / "bad").write_bytes(content)
        with pytest.raises(ValueError, match=what):
            read_safetensors(tmp_path / "bad")
    write(tmp_path / "odd.safetensors", {"x": ("F8_E4M3", (1,), b"\0")})
    with pytest.raises(ValueError, match="F8_E4M3"):
        read_safetensors(tmp_path / "odd.safetensors")


def test_the_packaged_minilm_reads_as_the_safetensors_package_reads_it() -> None:
    safetensors = pytest.importorskip("safetensors")  # no dependency of tokenomy; compared with where installed
    from tokenomy.embedding.embedder import packaged_model_path

    path = Path(packaged_model_path()) / "model.safetensors"
    ours = read_safetensors(path)
    with safetensors.safe_open(str(path), "np") as theirs:
        assert set(ours) == set(theirs.keys())
        for name in theirs.keys():
            np.testing.assert_array_equal(ours[name], theirs.get_tensor(name))
