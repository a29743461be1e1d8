"""Deterministic weights of the V4.1 demo variant, in DeepSeek's original checkpoint names.

The parts V4.1 shares with V4 (embeddings, attention projections, sinks, mHC mixers, MoE with
shared expert and hash routing) come from `winport.demo.weights.demo_state_dict` for the same
widths with every layer at compress ratio 0, so transformers' DeepseekV4ForCausalLM still fixes
their names and shapes. V4.1's own tensors are added here with the names SGLang 0.5.23's
DeepseekV4ForCausalLM consumes (after its `remap_weight_name_to_dpsk_hf_format`):

- ratio-1/2 compressor of a kv-source layer (`DeepseekV41Compressor`): `attn.compressor.wkv`
  [head_dim, hidden], `attn.compressor.wgate` (ratio 2 only) and `attn.compressor.norm` [head_dim];
  no position bias, unlike V4's ratio-4/128 compressors.
- ratio-1/2 indexer of an index-source layer (`DeepseekV41Indexer`): `attn.indexer.wq_b`
  [heads * index_head_dim, q_lora], `attn.indexer.weights_proj` [heads, hidden], and on a layer
  that is also a kv source (it owns the index keys) `attn.indexer.wk` [index_head_dim, head_dim]
  and `attn.indexer.k_norm` [index_head_dim].
- engram (`layers/engram.py`): `engram.embed.weight` [rows, dim] FP8 e4m3 with
  `engram.embed.scale` [rows, dim / 32] E8M0 (one power-of-two scale per 32 values), `engram.wkv`
  [(hc_mult + 1) * hidden, n_hash_cols * dim], `engram.q_weight` and `engram.k_weight`
  [hc_mult, hidden].
- no `hc_head_*`: with hc_pre_from_prev_sublayer (V4.1's default) SGLang builds no LM-head mixer.

Values are drawn from generators seeded by (seed, tensor name), as for V4: same files every run.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from winport.demo.weights import _generator, demo_state_dict

ENGRAM_BLOCK = 32  # values per E8M0 scale in an engram row (SGLang's FP8_BLOCK_SIZE)
E4M3_MAX = 448.0


def v4_base_config(config: dict[str, Any]) -> dict[str, Any]:
    """The V4 config with the V4.1 widths and no compressed layers: what transformers can build."""
    base = {k: v for k, v in config.items() if not k.startswith(("engram_", "kv_source", "index_source"))}
    base.update({"architectures": ["DeepseekV4ForCausalLM"], "model_type": "deepseek_v4",
                 "compress_ratios": [0] * config["num_hidden_layers"]})
    for key in ("hc_pre_from_prev_sublayer", "q_head_norm", "candidate_source_layer_id", "vision_n_layers"):
        base.pop(key, None)
    return base


def quantize_engram_rows(rows: torch.Tensor, block: int = ENGRAM_BLOCK) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 rows [n, dim] -> (FP8 e4m3 [n, dim], E8M0 scales [n, dim / block]).

    Each block's scale is the smallest power of two that maps its max |value| into e4m3's range,
    so dequantization (fp8 * 2^e) never saturates.
    """
    n, dim = rows.shape
    if dim % block:
        raise ValueError(f"engram row width {dim} is not a multiple of the scale block {block}")
    blocks = rows.float().view(n, dim // block, block)
    amax = blocks.abs().amax(-1).clamp_min(1e-30)
    scale = torch.exp2(torch.ceil(torch.log2(amax / E4M3_MAX)))
    q = (blocks / scale.unsqueeze(-1)).to(torch.float8_e4m3fn).view(n, dim)
    return q, scale.to(torch.float8_e8m0fnu)


def _linear(name: str, shape: tuple[int, ...], seed: int) -> torch.Tensor:
    g = _generator(name, seed)
    return (torch.randn(shape, generator=g) / math.sqrt(shape[-1])).to(torch.bfloat16)


def _norm(name: str, dim: int, seed: int) -> torch.Tensor:
    g = _generator(name, seed)
    return (1.0 + 0.1 * torch.randn(dim, generator=g)).to(torch.bfloat16)


def v41_only_tensors(config: dict[str, Any], seed: int = 0) -> dict[str, torch.Tensor]:
    """The tensors V4.1 adds to V4 (compressors/indexers of ratio-1/2 layers, engram)."""
    out: dict[str, torch.Tensor] = {}
    hidden, head_dim = config["hidden_size"], config["head_dim"]
    ratios = config["compress_ratios"]
    kv_src, idx_src = set(config["kv_source_layer_ids"]), set(config["index_source_layer_ids"])
    for layer in sorted(kv_src | idx_src):
        if ratios[layer] not in (1, 2):
            raise ValueError(f"config: source layer {layer} has compress ratio {ratios[layer]}, not 1 or 2")
    for layer in sorted(kv_src):
        p = f"layers.{layer}.attn.compressor"
        out[f"{p}.wkv.weight"] = _linear(f"{p}.wkv.weight", (head_dim, hidden), seed)
        if ratios[layer] == 2:
            out[f"{p}.wgate.weight"] = _linear(f"{p}.wgate.weight", (head_dim, hidden), seed)
        out[f"{p}.norm.weight"] = _norm(f"{p}.norm.weight", head_dim, seed)
    n_idx, d_idx = config["index_n_heads"], config["index_head_dim"]
    for layer in sorted(idx_src):
        p = f"layers.{layer}.attn.indexer"
        out[f"{p}.wq_b.weight"] = _linear(f"{p}.wq_b.weight", (n_idx * d_idx, config["q_lora_rank"]), seed)
        out[f"{p}.weights_proj.weight"] = _linear(f"{p}.weights_proj.weight", (n_idx, hidden), seed)
        if layer in kv_src:
            out[f"{p}.wk.weight"] = _linear(f"{p}.wk.weight", (d_idx, head_dim), seed)
            out[f"{p}.k_norm.weight"] = _norm(f"{p}.k_norm.weight", d_idx, seed)
    hc = config["hc_mult"]
    dim = config["engram_head_dim"]
    n_cols = (config["engram_max_ngram_size"] - 1) * config["engram_n_heads"]
    for layer, rows in zip(config["engram_layer_ids"], config["engram_num_embeddings"], strict=True):
        p = f"layers.{layer}.engram"
        g = _generator(f"{p}.embed", seed)
        # Rows with a spread of magnitudes (per-row scale 2^-2..2^2), so the E8M0 scales differ.
        raw = torch.randn(rows, dim, generator=g) * torch.exp2(torch.randint(-2, 3, (rows, 1), generator=g).float())
        out[f"{p}.embed.weight"], out[f"{p}.embed.scale"] = quantize_engram_rows(raw)
        out[f"{p}.wkv.weight"] = _linear(f"{p}.wkv.weight", ((hc + 1) * hidden, n_cols * dim), seed)
        out[f"{p}.q_weight"] = (1.0 + 0.1 * torch.randn(hc, hidden, generator=_generator(f"{p}.q_weight", seed))
                                ).to(torch.bfloat16)
        out[f"{p}.k_weight"] = (1.0 + 0.1 * torch.randn(hc, hidden, generator=_generator(f"{p}.k_weight", seed))
                                ).to(torch.bfloat16)
    return out


def demo_state_dict_v41(config: dict[str, Any], seed: int = 0) -> dict[str, torch.Tensor]:
    """All tensors of the V4.1 demo in original names, sorted by name."""
    out = {k: v for k, v in demo_state_dict(v4_base_config(config), seed=seed).items()
           if not k.startswith("hc_head_")}
    extra = v41_only_tensors(config, seed)
    clash = sorted(set(out) & set(extra))
    if clash:
        raise RuntimeError(f"V4.1 tensors clash with V4 ones: {clash}")
    out.update(extra)
    return dict(sorted(out.items()))


__all__ = ["demo_state_dict_v41", "quantize_engram_rows", "v41_only_tensors", "v4_base_config"]
