"""The demo model's config.json: DeepSeek-V4's architecture at toy width.

SGLang's DeepSeek-V4 KV layout fixes head_dim 512 (448 nope + 64 rope) and its backend accepts
index_topk 512 or 1024 only, so those stay at the real values; everything else is small. The same
file must load into SGLang 0.5.23 (DeepseekV3-style keys: compress_ratios, n_hash_layers,
window_size) and transformers 5.23 (which also reads the legacy compress_ratios,
num_hash_layers, qk_rope_head_dim), hence a few keys given under both names.
"""

from __future__ import annotations

from typing import Any

VOCAB_SIZE = 1024


VARIANTS = ("v4", "v41", "v41-vision")


def demo_config(variant: str = "v4") -> dict[str, Any]:
    """The config dict of the demo model: 'v4' (DeepSeek-V4), 'v41' (V4.1, see v41_config) or
    'v41-vision' (V4.1 with a vision tower, see winport.demo.vision)."""
    if variant not in VARIANTS:
        raise ValueError(f"unknown demo variant {variant!r} (known: {', '.join(VARIANTS)})")
    if variant in ("v41", "v41-vision"):
        from winport.demo.config_v41 import v41_config

        cfg = v41_config(_v4_config())
        if variant == "v41-vision":
            from winport.demo.vision import vision_config

            cfg = vision_config(cfg)
        return cfg
    return _v4_config()


def _v4_config() -> dict[str, Any]:
    return {
        "architectures": ["DeepseekV4ForCausalLM"],
        "model_type": "deepseek_v4",
        "vocab_size": VOCAB_SIZE,
        "hidden_size": 256,
        "intermediate_size": 128,
        "moe_intermediate_size": 128,
        "num_hidden_layers": 4,
        "num_attention_heads": 8,
        "num_key_value_heads": 1,
        "head_dim": 512,
        "qk_nope_head_dim": 448,
        "qk_rope_head_dim": 64,
        "v_head_dim": 512,
        "kv_lora_rank": 512,
        "q_lora_rank": 128,
        "o_lora_rank": 128,
        "o_groups": 2,
        "n_routed_experts": 8,
        "n_shared_experts": 1,
        "num_experts_per_tok": 2,
        "n_group": 1,
        "topk_group": 1,
        "scoring_func": "sqrtsoftplus",
        "topk_method": "noaux_tc",
        "norm_topk_prob": True,
        "routed_scaling_factor": 1.5,
        "swiglu_limit": 10.0,
        "rms_norm_eps": 1e-6,
        "window_size": 128,
        "sliding_window": 128,
        "compress_ratios": [0, 4, 128, 4],
        "compress_rope_theta": 160000,
        "rope_theta": 10000,
        "rope_scaling": {"type": "yarn", "factor": 2, "original_max_position_embeddings": 4096,
                         "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0},
        "index_n_heads": 4,
        "index_head_dim": 128,
        "index_topk": 512,
        "hc_mult": 4,
        "hc_sinkhorn_iters": 20,
        "hc_eps": 1e-6,
        "n_hash_layers": 1,
        "num_hash_layers": 1,
        "num_nextn_predict_layers": 0,
        "max_position_embeddings": 8192,
        "bos_token_id": 0,
        "eos_token_id": 1,
        "pad_token_id": 2,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "first_k_dense_replace": 0,
        "moe_layer_freq": 1,
        "hidden_act": "silu",
    }
