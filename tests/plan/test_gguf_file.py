"""Reading the packaged SmolLM2 GGUF: shape from metadata, exact bytes from the tensor table."""

from __future__ import annotations

import json

import pytest

from tokenomy.plan import formulas as F
from tokenomy.plan.gguf_file import GGUFError, cache_dir, read_gguf
from tokenomy.plan.presets import preset_model


@pytest.fixture(scope="module")
def smollm2(smollm2_gguf):
    return read_gguf(smollm2_gguf)


def test_metadata_gives_the_published_shape(smollm2):
    ref = preset_model("smollm2-135m-instruct", use_file=False)
    for field in ("layers", "hidden", "heads", "kv_heads", "head_dim", "intermediate", "vocab", "tied_embeddings"):
        assert getattr(smollm2, field) == getattr(ref, field), field
    assert smollm2.layer_types == () and smollm2.moe is None


def test_tensor_table_gives_exact_parameters_and_bytes(smollm2, smollm2_gguf):
    ref = F.param_counts(preset_model("smollm2-135m-instruct", use_file=False))
    file = smollm2.file
    # the file holds the norms the architecture formula ignores: within 0.1%
    assert file.params == pytest.approx(ref.total, rel=1e-3)
    assert file.label == "Q4_1"
    # Q4_1 is 5 bits per weight (4 + fp16 scale and min per 32); the Q8_0 embedding and f32 norms add a little
    assert file.params * 5 / 8 < file.bytes < file.params * 6 / 8
    assert file.bytes < smollm2_gguf.stat().st_size  # plus header and tokenizer


def test_summary_is_cached_and_reads_back_identical(smollm2, smollm2_gguf):
    files = list(cache_dir().glob("gguf-*.json"))
    assert files, "read_gguf should leave a summary in the cache"
    assert any(json.loads(f.read_text())["file"]["bytes"] == smollm2.file.bytes for f in files)
    assert read_gguf(smollm2_gguf) == smollm2


def test_not_a_gguf_is_a_clear_error(tmp_path):
    fake = tmp_path / "fake.gguf"
    fake.write_bytes(b"definitely not a gguf file" * 10)
    with pytest.raises(GGUFError, match="not a readable GGUF"):
        read_gguf(fake)
