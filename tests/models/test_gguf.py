"""Reading the packaged SmolLM2 GGUF: shape from metadata, exact bytes from the tensor table."""

from __future__ import annotations

import json

import pytest

from tokenomy.models import formulas as F
from tokenomy.models.gguf import GGUFError, cache_dir, read_gguf
from tokenomy.tools.plan.presets import preset_model


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


def write_gguf(path, arch, layers, meta, layer_tensors, tied=False):
    """A tiny but well-formed GGUF written with the gguf package's own writer."""
    import numpy as np
    from gguf import GGUFWriter

    w = GGUFWriter(str(path), arch)
    w.add_block_count(layers)
    w.add_embedding_length(32)
    w.add_feed_forward_length(64)
    w.add_head_count(2)
    w.add_head_count_kv(1)
    w.add_key_length(16)
    w.add_vocab_size(64)
    for add, value in meta:
        getattr(w, add)(value)
    w.add_tensor("token_embd.weight", np.zeros((64, 32), np.float32))
    if not tied:
        w.add_tensor("output.weight", np.zeros((64, 32), np.float16))
    for i in range(layers):
        for name, shape in layer_tensors(i):
            w.add_tensor(f"blk.{i}.{name}", np.zeros(shape, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_hybrid_moe_file_gives_layer_kinds_state_and_expert_bytes(tmp_path):
    def tensors(i):
        mixer = [("attn_q.weight", (64, 32)), ("attn_k.weight", (16, 32)), ("attn_v.weight", (16, 32))] \
            if i % 4 == 3 else [("ssm_in.weight", (96, 32)), ("ssm_out.weight", (32, 32))]
        return mixer + [("ffn_gate_exps.weight", (8, 16, 32)), ("ffn_up_exps.weight", (8, 16, 32)),
                        ("ffn_down_exps.weight", (8, 32, 16))]

    meta = [("add_full_attention_interval", 4), ("add_ssm_conv_kernel", 4), ("add_ssm_state_size", 8),
            ("add_ssm_group_count", 2), ("add_ssm_time_step_rank", 4), ("add_ssm_inner_size", 32),
            ("add_expert_count", 8), ("add_expert_used_count", 2), ("add_expert_feed_forward_length", 16)]
    spec = read_gguf(write_gguf(tmp_path / "hybrid.gguf", "qwen3next", 8, meta, tensors))
    assert spec.layer_types == ("linear", "linear", "linear", "full") * 2
    assert (spec.linear.num_key_heads, spec.linear.num_value_heads, spec.linear.value_head_dim) == (2, 4, 8)
    assert spec.moe.experts == 8 and spec.moe.active == 2 and not spec.tied_embeddings
    expert_params = 8 * 3 * 8 * 16 * 32
    assert spec.file.expert_params == expert_params and spec.file.expert_bytes == 4 * expert_params
    counts = F.param_counts(spec)
    assert counts.active == counts.total - expert_params + expert_params * 2 // 8
    # only the 2 full-attention layers cache K and V: 2 layers x 2 x 1 head x 16 dims x 2 bytes
    assert F.kv_bytes_per_token(spec, "fp16") == 2 * 2 * 1 * 16 * 2
    assert F.state_bytes_per_sequence(spec) > 0


def test_gemma3_file_without_a_pattern_key_uses_llama_cpp_pattern_and_tied_head(tmp_path):
    def tensors(i):
        return [("attn_q.weight", (32, 32)), ("attn_k.weight", (16, 32)), ("attn_v.weight", (16, 32))]

    spec = read_gguf(write_gguf(tmp_path / "g.gguf", "gemma3", 12, [("add_sliding_window", 512)], tensors, tied=True))
    assert spec.tied_embeddings and spec.sliding_window == 512
    assert [i for i, k in enumerate(spec.layer_types) if k == "full"] == [5, 11]
