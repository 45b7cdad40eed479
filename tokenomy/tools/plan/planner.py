"""A plan: the formulas applied to one model on one machine under one workload, as one flat record."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from tokenomy.models import formulas as F
from tokenomy.models.shape import ModelShape
from tokenomy.tools.plan.inputs import HardwareSpec, Workload


class PlanInputError(ValueError):
    """A workload setting the formulas cannot use (unknown dtype, non-positive size)."""


@dataclass
class Plan:
    """Everything `tokenomy plan` reports. Times in ms, sizes in bytes, rates per second; see formulas.py."""

    label: str
    model: str
    hardware: str
    hardware_measured: bool
    weights: str
    kv: str
    math_dtype: str
    batch: int
    prompt: int
    output: int
    context: int
    gpus: int
    params_total: int
    params_active: int
    weight_bytes: int
    weight_bytes_active: int
    kv_bytes_per_token: float
    kv_bytes_per_sequence: float
    state_bytes_per_sequence: int
    memory_bytes: float
    memory_utilization: float
    weights_fit: bool
    gpus_for_weights: int
    max_sequences: int
    weight_bytes_per_step: float
    kv_bytes_per_step: float
    flops_per_token: float
    tpot_floor_ms: float
    tpot_compute_ms: float
    tpot_ms: float
    bound: str
    arithmetic_intensity: float
    ridge_point: float
    bandwidth: float
    peak_flops: float
    prefill_ms: float
    prefill_bound: str
    prefill_arithmetic_intensity: float
    request_latency_s: float
    tokens_per_s_ceiling: float
    tokens_per_s_per_sequence: float
    tdp_w: float | None
    power_watts_estimate: float | None
    joules_per_token_estimate: float | None
    price_per_hour: float | None
    usd_per_million_tokens: float | None
    measured_tps: float | None = None
    achieved_ratio: float | None = None
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _check(w: Workload) -> None:
    if w.weights is not None and w.weights not in F.WEIGHT_BITS:
        raise PlanInputError(f"unknown weights format {w.weights!r}; valid: {', '.join(F.WEIGHT_BITS)}")
    if w.kv not in F.KV_BITS:
        raise PlanInputError(f"unknown KV format {w.kv!r}; valid: {', '.join(F.KV_BITS)}")
    for name in ("batch", "output", "gpus"):
        if getattr(w, name) < 1:
            raise PlanInputError(f"{name} must be at least 1, got {getattr(w, name)}")
    if w.prompt < 0 or w.context_tokens < 1:
        raise PlanInputError("prompt must be >= 0 and context >= 1")
    if not 0 < w.memory_utilization <= 1:
        raise PlanInputError(f"memory utilization must be in (0, 1], got {w.memory_utilization}")
    for name in ("price_per_hour", "tdp_w", "measured_tps"):
        value = getattr(w, name)
        if value is not None and value <= 0:
            raise PlanInputError(f"{name.replace('_', '-')} must be positive, got {value}")


def make_plan(model: ModelShape, chip: HardwareSpec, w: Workload, label: str = "") -> Plan:
    """Compose the formulas: weights and KV sizes, capacity, one decode step's roofline, prefill, energy, cost."""
    _check(w)
    hw = chip.scaled(w.gpus)
    notes: list[str] = []
    counts = F.param_counts(model)
    wb = F.weight_bytes(model, w.weights)
    want = F.math_dtype(w.weights or (model.dtype if model.file is None else "file"))
    peak, used = hw.peak(want)
    if used != want and not hw.measured:
        notes.append(f"{hw.key} has no {want} math: {used} peak used")
    bw, C, B = hw.bandwidth, w.context_tokens, w.batch

    kv_token = F.kv_bytes_per_token(model, w.kv)
    kv_seq = F.kv_bytes_per_sequence(model, w.kv, C)
    capacity = F.max_sequences(hw.memory_bytes, w.memory_utilization, wb.total, kv_seq)
    fits = wb.total <= hw.memory_bytes * w.memory_utilization
    need = F.gpus_for_weights(chip.memory_bytes, w.memory_utilization, wb.total)
    if not fits:
        notes.append(f"weights ({wb.total / 1e9:.1f} GB) exceed usable memory: need --gpus {need} or more "
                     "(times below assume they fit)")
    elif B > capacity:
        notes.append(f"batch {B} exceeds the {capacity} sequences whose KV cache fits at context {C}")

    weight_read = F.weight_bytes_read(model, wb, B)
    kv_read = B * kv_seq
    per_token = F.flops_per_token(model, counts, C)
    t_mem, t_flop = F.time_floor(weight_read + kv_read, B * per_token, bw, peak)
    step = max(t_mem, t_flop)
    intensity = F.arithmetic_intensity(B * per_token, weight_read + kv_read)
    ridge = F.ridge_point(peak, bw)

    pre_flops = B * F.prefill_flops(model, counts, w.prompt)
    pre_bytes = F.weight_bytes_read(model, wb, B * w.prompt) + B * F.kv_bytes_per_sequence(model, w.kv, w.prompt)
    p_mem, p_flop = F.time_floor(pre_bytes, pre_flops, bw, peak)
    prefill = max(p_mem, p_flop) if w.prompt else 0.0

    tdp = w.tdp_w if w.tdp_w is not None else hw.tdp_w
    if w.tdp_w is not None and w.gpus > 1:
        tdp = w.tdp_w * w.gpus
    watts = joules = None
    if tdp is not None:
        watts = F.power_watts(tdp, t_mem, t_flop)
        joules = F.joules_per_token(watts, step, B)
    else:
        notes.append("no board power known for this machine: pass --tdp-watts for an energy estimate")
    tps = F.tokens_per_s(B, step)
    usd = None
    if w.price_per_hour is not None:
        usd = F.usd_per_million_tokens(w.price_per_hour * w.gpus, tps)
    ratio = w.measured_tps / tps if w.measured_tps is not None else None

    return Plan(
        label=label or f"{model.key} on {hw.key}",
        model=model.key, hardware=hw.key, hardware_measured=hw.measured, weights=wb.label, kv=w.kv,
        math_dtype=used, batch=B, prompt=w.prompt, output=w.output, context=C, gpus=w.gpus,
        params_total=counts.total, params_active=counts.active, weight_bytes=wb.total,
        weight_bytes_active=wb.active, kv_bytes_per_token=kv_token, kv_bytes_per_sequence=kv_seq,
        state_bytes_per_sequence=F.state_bytes_per_sequence(model), memory_bytes=hw.memory_bytes,
        memory_utilization=w.memory_utilization, weights_fit=fits, gpus_for_weights=need, max_sequences=capacity,
        weight_bytes_per_step=weight_read, kv_bytes_per_step=kv_read, flops_per_token=per_token,
        tpot_floor_ms=t_mem * 1e3, tpot_compute_ms=t_flop * 1e3, tpot_ms=step * 1e3,
        bound="compute" if t_flop > t_mem else "memory", arithmetic_intensity=intensity, ridge_point=ridge,
        bandwidth=bw, peak_flops=peak, prefill_ms=prefill * 1e3,
        prefill_bound="compute" if p_flop > p_mem else "memory",
        prefill_arithmetic_intensity=F.arithmetic_intensity(pre_flops, pre_bytes),
        request_latency_s=prefill + w.output * step, tokens_per_s_ceiling=tps, tokens_per_s_per_sequence=1 / step,
        tdp_w=tdp, power_watts_estimate=watts, joules_per_token_estimate=joules, price_per_hour=w.price_per_hour,
        usd_per_million_tokens=usd, measured_tps=w.measured_tps, achieved_ratio=ratio, notes=notes,
    )
