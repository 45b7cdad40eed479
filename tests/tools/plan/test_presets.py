"""Preset data and name resolution."""

from __future__ import annotations

import pytest

from tokenomy.models import formulas as F
from tokenomy.tools.plan.presets import (
    PresetError,
    hardware_names,
    model_names,
    preset_hardware,
    preset_model,
    resolve_hardware,
    resolve_model,
)

ISSUE_MODELS = ["llama-3-8b", "llama-3-70b", "llama-3-405b", "qwen3-32b", "qwen3-30b-a3b", "qwen3-next-80b-a3b",
                "deepseek-v3", "mixtral-8x7b", "smollm2-135m-instruct", "gemma3-270m"]
ISSUE_HARDWARE = ["h100-sxm", "h200", "a100-80gb", "b200", "l4", "mi300x", "local"]


def test_every_preset_named_in_the_issue_exists():
    assert set(ISSUE_MODELS) <= set(model_names())
    assert set(ISSUE_HARDWARE) <= set(hardware_names())


@pytest.mark.parametrize("key", [h for h in ISSUE_HARDWARE if h != "local"])
def test_hardware_presets_have_the_datasheet_fields(key):
    hw = preset_hardware(key)
    assert hw.memory_bytes >= 24 * 2**30 and hw.bandwidth >= 0.3e12 and hw.tdp_w >= 72
    assert hw.flops["bf16"] > hw.flops["fp32"]
    # ridge points of modern accelerators sit between ~100 and ~600 FLOP/byte in bf16
    assert 100 < F.ridge_point(hw.flops["bf16"], hw.bandwidth) < 600


def test_h100_numbers():
    hw = preset_hardware("h100-sxm")
    assert hw.bandwidth == 3.35e12 and hw.memory_bytes == 80 * 2**30 and hw.tdp_w == 700
    assert hw.flops["fp8"] == pytest.approx(2 * hw.flops["bf16"], rel=1e-3)


def test_qwen3_next_layer_pattern_is_every_fourth_layer_full():
    model = preset_model("qwen3-next-80b-a3b")
    assert [i for i in range(48) if model.kind(i) == "full"] == list(range(3, 48, 4))


def test_packaged_smollm2_plan_uses_the_real_gguf_bytes():
    with_file = resolve_model("smollm2-135m-instruct")
    without = preset_model("smollm2-135m-instruct", use_file=False)
    assert with_file.file is not None and with_file.file.label == "Q4_1"
    assert F.weight_bytes(with_file, None).label == "gguf Q4_1"
    # Q4_1 stores 5 bits per weight (+ a Q8_0 embedding): well under bf16, above a pure 4-bit count
    assert 0.5 * 135e6 < F.weight_bytes(with_file, None).total < F.weight_bytes(without, None).total / 2


def test_unknown_model_lists_valid_presets():
    with pytest.raises(PresetError) as e:
        resolve_model("llama-9000")
    assert "llama-9000" in str(e.value)
    for name in ISSUE_MODELS:
        assert name in str(e.value)


def test_unknown_hardware_lists_valid_names():
    with pytest.raises(PresetError) as e:
        resolve_hardware("tpu-v9")
    for name in ISSUE_HARDWARE:
        assert name in str(e.value)


def test_missing_model_file_is_a_clear_error(tmp_path):
    with pytest.raises(PresetError, match="no such file"):
        resolve_model(str(tmp_path / "nope" / "config.json"))
    with pytest.raises(PresetError, match="cannot open"):
        resolve_model(str(tmp_path / "nope.gguf"))
