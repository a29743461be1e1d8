"""The V4.1 demo with a vision tower (variant "v41-vision"): config keys, image token, tensors.

DeepSeek-V4.1's vision path as SGLang 0.5.23 builds it (models/deepseek_v41_vit.py, ViT + Aligner,
and models/deepseek_v4.py): only for model_type deepseek_v41 with vision_n_layers > 0, from
checkpoint tensors named

- ``vision.patch_embed.proj.{weight,bias}`` [vision_dim, 3 * patch^2] (an nn.Linear with bias),
- per block ``vision.blocks.L.norm1/norm2.weight`` (fp32 RMSNorm weights),
  ``attn.wqkv.{weight,bias}`` [3 * vision_dim, vision_dim] and ``attn.wo.{weight,bias}``
  (SGLang's VisionAttention has qkv and output biases), ``mlp.w1.weight`` [2 * inter, vision_dim]
  (gate then up) and ``mlp.w2.weight`` [vision_dim, inter] (no biases),
- ``vision.norm.weight``, ``aligner.w1.{weight,bias}`` [hidden, vision_dim * ratio^2] and
  ``aligner.w2.{weight,bias}`` [hidden, hidden], ``image_start/image_end/image_newline`` [hidden];
- and, in every MoE layer, ``layers.L.ffn.gate.bias_vl`` [n_routed_experts] (fp32): the routing
  bias SGLang uses for image-token rows instead of ``gate.bias`` (gate.e_score_correction_bias_vl).

The demo keeps the V4.1 demo's text model and drops its DSpark draft (DSpark never runs on the
CPU, and a vision config makes its stages need their own VL biases). The tokenizer is the V4.1
demo's plus one special token, DeepSeek's image placeholder ``<｜deepseek_image｜>`` (the spelling
SGLang's V4.1 chat renderer, parser/deepseek_recipe_renderer.py, puts where an image goes), at id
VOCAB_SIZE; its id is the config's image_token_id, which SGLang's V4.1 image processor expands into
the image's token span. The image geometry is shrunk so an image costs a few tokens on the CPU:
patch 14 (V4.1's), downsample 3, and vision_min_pixels 42 x 42 (one 3 x 3 patch cell) instead of
SGLang's 544 x 544 default, which would upscale every small test image to 1521 patches.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from winport.demo.weights import _generator

IMAGE_TOKEN = "<｜deepseek_image｜>"
VISION = {
    "vision_n_layers": 2,
    "vision_dim": 64,
    "vision_n_heads": 2,
    "vision_inter_dim": 96,
    "vision_patch_size": 14,
    "vision_rope_theta": 10000.0,
    "vision_downsample_ratio": 3,
    "vision_max_n_token": 64,
    "vision_min_pixels": 42 * 42,
    # Explicitly null: SGLang's image processor reads it off the HF config, which has no default.
    "vision_max_wh_ratio": None,
}
# Distinct normalized tokens (SGLang's engram normalization) of the V4.1 demo tokenizer plus the
# image token: the V4.1 demo's 937 and one more (checked by SGLang at start-up).
ENGRAM_COMPRESSED_VOCAB = 938


def vision_config(v41: dict[str, Any]) -> dict[str, Any]:
    """The "v41-vision" config from the V4.1 demo config: vision keys, image token, no DSpark draft."""
    cfg = {k: v for k, v in v41.items()
           if not k.startswith(("dspark_", "confidence_head")) and k != "enable_confidence_head"}
    cfg["num_nextn_predict_layers"] = 0
    cfg["vocab_size"] = v41["vocab_size"] + 1  # the image token, added after the trained vocabulary
    cfg["image_token_id"] = v41["vocab_size"]
    cfg["engram_compressed_vocab_size"] = ENGRAM_COMPRESSED_VOCAB
    cfg.update(VISION)
    return cfg


def _linear(name: str, shape: tuple[int, ...], seed: int) -> torch.Tensor:
    g = _generator(name, seed)
    return (torch.randn(shape, generator=g) / math.sqrt(shape[-1])).to(torch.bfloat16)


def _vector(name: str, n: int, seed: int, mean: float, std: float, dtype: torch.dtype) -> torch.Tensor:
    g = _generator(name, seed)
    return (mean + std * torch.randn(n, generator=g)).to(dtype)


def vision_tensors(config: dict[str, Any], seed: int = 0) -> dict[str, torch.Tensor]:
    """The vision tower, aligner, image_* embeddings and per-layer VL routing biases, sorted by name.

    Values are drawn per tensor name (as the rest of the demo), scaled so activations stay O(1):
    linear weights 1/sqrt(fan_in), biases 0.1, norm weights 1 +- 0.1, image_* embeddings unit-ish.
    """
    d, inter, hidden = config["vision_dim"], config["vision_inter_dim"], config["hidden_size"]
    p, r = config["vision_patch_size"], config["vision_downsample_ratio"]
    bf16, f32 = torch.bfloat16, torch.float32
    out: dict[str, torch.Tensor] = {}
    out["vision.patch_embed.proj.weight"] = _linear("vision.patch_embed.proj.weight", (d, 3 * p * p), seed)
    out["vision.patch_embed.proj.bias"] = _vector("vision.patch_embed.proj.bias", d, seed, 0.0, 0.1, bf16)
    for layer in range(config["vision_n_layers"]):
        b = f"vision.blocks.{layer}."
        out[b + "norm1.weight"] = _vector(b + "norm1.weight", d, seed, 1.0, 0.1, f32)
        out[b + "norm2.weight"] = _vector(b + "norm2.weight", d, seed, 1.0, 0.1, f32)
        out[b + "attn.wqkv.weight"] = _linear(b + "attn.wqkv.weight", (3 * d, d), seed)
        out[b + "attn.wqkv.bias"] = _vector(b + "attn.wqkv.bias", 3 * d, seed, 0.0, 0.1, bf16)
        out[b + "attn.wo.weight"] = _linear(b + "attn.wo.weight", (d, d), seed)
        out[b + "attn.wo.bias"] = _vector(b + "attn.wo.bias", d, seed, 0.0, 0.1, bf16)
        out[b + "mlp.w1.weight"] = _linear(b + "mlp.w1.weight", (2 * inter, d), seed)
        out[b + "mlp.w2.weight"] = _linear(b + "mlp.w2.weight", (d, inter), seed)
    out["vision.norm.weight"] = _vector("vision.norm.weight", d, seed, 1.0, 0.1, f32)
    out["aligner.w1.weight"] = _linear("aligner.w1.weight", (hidden, d * r * r), seed)
    out["aligner.w1.bias"] = _vector("aligner.w1.bias", hidden, seed, 0.0, 0.1, bf16)
    out["aligner.w2.weight"] = _linear("aligner.w2.weight", (hidden, hidden), seed)
    out["aligner.w2.bias"] = _vector("aligner.w2.bias", hidden, seed, 0.0, 0.1, bf16)
    for name in ("image_start", "image_end", "image_newline"):
        out[name] = _vector(name, hidden, seed, 0.0, 1.0, bf16)
    # A VL bias unlike gate.bias (larger spread), so image rows route to other experts than text rows.
    for layer in range(config["num_hidden_layers"]):
        name = f"layers.{layer}.ffn.gate.bias_vl"
        out[name] = _vector(name, config["n_routed_experts"], seed, 0.0, 1.0, f32)
    return dict(sorted(out.items()))


__all__ = ["ENGRAM_COMPRESSED_VOCAB", "IMAGE_TOKEN", "VISION", "vision_config", "vision_tensors"]
