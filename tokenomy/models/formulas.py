"""Every formula the planner uses, one function each; the docstring states the formula.

Notation: h hidden size, L layers, H query heads, Hkv KV heads, d head dim, V vocabulary, I FFN width,
E experts per MoE layer, k experts routed per token, B batch (concurrent sequences), C context tokens held,
P prompt tokens, BW memory bandwidth (bytes/s), F peak dense FLOP/s for the math dtype.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from tokenomy.models.shape import ModelShape

# Bits stored per weight. int4 is 4 bits plus one fp16 scale per 32 weights (GGUF Q4_0, GPTQ/AWQ at group 32).
WEIGHT_BITS: dict[str, float] = {"fp32": 32, "fp16": 16, "bf16": 16, "fp8": 8, "int8": 8, "int4": 4.5}
# Bits stored per KV element: q8 and q4 are llama.cpp's q8_0 (34 bytes per 32) and q4_0 (18 bytes per 32).
KV_BITS: dict[str, float] = {"fp32": 32, "fp16": 16, "bf16": 16, "fp8": 8, "q8": 8.5, "q4": 4.5}
# The math each weight format runs on: int4 is weight-only (dequantised to bf16), int8 is W8A8.
MATH_DTYPE: dict[str, str] = {"fp32": "fp32", "fp16": "fp16", "bf16": "bf16", "fp8": "fp8", "int8": "int8",
                              "int4": "bf16"}
# Linear-attention recurrent state is kept in bf16 whatever the KV format (nobody quantises it).
STATE_BYTES = 2
# Power model constants (assumptions, not measurements): an idle board draws 15% of TDP, and a saturated memory
# system alone (tensor cores idle) half of the dynamic range.
IDLE_FRACTION = 0.15
MEMORY_POWER_SHARE = 0.5


@dataclass(frozen=True)
class ParamCounts:
    total: int
    active: int  # per token: everything but the routed experts a token does not use
    embedding: int  # the input embedding table, V x h
    expert: int  # all routed experts together (0 for a dense model)


def attention_params(spec: ModelShape, kind: str) -> int:
    """Weights of one attention block.

    GQA: h*H*d*(2 if output gate else 1) (Q) + 2*h*Hkv*d (K, V) + H*d*h (O).
    MLA: h*q_lora + q_lora*H*(nope+rope) (Q, or h*H*(nope+rope) without q_lora) + h*(kv_lora+rope)
         + kv_lora*H*(nope+v) (K, V up-projection) + H*v*h (O).
    Gated DeltaNet (linear): h*(2*Nk*dk + 2*Nv*dv) (QKVZ) + h*2*Nv (beta, alpha) + (2*Nk*dk + Nv*dv)*kernel (conv)
         + Nv*dv*h (O). Norm vectors are ignored everywhere (< 0.01%).
    """
    h = spec.hidden
    if kind == "linear":
        la = spec.linear
        assert la is not None, "linear layers need a linear-attention shape"
        key_dim, value_dim = la.num_key_heads * la.key_head_dim, la.num_value_heads * la.value_head_dim
        return (h * (2 * key_dim + 2 * value_dim) + h * 2 * la.num_value_heads
                + (2 * key_dim + value_dim) * la.conv_kernel + value_dim * h)
    if spec.mla is not None:
        m, heads = spec.mla, spec.heads
        qk = m.qk_nope_head_dim + m.qk_rope_head_dim
        q = h * m.q_lora_rank + m.q_lora_rank * heads * qk if m.q_lora_rank else h * heads * qk
        kv = h * (m.kv_lora_rank + m.qk_rope_head_dim) + m.kv_lora_rank * heads * (m.qk_nope_head_dim + m.v_head_dim)
        return q + kv + heads * m.v_head_dim * h
    q_width = spec.heads * spec.head_dim * (2 if spec.attn_output_gate else 1)
    return h * q_width + 2 * h * spec.kv_heads * spec.head_dim + spec.heads * spec.head_dim * h


def ffn_params(spec: ModelShape, layer: int) -> tuple[int, int, int]:
    """Weights of one layer's FFN as (total, active per token, routed experts), gated (3 matrices) throughout.

    Dense: 3*h*I. MoE: h*E (router) + E*3*h*I_e (routed) + S*3*h*I_s (shared); active replaces E by k.
    """
    h, moe = spec.hidden, spec.moe
    if moe is None or layer in moe.dense_layers:
        dense = 3 * h * spec.intermediate
        return dense, dense, 0
    one_expert = 3 * h * moe.expert_intermediate
    always = h * moe.experts + moe.shared_experts * 3 * h * moe.shared_intermediate
    return always + moe.experts * one_expert, always + moe.active * one_expert, moe.experts * one_expert


def param_counts(spec: ModelShape) -> ParamCounts:
    """Total = V*h (embedding) + V*h (LM head, unless tied) + sum over layers (attention + FFN).

    Active = total - routed experts + k/E of them. A model read from a file counts its tensors exactly instead.
    """
    embedding = spec.vocab * spec.hidden
    if spec.file is not None:
        f, moe = spec.file, spec.moe
        routed_active = f.expert_params * moe.active // moe.experts if moe else 0
        return ParamCounts(f.params, f.params - f.expert_params + routed_active, embedding, f.expert_params)
    total = embedding * (1 if spec.tied_embeddings else 2)
    active, expert = total, 0
    for layer in range(spec.layers):
        attn = attention_params(spec, spec.kind(layer))
        ffn_total, ffn_active, ffn_expert = ffn_params(spec, layer)
        total += attn + ffn_total
        active += attn + ffn_active
        expert += ffn_expert
    return ParamCounts(total, active, embedding, expert)


@dataclass(frozen=True)
class WeightBytes:
    total: int
    active: int
    expert: int  # bytes of all routed experts
    label: str  # the format, e.g. "bf16" or "gguf Q4_1"


def weight_bytes(spec: ModelShape, weights: str | None) -> WeightBytes:
    """bytes = params * bits/8 for `weights` (None: the model's native dtype, or a file's real tensor bytes)."""
    counts = param_counts(spec)
    if weights is None and spec.file is not None:
        f = spec.file
        moe = spec.moe
        active = f.bytes - f.expert_bytes + (f.expert_bytes * moe.active // moe.experts if moe else 0)
        return WeightBytes(f.bytes, active, f.expert_bytes, f"gguf {f.label}")
    dtype = weights or spec.dtype
    per = WEIGHT_BITS[dtype] / 8
    return WeightBytes(round(counts.total * per), round(counts.active * per), round(counts.expert * per), dtype)


def math_dtype(weights_label: str) -> str:
    """The dtype the matmuls run in: MATH_DTYPE[weights]; quantised file formats dequantise to bf16 (fp32 on CPU)."""
    return MATH_DTYPE.get(weights_label, "bf16")


def distinct_experts(experts: int, active: int, tokens: int) -> float:
    """Expected experts touched per MoE layer when `tokens` tokens each route to k of E uniformly:
    E * (1 - (1 - k/E) ** tokens). One token: k; many tokens: all E.
    """
    if tokens <= 0:
        return 0.0
    return experts * (1.0 - (1.0 - active / experts) ** tokens)


def weight_bytes_read(spec: ModelShape, wb: WeightBytes, tokens: int) -> float:
    """Weight bytes streamed by one forward pass over `tokens` tokens (each weight read once per pass):
    dense bytes + routed-expert bytes * distinct_experts(E, k, tokens) / E.
    """
    if spec.moe is None or wb.expert == 0:
        return float(wb.total)
    frac = distinct_experts(spec.moe.experts, spec.moe.active, tokens) / spec.moe.experts
    return (wb.total - wb.expert) + wb.expert * frac


def kv_elements_per_layer_token(spec: ModelShape) -> int:
    """Cached elements per token per attention layer: 2*Hkv*d (K and V), or kv_lora + rope for MLA."""
    if spec.mla is not None:
        return spec.mla.kv_lora_rank + spec.mla.qk_rope_head_dim
    return 2 * spec.kv_heads * spec.head_dim


def kv_bytes_per_token(spec: ModelShape, kv: str) -> float:
    """KV bytes each context token adds: full-attention layers * kv_elements_per_layer_token * KV_BITS/8.

    Sliding-window layers stop growing at their window and linear-attention layers never grow, so they are
    counted per sequence (kv_bytes_per_sequence), not here.
    """
    full = spec.count("full") + (spec.count("sliding") if spec.sliding_window is None else 0)
    return full * kv_elements_per_layer_token(spec) * KV_BITS[kv] / 8


def state_bytes_per_sequence(spec: ModelShape) -> int:
    """Constant recurrent state per sequence of the linear-attention layers:
    n_linear * (Nv*dk*dv (delta-rule state) + (2*Nk*dk + Nv*dv)*(kernel-1) (conv state)) * STATE_BYTES.
    """
    la = spec.linear
    n = spec.count("linear")
    if la is None or n == 0:
        return 0
    state = la.num_value_heads * la.key_head_dim * la.value_head_dim
    conv = (2 * la.num_key_heads * la.key_head_dim + la.num_value_heads * la.value_head_dim) * (la.conv_kernel - 1)
    return n * (state + conv) * STATE_BYTES


def kv_bytes_per_sequence(spec: ModelShape, kv: str, context: int) -> float:
    """Cache held by one sequence of C tokens: kv_bytes_per_token * C
    + n_sliding * kv_elements_per_layer_token * min(C, window) * KV_BITS/8 + state_bytes_per_sequence.
    """
    sliding = 0.0
    if spec.sliding_window is not None:
        sliding = spec.count("sliding") * kv_elements_per_layer_token(spec) * min(context, spec.sliding_window)
    return kv_bytes_per_token(spec, kv) * context + sliding * KV_BITS[kv] / 8 + state_bytes_per_sequence(spec)


def matmul_params(spec: ModelShape, counts: ParamCounts) -> int:
    """Parameters that take part in a matmul per token: active, less the input embedding when it is untied
    (a lookup, not a product; a tied table is used as the LM head).
    """
    return counts.active - (0 if spec.tied_embeddings else counts.embedding)


def attention_pair_flops(spec: ModelShape, absorbed: bool = True) -> float:
    """FLOPs for one query token against one cached token in one attention layer: 2*H*(dqk + dv).
    GQA: dqk = dv = d. MLA decode works in the latent (absorbed): dqk = kv_lora + rope, dv = kv_lora;
    MLA prefill decompresses: dqk = nope + rope, dv = v_head_dim.
    """
    if spec.mla is None:
        return 2.0 * spec.heads * 2 * spec.head_dim
    m = spec.mla
    if absorbed:
        return 2.0 * spec.heads * (2 * m.kv_lora_rank + m.qk_rope_head_dim)
    return 2.0 * spec.heads * (m.qk_nope_head_dim + m.qk_rope_head_dim + m.v_head_dim)


def linear_token_flops(spec: ModelShape) -> float:
    """Per token, all linear-attention layers: n_linear * 4*Nv*dk*dv (delta-rule state update and read-out)."""
    la = spec.linear
    if la is None:
        return 0.0
    return spec.count("linear") * 4.0 * la.num_value_heads * la.key_head_dim * la.value_head_dim


def attention_flops_per_token(spec: ModelShape, context: int) -> float:
    """Attention FLOPs for one new token over C cached tokens:
    attention_pair_flops * (n_full * C + n_sliding * min(C, window)) + linear_token_flops.
    """
    window = spec.sliding_window or context
    pairs = spec.count("full") * context + spec.count("sliding") * min(context, window)
    return attention_pair_flops(spec) * pairs + linear_token_flops(spec)


def flops_per_token(spec: ModelShape, counts: ParamCounts, context: int) -> float:
    """Decode FLOPs per token: 2 * matmul_params + attention_flops_per_token(C)."""
    return 2.0 * matmul_params(spec, counts) + attention_flops_per_token(spec, context)


def prefill_flops(spec: ModelShape, counts: ParamCounts, prompt: int) -> float:
    """FLOPs to prefill one prompt of P tokens: 2 * matmul_params * P + linear_token_flops * P
    + attention_pair_flops(decompressed) * (n_full * P(P+1)/2 + n_sliding * sum_i min(i, window)) (causal).
    """
    pairs_full = prompt * (prompt + 1) / 2
    w = spec.sliding_window or prompt
    pairs_sliding = pairs_full if prompt <= w else w * (w + 1) / 2 + (prompt - w) * w
    pairs = spec.count("full") * pairs_full + spec.count("sliding") * pairs_sliding
    return (2.0 * matmul_params(spec, counts) + linear_token_flops(spec)) * prompt \
        + attention_pair_flops(spec, absorbed=False) * pairs


def time_floor(bytes_moved: float, flops: float, bandwidth: float, peak: float) -> tuple[float, float]:
    """Roofline times for one step: (memory time = bytes / BW, compute time = FLOPs / F); the step takes the max."""
    return bytes_moved / bandwidth, flops / peak


def arithmetic_intensity(flops: float, bytes_moved: float) -> float:
    """FLOPs per byte moved. Decode at batch B is about B * 2N / (N * bytes per weight), i.e. ~B for 16-bit."""
    return flops / bytes_moved if bytes_moved else math.inf


def ridge_point(peak: float, bandwidth: float) -> float:
    """F / BW: the intensity (FLOP/byte) above which a step is compute bound."""
    return peak / bandwidth


def max_sequences(memory_bytes: float, utilization: float, weights: float, per_sequence: float) -> int:
    """floor((memory * utilization - weight bytes) / KV bytes per sequence), 0 when the weights do not fit."""
    free = memory_bytes * utilization - weights
    if free <= 0 or per_sequence <= 0:
        return 0
    return int(free // per_sequence)


def gpus_for_weights(memory_bytes: float, utilization: float, weights: float) -> int:
    """Smallest chip count whose usable memory holds the weights: ceil(weights / (memory * utilization))."""
    return max(1, math.ceil(weights / (memory_bytes * utilization)))


def power_watts(tdp_w: float, memory_time: float, compute_time: float) -> float:
    """Board power estimate at the implied utilisation (an assumption-laden linear model, labelled estimate):
    W = TDP * (IDLE_FRACTION + (1 - IDLE_FRACTION) * (MEMORY_POWER_SHARE * u_mem + (1 - MEMORY_POWER_SHARE) * u_flop)),
    u_mem = memory time / step time, u_flop = compute time / step time, step time = max of the two.
    """
    step = max(memory_time, compute_time)
    if step <= 0:
        return tdp_w * IDLE_FRACTION
    u_mem, u_flop = memory_time / step, compute_time / step
    dynamic = MEMORY_POWER_SHARE * u_mem + (1 - MEMORY_POWER_SHARE) * u_flop
    return tdp_w * (IDLE_FRACTION + (1 - IDLE_FRACTION) * dynamic)


def joules_per_token(watts: float, step_s: float, batch: int) -> float:
    """Energy per output token: W * step time / B (one step emits one token for each of B sequences)."""
    return watts * step_s / batch


def tokens_per_s(batch: int, step_s: float) -> float:
    """Aggregate decode ceiling: B / step time."""
    return batch / step_s


def usd_per_million_tokens(usd_per_hour: float, tokens_per_second: float) -> float:
    """Cost of 1M output tokens at full ceiling: USD/hour / 3600 / (tokens/s) * 1e6."""
    return usd_per_hour / 3600.0 / tokens_per_second * 1e6
