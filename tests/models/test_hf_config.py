"""Reading a Hugging Face config.json gives the same shape as the presets."""

from __future__ import annotations

import json

import pytest

from tokenomy.models import formulas as F
from tokenomy.models.hf_config import HFConfigError, read_hf_config
from tokenomy.tools.plan.presets import preset_model

# Published config.json excerpts (only the keys the planner reads, as they appear upstream).
QWEN3_NEXT = {
    "architectures": ["Qwen3NextForCausalLM"], "model_type": "qwen3_next", "decoder_sparse_step": 1,
    "full_attention_interval": 4, "head_dim": 256, "hidden_size": 2048, "intermediate_size": 5120,
    "linear_conv_kernel_dim": 4, "linear_key_head_dim": 128, "linear_num_key_heads": 16,
    "linear_num_value_heads": 32, "linear_value_head_dim": 128, "mlp_only_layers": [],
    "moe_intermediate_size": 512, "num_attention_heads": 16, "num_experts": 512, "num_experts_per_tok": 10,
    "num_hidden_layers": 48, "num_key_value_heads": 2, "shared_expert_intermediate_size": 512,
    "tie_word_embeddings": False, "torch_dtype": "bfloat16", "vocab_size": 151936,
}
DEEPSEEK_V3 = {
    "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "first_k_dense_replace": 3,
    "hidden_size": 7168, "intermediate_size": 18432, "kv_lora_rank": 512, "moe_intermediate_size": 2048,
    "moe_layer_freq": 1, "n_routed_experts": 256, "n_shared_experts": 1, "num_attention_heads": 128,
    "num_experts_per_tok": 8, "num_hidden_layers": 61, "num_key_value_heads": 128, "q_lora_rank": 1536,
    "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128, "vocab_size": 129280,
    "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                            "weight_block_size": [128, 128]},
}
GEMMA3_270M = {
    "architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text", "head_dim": 256, "hidden_size": 640,
    "intermediate_size": 2048, "num_attention_heads": 4, "num_hidden_layers": 18, "num_key_value_heads": 1,
    "sliding_window": 512, "vocab_size": 262144, "torch_dtype": "bfloat16",
    "layer_types": (["sliding_attention"] * 5 + ["full_attention"]) * 3,
}


def write(tmp_path, cfg, name="config.json"):
    path = tmp_path / name
    path.write_text(json.dumps(cfg))
    return path


@pytest.mark.parametrize("cfg, preset", [(QWEN3_NEXT, "qwen3-next-80b-a3b"), (DEEPSEEK_V3, "deepseek-v3"),
                                         (GEMMA3_270M, "gemma3-270m")])
def test_config_json_matches_the_preset(tmp_path, cfg, preset):
    spec = read_hf_config(write(tmp_path, cfg))
    ref = preset_model(preset, use_file=False)
    assert F.param_counts(spec) == F.param_counts(ref)
    assert F.kv_bytes_per_sequence(spec, "bf16", 131072) == F.kv_bytes_per_sequence(ref, "bf16", 131072)
    assert spec.dtype == ref.dtype
    assert spec.layer_types == ref.layer_types


def test_multimodal_wrapper_plans_its_text_model(tmp_path):
    wrapped = {"model_type": "gemma3", "architectures": ["Gemma3ForConditionalGeneration"],
               "text_config": {k: v for k, v in GEMMA3_270M.items() if k != "layer_types"},
               "vision_config": {"hidden_size": 1152}}
    wrapped["text_config"]["model_type"] = "gemma3_text"
    write(tmp_path, wrapped)
    spec = read_hf_config(tmp_path)  # the model's directory works as well as its config.json
    assert spec.hidden == 640 and spec.tied_embeddings
    assert spec.count("full") == 3 and spec.sliding_window == 512


def test_bad_configs_raise_clear_errors(tmp_path):
    with pytest.raises(HFConfigError, match="num_hidden_layers"):
        read_hf_config(write(tmp_path, {"hidden_size": 64}))
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(HFConfigError, match="cannot read"):
        read_hf_config(bad)
    no_routing = {k: v for k, v in QWEN3_NEXT.items() if k != "num_experts_per_tok"}
    with pytest.raises(HFConfigError, match="num_experts_per_tok"):
        read_hf_config(write(tmp_path, no_routing))
