"""Read a model's shape from a Hugging Face `config.json` (Llama, Qwen2/3, Qwen3-MoE, Qwen3-Next, Mixtral,
DeepSeek-V2/V3, Gemma 2/3, Mistral and anything else that uses the standard keys)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tokenomy.models.shape import MLA, LinearAttention, ModelShape, MoE

_KIND = {"full_attention": "full", "sliding_attention": "sliding", "linear_attention": "linear",
         "global": "full", "local": "sliding"}


class HFConfigError(ValueError):
    """The file is not a usable model config; the message says why."""


def _dtype(cfg: dict[str, Any]) -> str:
    quant = cfg.get("quantization_config") or {}
    method = str(quant.get("quant_method", "")).lower()
    if method == "fp8":
        return "fp8"
    if method in {"gptq", "awq"} and quant.get("bits") == 4:
        return "int4"
    if method in {"gptq", "awq"} and quant.get("bits") == 8:
        return "int8"
    dtype = str(cfg.get("torch_dtype") or cfg.get("dtype") or "bfloat16")
    return {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}.get(dtype, "bf16")


def _layer_types(cfg: dict[str, Any], layers: int, model_type: str) -> tuple[tuple[str, ...], int | None]:
    window = cfg.get("sliding_window")
    if isinstance(cfg.get("layer_types"), list):
        kinds = tuple(_KIND.get(str(t), "full") for t in cfg["layer_types"])
        if len(kinds) != layers:
            raise HFConfigError(f"layer_types has {len(kinds)} entries for {layers} layers")
        return kinds, window if "sliding" in kinds else None
    if cfg.get("full_attention_interval"):
        n = int(cfg["full_attention_interval"])
        return tuple("full" if (i + 1) % n == 0 else "linear" for i in range(layers)), None
    pattern = cfg.get("sliding_window_pattern")
    if model_type.startswith("gemma3") and window:
        pattern = pattern or 6
    elif model_type.startswith("gemma2") and window:
        pattern = pattern or 2
    if window and pattern:
        return tuple("full" if (i + 1) % int(pattern) == 0 else "sliding" for i in range(layers)), window
    if window and model_type == "mistral" and cfg.get("use_sliding_window", True):
        return ("sliding",) * layers, window
    return (), None


def _moe(cfg: dict[str, Any], layers: int) -> MoE | None:
    experts = cfg.get("num_experts") or cfg.get("num_local_experts") or cfg.get("n_routed_experts")
    if not experts:
        return None
    dense: set[int] = set(range(int(cfg.get("first_k_dense_replace") or 0)))
    dense |= {int(i) for i in cfg.get("mlp_only_layers") or []}
    step = int(cfg.get("decoder_sparse_step") or cfg.get("moe_layer_freq") or 1)
    dense |= {i for i in range(layers) if (i + 1) % step != 0}
    expert_width = int(cfg.get("moe_intermediate_size") or cfg["intermediate_size"])
    shared, shared_width = int(cfg.get("n_shared_experts") or 0), expert_width
    if cfg.get("shared_expert_intermediate_size"):
        shared, shared_width = 1, int(cfg["shared_expert_intermediate_size"])
    return MoE(experts=int(experts), active=int(cfg["num_experts_per_tok"]), expert_intermediate=expert_width,
               shared_experts=shared, shared_intermediate=shared_width, dense_layers=tuple(sorted(dense)))


def spec_from_config(cfg: dict[str, Any], key: str, source: str = "") -> ModelShape:
    """Map config.json keys onto a ModelShape; raises HFConfigError naming the first missing or bad key."""
    try:
        return _spec(cfg, key, source)
    except HFConfigError:
        raise
    except KeyError as e:
        raise HFConfigError(f"config has no {e.args[0]!r}; is it a decoder-only LLM config.json?") from None
    except (TypeError, ValueError) as e:
        raise HFConfigError(f"config has a malformed value: {e}") from None


def _spec(cfg: dict[str, Any], key: str, source: str) -> ModelShape:
    if isinstance(cfg.get("text_config"), dict):  # multimodal wrappers (Gemma 3, Qwen-VL): plan the text model
        cfg = {**cfg, **cfg["text_config"]}
    model_type = str(cfg.get("model_type", ""))
    layers = int(cfg["num_hidden_layers"])
    hidden = int(cfg["hidden_size"])
    heads = int(cfg["num_attention_heads"])
    vocab = int(cfg["vocab_size"])
    kv_heads = int(cfg.get("num_key_value_heads") or heads)
    head_dim = int(cfg.get("head_dim") or hidden // heads)
    layer_types, window = _layer_types(cfg, layers, model_type)
    mla = None
    if cfg.get("kv_lora_rank"):
        mla = MLA(kv_lora_rank=int(cfg["kv_lora_rank"]), qk_rope_head_dim=int(cfg["qk_rope_head_dim"]),
                  qk_nope_head_dim=int(cfg["qk_nope_head_dim"]), v_head_dim=int(cfg["v_head_dim"]),
                  q_lora_rank=int(cfg["q_lora_rank"]) if cfg.get("q_lora_rank") else None)
    linear = None
    if "linear" in layer_types:
        linear = LinearAttention(num_key_heads=int(cfg["linear_num_key_heads"]),
                                 num_value_heads=int(cfg["linear_num_value_heads"]),
                                 key_head_dim=int(cfg["linear_key_head_dim"]),
                                 value_head_dim=int(cfg["linear_value_head_dim"]),
                                 conv_kernel=int(cfg.get("linear_conv_kernel_dim", 4)))
    tied_default = model_type.startswith("gemma")
    return ModelShape(
        key=key, name=str(cfg.get("_name_or_path") or key), layers=layers, hidden=hidden, vocab=vocab,
        heads=heads, kv_heads=kv_heads, head_dim=head_dim, intermediate=int(cfg.get("intermediate_size") or 0),
        tied_embeddings=bool(cfg.get("tie_word_embeddings", tied_default)), dtype=_dtype(cfg),
        layer_types=layer_types, sliding_window=window,
        attn_output_gate=bool(cfg.get("attn_output_gate", model_type == "qwen3_next")),
        moe=_moe(cfg, layers), mla=mla, linear=linear, source=source,
    )


def read_hf_config(path: str | Path) -> ModelShape:
    """A ModelShape from a config.json file, or from a directory that holds one."""
    p = Path(path).expanduser()
    if p.is_dir():
        p = p / "config.json"
    try:
        cfg = json.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise HFConfigError(f"no such file: {p}") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise HFConfigError(f"cannot read {p} as JSON: {e}") from None
    if not isinstance(cfg, dict):
        raise HFConfigError(f"{p} is not a JSON object")
    return spec_from_config(cfg, key=p.parent.name or p.name, source=str(p))
