"""A model's shape: the geometry the planner's formulas and the engine's memory check read (from a GGUF, a
config.json or a preset)."""

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
