from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.helpers.synthetic import HandCounter
from tokenomy.hardware.energy import (
    CpuEstimateSource,
    Energy,
    EnergyAccount,
    EnergyMeter,
    NvmlSource,
    RaplSource,
    detect,
    label,
    share,
)
from tokenomy.metrics.prometheus import Metrics


def test_share_is_proportional_to_tokens_and_sums_to_the_step():
    shares = share(12.0, {"a": 1, "b": 3, "c": 8})
    assert shares == pytest.approx({"a": 1.0, "b": 3.0, "c": 8.0})
    assert sum(shares.values()) == pytest.approx(12.0)
    assert share(6.0, {"a": 0, "b": 0}) == {"a": 3.0, "b": 3.0}     # nothing counted: split evenly
    assert share(5.0, {}) == {}
    with pytest.raises(ValueError):
        share(-1.0, {"a": 1})
    with pytest.raises(ValueError):
        share(1.0, {"a": -1})


def _powercap(root: Path, zones: dict[str, tuple[int, int]]) -> None:
    for name, (energy, max_range) in zones.items():
        (root / name).mkdir(parents=True, exist_ok=True)
        (root / name / "energy_uj").write_text(f"{energy}\n")
        (root / name / "max_energy_range_uj").write_text(f"{max_range}\n")


def test_rapl_sums_packages_skips_subzones_and_survives_wraparound(tmp_path):
    _powercap(tmp_path, {"intel-rapl:0": (1_000_000, 10_000_000), "intel-rapl:1": (5_000_000, 10_000_000),
                         "intel-rapl:0:0": (900_000, 10_000_000)})      # a subzone: part of package 0
    src = RaplSource(tmp_path)
    assert [z.name for z in src.zones] == ["intel-rapl:0", "intel-rapl:1"]
    assert src.read_joules() == 0.0
    _powercap(tmp_path, {"intel-rapl:0": (3_000_000, 10_000_000), "intel-rapl:1": (9_500_000, 10_000_000),
                         "intel-rapl:0:0": (99_000_000, 10_000_000)})
    assert src.read_joules() == pytest.approx(2.0 + 4.5)
    _powercap(tmp_path, {"intel-rapl:0": (4_000_000, 10_000_000), "intel-rapl:1": (500_000, 10_000_000)})  # wrapped
    assert src.read_joules() == pytest.approx(6.5 + 1.0 + 1.0)
    assert label(src.name) == "measured"


def test_rapl_absent_or_unreadable_falls_back_to_the_estimate(tmp_path):
    with pytest.raises(RuntimeError, match="no RAPL"):
        RaplSource(tmp_path)
    src = detect(watts_per_core=10.0, powercap=tmp_path)
    assert src.name == ("nvml" if _has_nvml() else "estimate")
    if src.name == "estimate":
        assert isinstance(src, CpuEstimateSource) and src.watts_per_core == 10.0
    with pytest.raises(RuntimeError, match="not available"):
        detect(powercap=tmp_path, prefer="rapl")
    with pytest.raises(ValueError, match="unknown energy source"):
        detect(prefer="battery")


def test_cpu_estimate_is_cpu_time_times_watts_per_core():
    src = CpuEstimateSource(watts_per_core=20.0)
    j0, c0 = src.read_joules(), time.process_time()
    deadline = time.process_time() + 0.2
    x = 0
    while time.process_time() < deadline:        # burn CPU in this process
        x += 1
    j1, c1 = src.read_joules(), time.process_time()
    assert j1 - j0 == pytest.approx(20.0 * (c1 - c0), rel=0.25, abs=0.3)
    assert j1 - j0 > 2.0
    with pytest.raises(ValueError):
        CpuEstimateSource(0)
    assert label("estimate") == "estimate" and label(None) is None


def test_step_joules_charges_a_step_its_share_of_time_not_the_idle_before_it():
    clock = [1000.0]
    src = HandCounter()
    meter = EnergyMeter(src, clock=lambda: clock[0])
    clock[0] += 0.05                      # a busy step: 50 ms, 5 J, back to back
    src.j += 5.0
    assert meter.step_joules(0.05) == pytest.approx(5.0)
    clock[0] += 10.0                      # 9.9 s idle then a 0.1 s step; 30 J in all over 10 s
    src.j += 30.0
    assert meter.step_joules(0.1) == pytest.approx(30.0 * 0.1 / 10.0)
    assert meter.total_joules() == pytest.approx(35.0)
    assert meter.step_joules(0.0) == 0.0
    clock[0] += 2.0
    src.j += 8.0
    assert meter.power_watts() == pytest.approx(43.0 / 12.05)      # mean since the meter started
    assert meter.label == "measured"


def test_energy_account_accumulates_per_request_and_pops_once():
    clock = [0.0]
    src = HandCounter()
    acct = EnergyAccount(EnergyMeter(src, clock=lambda: clock[0]))
    for tokens in ({"r1": 100, "r2": 28}, {"r1": 1, "r2": 1, "r3": 2}):
        clock[0] += 0.1
        src.j += 4.0
        acct.on_step(0.1, tokens)
    e1 = acct.pop("r1")
    assert e1 == Energy(pytest.approx(4.0 * 100 / 128 + 1.0), "rapl")
    assert acct.pop("r1") is None
    assert acct.pop("r2").joules + acct.pop("r3").joules + e1.joules == pytest.approx(8.0)
    assert len(acct) == 0


def test_hardware_metrics_are_exported_with_their_source():
    m = Metrics()
    meter = EnergyMeter(CpuEstimateSource(15.0))
    m.watch_hardware(meter)
    text = m.render().decode()
    assert 'tokenomy_hw_energy_joules_total{source="estimate"}' in text
    assert 'tokenomy_hw_memory_bytes{kind="rss"}' in text
    text = m.render().decode()
    assert 'tokenomy_hw_power_watts{source="estimate"}' in text


def _has_nvml() -> bool:
    try:
        NvmlSource()
    except Exception:
        return False
    return True


@pytest.mark.skipif(not _has_nvml(), reason="no NVIDIA GPU with an energy counter (NVML) on this machine")
def test_nvml_counter_is_measured_and_monotonic():
    src = detect()
    assert src.name == "nvml"
    a = src.read_joules()
    time.sleep(0.5)
    b = src.read_joules()
    assert b >= a > 0
    assert src.power_watts() > 0 and src.memory_bytes() > 0
    meter = EnergyMeter(src)
    assert meter.label == "measured"


def test_energy_account_is_bounded():
    acct = EnergyAccount(EnergyMeter(HandCounter()), max_entries=3)
    acct.add({"a": 1.0, "b": 1.0, "c": 1.0, "d": 1.0})
    assert len(acct) == 3 and acct.pop("a") is None and acct.pop("d").joules == 1.0
