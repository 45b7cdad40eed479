"""The `local` probe measures this machine."""

from __future__ import annotations

from tokenomy.tools.plan.presets import resolve_hardware
from tokenomy.tools.plan.probe import matmul_flops, memory_bytes, read_bandwidth


def test_probe_measures_plausible_bandwidth_and_flops():
    hw = resolve_hardware("local")
    assert hw.measured and hw.key == "local"
    # any machine that runs this: between 100 MB/s and 10 TB/s, and 100 MFLOP/s to 1 PFLOP/s
    assert 1e8 < hw.bandwidth < 1e13
    assert 1e8 < hw.flops["fp32"] < 1e15
    assert hw.memory_bytes == memory_bytes() > 2**28
    assert hw.peak("bf16") == (hw.flops["fp32"], "fp32")  # only fp32 is measured; every dtype falls back
    assert resolve_hardware("local") is hw  # measured once per process


def test_probe_pieces_are_repeatable_within_an_order_of_magnitude():
    a, b = read_bandwidth(megabytes=64, budget_s=0.2), read_bandwidth(megabytes=64, budget_s=0.2)
    assert 0.1 < a / b < 10
    assert matmul_flops(n=256, budget_s=0.1) > 1e8
