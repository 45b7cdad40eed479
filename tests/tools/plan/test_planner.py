"""Plans: the composed figures move the way the physics says they must."""

from __future__ import annotations

import pytest

from tokenomy.tools.plan.inputs import Workload
from tokenomy.tools.plan.planner import PlanInputError, make_plan
from tokenomy.tools.plan.presets import preset_hardware, preset_model


@pytest.fixture(scope="module")
def llama8b():
    return preset_model("llama-3-8b")


@pytest.fixture(scope="module")
def h100():
    return preset_hardware("h100-sxm")


def test_decode_is_memory_bound_at_batch_1_and_compute_bound_with_a_big_short_batch(llama8b, h100):
    small = make_plan(llama8b, h100, Workload(batch=1))
    assert small.bound == "memory" and small.arithmetic_intensity < small.ridge_point
    big = make_plan(llama8b, h100, Workload(batch=2048, prompt=8, output=8))
    assert big.bound == "compute" and big.arithmetic_intensity > big.ridge_point
    assert big.tpot_ms == pytest.approx(big.tpot_compute_ms)


def test_long_context_keeps_decode_memory_bound_because_kv_reads_grow_with_batch(llama8b, h100):
    plan = make_plan(llama8b, h100, Workload(batch=256, prompt=8192, output=256))
    assert plan.bound == "memory"
    assert plan.kv_bytes_per_step > plan.weight_bytes_per_step


def test_batching_raises_throughput_and_cuts_energy_per_token(llama8b, h100):
    plans = [make_plan(llama8b, h100, Workload(batch=b)) for b in (1, 8, 64)]
    tps = [p.tokens_per_s_ceiling for p in plans]
    joules = [p.joules_per_token_estimate for p in plans]
    assert tps == sorted(tps) and tps[-1] > 10 * tps[0]
    assert joules == sorted(joules, reverse=True)


def test_capacity_counts_sequences_that_fit_beside_the_weights(llama8b, h100):
    plan = make_plan(llama8b, h100, Workload(prompt=3000, output=1096))
    usable = h100.memory_bytes * 0.9 - plan.weight_bytes
    assert plan.max_sequences == int(usable // plan.kv_bytes_per_sequence)
    assert plan.kv_bytes_per_sequence == pytest.approx(4096 * 131072)


def test_weights_that_do_not_fit_are_flagged_and_more_gpus_fix_it(h100):
    model = preset_model("llama-3-70b")
    one = make_plan(model, h100, Workload(weights="fp16"))
    assert not one.weights_fit and one.max_sequences == 0 and one.gpus_for_weights == 2
    assert any("--gpus 2" in n for n in one.notes)
    two = make_plan(model, h100, Workload(weights="fp16", gpus=2))
    assert two.weights_fit and two.max_sequences > 0
    assert two.tpot_floor_ms == pytest.approx(one.tpot_floor_ms / 2, rel=1e-6)


def test_int4_weights_cut_the_floor_and_fp8_kv_halves_the_cache(llama8b, h100):
    base = make_plan(llama8b, h100, Workload(weights="bf16"))
    int4 = make_plan(llama8b, h100, Workload(weights="int4"))
    fp8 = make_plan(llama8b, h100, Workload(kv="fp8"))
    assert int4.weight_bytes_per_step == pytest.approx(base.weight_bytes_per_step * 4.5 / 16, rel=1e-6)
    assert int4.tpot_floor_ms < base.tpot_floor_ms / 3
    assert fp8.kv_bytes_per_sequence == base.kv_bytes_per_sequence / 2


def test_fp8_on_a100_falls_back_to_bf16_math_and_says_so(llama8b):
    plan = make_plan(llama8b, preset_hardware("a100-80gb"), Workload(weights="fp8"))
    assert plan.math_dtype == "bf16"
    assert any("no fp8" in n for n in plan.notes)


def test_cost_and_measured_ratio(llama8b, h100):
    plan = make_plan(llama8b, h100, Workload(batch=16, price_per_hour=2.5, measured_tps=1000))
    assert plan.usd_per_million_tokens == pytest.approx(2.5 / 3600 / plan.tokens_per_s_ceiling * 1e6)
    assert plan.achieved_ratio == pytest.approx(1000 / plan.tokens_per_s_ceiling)


def test_no_price_means_no_cost(llama8b, h100):
    assert make_plan(llama8b, h100, Workload()).usd_per_million_tokens is None


@pytest.mark.parametrize("workload, message", [
    (Workload(weights="int3"), "unknown weights format"),
    (Workload(kv="q2"), "unknown KV format"),
    (Workload(batch=0), "batch"),
    (Workload(memory_utilization=1.5), "memory utilization"),
    (Workload(price_per_hour=-1), "price-per-hour"),
])
def test_bad_workloads_raise_clear_errors(llama8b, h100, workload, message):
    with pytest.raises(PlanInputError, match=message):
        make_plan(llama8b, h100, workload)
