"""What the planner plans for: a model's shape, a machine's limits, and the workload put on one by the other."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

LAYER_KINDS = ("full", "sliding", "linear")


@dataclass(frozen=True)
class MoE:
    """Mixture of experts: `experts` per MoE layer, `active` routed per token, plus always-on shared experts."""

    experts: int
    active: int
    expert_intermediate: int
    shared_experts: int = 0
    shared_intermediate: int = 0
    dense_layers: tuple[int, ...] = ()  # layer indices with a dense FFN instead (DeepSeek's first three)


@dataclass(frozen=True)
class MLA:
    """Multi-head latent attention (DeepSeek): the cache holds one compressed latent plus a shared RoPE key."""

    kv_lora_rank: int
    qk_rope_head_dim: int
    qk_nope_head_dim: int
    v_head_dim: int
    q_lora_rank: int | None = None


@dataclass(frozen=True)
class LinearAttention:
    """Gated DeltaNet layers (Qwen3-Next): a fixed-size recurrent state per sequence instead of a KV cache."""

    num_key_heads: int
    num_value_heads: int
    key_head_dim: int
    value_head_dim: int
    conv_kernel: int = 4


@dataclass(frozen=True)
class FileWeights:
    """Weights as stored in a real file: exact parameter and byte counts, experts separately."""

    path: str
    params: int
    bytes: int
    expert_params: int = 0
    expert_bytes: int = 0
    label: str = "file"  # the dominant tensor type, e.g. "Q4_1"


@dataclass(frozen=True)
class ModelShape:
    """A decoder-only transformer's shape; `layer_types` lists each layer's attention kind (empty: all full)."""

    key: str
    name: str
    layers: int
    hidden: int
    vocab: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    tied_embeddings: bool = False
    dtype: str = "bf16"
    layer_types: tuple[str, ...] = ()
    sliding_window: int | None = None
    attn_output_gate: bool = False
    moe: MoE | None = None
    mla: MLA | None = None
    linear: LinearAttention | None = None
    file: FileWeights | None = None
    reported_params: dict[str, float] = field(default_factory=dict)
    source: str = ""
    context_length: int | None = None  # the trained context (a GGUF's {arch}.context_length), when known

    def kind(self, layer: int) -> str:
        return self.layer_types[layer] if self.layer_types else "full"

    def count(self, kind: str) -> int:
        """Number of layers of one attention kind."""
        if not self.layer_types:
            return self.layers if kind == "full" else 0
        return sum(1 for t in self.layer_types if t == kind)

    def moe_layers(self) -> int:
        if self.moe is None:
            return 0
        return self.layers - len(self.moe.dense_layers)

    def all_full_attention(self) -> ModelShape:
        """The same model as if every layer were full attention (the counterfactual the seeds compare to)."""
        return replace(self, layer_types=(), linear=None, sliding_window=None, key=f"{self.key} (all full)")


@dataclass(frozen=True)
class HardwareSpec:
    """One accelerator (or this machine): memory, bandwidth, dense peak FLOP/s per math dtype, board power."""

    key: str
    name: str
    memory_bytes: float
    bandwidth: float  # bytes/s
    flops: dict[str, float]  # dtype -> dense FLOP/s (no sparsity)
    tdp_w: float | None
    measured: bool = False
    source: str = ""

    def peak(self, math_dtype: str) -> tuple[float, str]:
        """Peak dense FLOP/s for `math_dtype`, falling back to bf16/fp16 (e.g. fp8 on an A100), then fp32."""
        for dt in (math_dtype, "bf16", "fp16", "fp32"):
            if dt in self.flops:
                return self.flops[dt], dt
        raise ValueError(f"hardware {self.key} lists no FLOP/s")

    def scaled(self, gpus: int) -> HardwareSpec:
        """`gpus` chips in ideal tensor parallel: memory, bandwidth, FLOP/s and power all add up."""
        if gpus == 1:
            return self
        return replace(
            self,
            key=f"{self.key} x{gpus}",
            memory_bytes=self.memory_bytes * gpus,
            bandwidth=self.bandwidth * gpus,
            flops={k: v * gpus for k, v in self.flops.items()},
            tdp_w=None if self.tdp_w is None else self.tdp_w * gpus,
        )


@dataclass(frozen=True)
class Workload:
    """How the model is run: dtypes, batch of concurrent sequences, prompt and output lengths, context held."""

    weights: str | None = None  # None: the model's native dtype, or its file's real bytes
    kv: str = "fp16"
    batch: int = 1
    prompt: int = 1024
    output: int = 256
    context: int | None = None  # None: prompt + output
    gpus: int = 1
    price_per_hour: float | None = None  # USD per chip-hour
    memory_utilization: float = 0.9
    tdp_w: float | None = None  # overrides the hardware's board power
    measured_tps: float | None = None

    @property
    def context_tokens(self) -> int:
        return self.context if self.context is not None else self.prompt + self.output
