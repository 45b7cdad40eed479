"""The formulas against the seed figures and the publishers' own parameter counts."""

from __future__ import annotations

import pytest

from tokenomy.models import formulas as F
from tokenomy.tools.plan.inputs import Workload
from tokenomy.tools.plan.presets import model_names, preset_hardware, preset_model


def test_70b_fp16_on_h100_sxm_reads_140_gb_per_step_42_ms():
    model, h100 = preset_model("llama-3-70b"), preset_hardware("h100-sxm")
    wb = F.weight_bytes(model, "fp16")
    assert 139e9 < wb.total < 143e9
    memory_s, _ = F.time_floor(F.weight_bytes_read(model, wb, 1), 0.0, h100.bandwidth, 1.0)
    assert 41e-3 <= memory_s <= 43e-3


def test_llama_8b_bf16_on_h100_about_4_8_ms():
    model, h100 = preset_model("llama-3-8b"), preset_hardware("h100-sxm")
    memory_s = F.weight_bytes(model, "bf16").total / h100.bandwidth
    assert memory_s * 1e3 == pytest.approx(4.8, abs=0.1)


def test_qwen3_next_kv_at_128k_counts_only_its_12_full_attention_layers():
    model = preset_model("qwen3-next-80b-a3b")
    assert model.count("full") == 12 and model.count("linear") == 36
    ctx = 131_072
    hybrid = F.kv_bytes_per_token(model, "bf16") * ctx
    assert 3.0e9 <= hybrid <= 3.3e9
    # the linear layers add a constant state, which must not push the sequence out of the seed's range
    per_sequence = F.kv_bytes_per_sequence(model, "bf16", ctx)
    assert hybrid < per_sequence <= 3.3e9
    assert F.state_bytes_per_sequence(model) == F.kv_bytes_per_sequence(model, "bf16", 1) - \
        F.kv_bytes_per_token(model, "bf16")
    all_full = model.all_full_attention()
    assert all_full.count("full") == 48
    assert 12e9 <= F.kv_bytes_per_sequence(all_full, "bf16", ctx) <= 13e9


@pytest.mark.parametrize("key", model_names())
def test_parameter_formula_matches_published_totals(key):
    model = preset_model(key, use_file=False)
    counts = F.param_counts(model)
    assert counts.total == pytest.approx(model.reported_params["total"], rel=0.01)


@pytest.mark.parametrize("key", ["qwen3-30b-a3b", "deepseek-v3", "mixtral-8x7b"])
def test_moe_active_parameters_match_published(key):
    model = preset_model(key)
    assert F.param_counts(model).active == pytest.approx(model.reported_params["active"], rel=0.03)


def test_qwen3_next_active_excluding_embeddings_is_about_3b():
    model = preset_model("qwen3-next-80b-a3b")
    counts = F.param_counts(model)
    assert counts.active - 2 * counts.embedding == pytest.approx(3e9, rel=0.1)


def test_distinct_experts_goes_from_k_to_all():
    assert F.distinct_experts(128, 8, 1) == pytest.approx(8)
    assert F.distinct_experts(128, 8, 2) == pytest.approx(128 * (1 - (120 / 128) ** 2))
    assert F.distinct_experts(128, 8, 10_000) == pytest.approx(128)


def test_moe_reads_more_weights_as_batch_grows_but_never_more_than_total():
    model = preset_model("qwen3-30b-a3b")
    wb = F.weight_bytes(model, "bf16")
    reads = [F.weight_bytes_read(model, wb, b) for b in (1, 4, 32, 4096)]
    assert reads[0] == pytest.approx(wb.active, rel=1e-6)
    assert reads == sorted(reads)
    assert reads[-1] == pytest.approx(wb.total, rel=1e-3)


def test_mla_caches_one_latent_per_layer():
    model = preset_model("deepseek-v3")
    assert F.kv_bytes_per_token(model, "bf16") == 61 * (512 + 64) * 2


def test_sliding_window_layers_stop_growing_at_the_window():
    model = preset_model("gemma3-270m", use_file=False)
    assert model.count("full") == 3 and model.count("sliding") == 15
    per_layer_token = F.kv_elements_per_layer_token(model) * 2
    at_window = F.kv_bytes_per_sequence(model, "fp16", 512)
    at_8k = F.kv_bytes_per_sequence(model, "fp16", 8192)
    # only the 3 global layers keep growing past the window
    assert at_8k - at_window == pytest.approx(3 * per_layer_token * (8192 - 512))
    assert at_window == pytest.approx(18 * per_layer_token * 512)


def test_quantised_formats_shrink_bytes_by_their_bits():
    model = preset_model("llama-3-8b")
    fp16 = F.weight_bytes(model, "fp16").total
    assert F.weight_bytes(model, "int4").total == pytest.approx(fp16 * 4.5 / 16, rel=1e-6)
    assert F.kv_bytes_per_token(model, "fp8") == F.kv_bytes_per_token(model, "fp16") / 2
    assert F.kv_bytes_per_token(model, "q4") == pytest.approx(F.kv_bytes_per_token(model, "fp16") * 4.5 / 16)


def test_decode_intensity_is_about_batch_for_16_bit_dense_weights():
    model = preset_model("llama-3-8b")
    counts, wb = F.param_counts(model), F.weight_bytes(model, "bf16")
    for batch in (1, 8, 64):
        flops = batch * F.flops_per_token(model, counts, 1)
        intensity = F.arithmetic_intensity(flops, F.weight_bytes_read(model, wb, batch))
        assert intensity == pytest.approx(batch, rel=0.1)


def test_prefill_attention_grows_quadratically():
    model = preset_model("llama-3-8b")
    counts = F.param_counts(model)
    linear_part = 2 * F.matmul_params(model, counts)
    a1 = F.prefill_flops(model, counts, 1000) - linear_part * 1000
    a2 = F.prefill_flops(model, counts, 2000) - linear_part * 2000
    assert a2 / a1 == pytest.approx(4, rel=0.01)


def test_capacity_and_cost_formulas():
    assert F.max_sequences(100e9, 0.9, 50e9, 1e9) == 40
    assert F.max_sequences(100e9, 0.9, 95e9, 1e9) == 0
    assert F.gpus_for_weights(80e9, 0.9, 141e9) == 2
    # $3.60/h at 1,000 tok/s = 3.6M tokens per dollar-hour -> $1 per 1M
    assert F.usd_per_million_tokens(3.6, 1000) == pytest.approx(1.0)


def test_power_estimate_between_idle_and_tdp():
    memory_bound = F.power_watts(700, memory_time=1.0, compute_time=0.01)
    balanced = F.power_watts(700, memory_time=1.0, compute_time=1.0)
    assert 700 * F.IDLE_FRACTION < memory_bound < balanced == pytest.approx(700)


def test_workload_context_defaults_to_prompt_plus_output():
    assert Workload(prompt=100, output=28).context_tokens == 128
    assert Workload(prompt=100, output=28, context=4096).context_tokens == 4096
