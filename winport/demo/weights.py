"""Deterministic random weights for the demo model, in DeepSeek's original checkpoint names.

Tensor names and shapes come from transformers' own DeepseekV4ForCausalLM built on the meta
device from the demo config (so they are what an independent implementation expects), renamed
back to DeepSeek's original names with the table below (the names SGLang's loader and Unsloth's
GGUF map to). Values are drawn per tensor from a generator seeded by the tensor's name, so the files
are identical on every run and every machine, and no tensor is all zeros.
"""

from __future__ import annotations

import hashlib
import math
import re
from typing import Any

import torch

# Hugging Face name -> original name, applied in order (first the specific, then the general).
HF_TO_ORIGINAL: tuple[tuple[str, str], ...] = (
    (r"^model\.embed_tokens\.weight$", "embed.weight"),
    (r"^lm_head\.weight$", "head.weight"),
    (r"^model\.norm\.weight$", "norm.weight"),
    (r"^model\.hc_head\.hc_(fn|base|scale)$", r"hc_head_\1"),
    (r"^model\.layers\.", "layers."),
    (r"\.self_attn\.compressor\.indexer\.scorer\.weights_proj\.", ".attn.indexer.weights_proj."),
    (r"\.self_attn\.compressor\.indexer\.q_b_proj\.", ".attn.indexer.wq_b."),
    (r"\.self_attn\.compressor\.indexer\.", ".attn.indexer.compressor."),
    (r"\.self_attn\.", ".attn."),
    (r"\.mlp\.shared_experts\.gate_proj\.", ".ffn.shared_experts.w1."),
    (r"\.mlp\.shared_experts\.up_proj\.", ".ffn.shared_experts.w3."),
    (r"\.mlp\.shared_experts\.down_proj\.", ".ffn.shared_experts.w2."),
    (r"\.mlp\.gate\.e_score_correction_bias$", ".ffn.gate.bias"),
    (r"\.mlp\.", ".ffn."),
    (r"\.compressor\.position_bias$", ".compressor.ape"),
    (r"\.compressor\.kv_proj\.", ".compressor.wkv."),
    (r"\.compressor\.gate_proj\.", ".compressor.wgate."),
    (r"\.compressor\.kv_norm\.", ".compressor.norm."),
    (r"\.attn\.q_a_proj\.", ".attn.wq_a."),
    (r"\.attn\.q_b_proj\.", ".attn.wq_b."),
    (r"\.attn\.q_a_norm\.", ".attn.q_norm."),
    (r"\.attn\.kv_proj\.", ".attn.wkv."),
    (r"\.attn\.kv_norm\.", ".attn.kv_norm."),
    (r"\.attn\.o_a_proj\.", ".attn.wo_a."),
    (r"\.attn\.o_b_proj\.", ".attn.wo_b."),
    (r"\.attn\.sinks$", ".attn.attn_sink"),
    (r"\.input_layernorm\.", ".attn_norm."),
    (r"\.post_attention_layernorm\.", ".ffn_norm."),
    (r"\.attn_hc\.(fn|base|scale)$", r".hc_attn_\1"),
    (r"\.ffn_hc\.(fn|base|scale)$", r".hc_ffn_\1"),
)

_EXPERTS = re.compile(r"^(layers\.\d+\.ffn\.experts)\.(gate_up_proj|down_proj)$")


def original_name(hf_name: str) -> str:
    """Map one Hugging Face DeepSeek-V4 parameter name to DeepSeek's original name."""
    name = hf_name
    for pattern, repl in HF_TO_ORIGINAL:
        name = re.sub(pattern, repl, name)
    return name


def hf_shapes(config: dict[str, Any]) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    """Parameter and buffer shapes of transformers' DeepseekV4ForCausalLM for this config."""
    from transformers import DeepseekV4Config, DeepseekV4ForCausalLM

    fields = {k: v for k, v in config.items() if k not in {"architectures", "model_type"}}
    hf_config = DeepseekV4Config(**fields)
    with torch.device("meta"):
        model = DeepseekV4ForCausalLM(hf_config)
    return {k: (tuple(v.shape), v.dtype) for k, v in model.state_dict().items()}


def _generator(name: str, seed: int) -> torch.Generator:
    digest = hashlib.sha256(f"{seed}:{name}".encode()).digest()
    return torch.Generator().manual_seed(int.from_bytes(digest[:8], "little"))


def _value(name: str, shape: tuple[int, ...], config: dict[str, Any], seed: int) -> torch.Tensor:
    """A fresh, never-zero tensor whose scale suits the role its name says it plays."""
    g = _generator(name, seed)
    leaf = name.rsplit(".", 1)[-1]
    if name.endswith("tid2eid"):
        n_experts = config["n_routed_experts"]
        rows = [torch.randperm(n_experts, generator=g)[: shape[1]] for _ in range(shape[0])]
        return torch.stack(rows).to(torch.int32)
    noise = torch.randn(shape, generator=g, dtype=torch.float32)
    parts = name.split(".")
    owner = parts[-2] if len(parts) > 1 else ""
    if owner.endswith("norm"):
        return 1.0 + 0.1 * noise
    if leaf in {"attn_sink"}:
        return noise
    if leaf in {"ape", "bias"} or leaf.endswith("_base"):
        return 0.1 * noise
    if leaf.endswith("_scale"):
        return 0.5 + 0.05 * noise
    if leaf.endswith("_fn"):
        return noise / math.sqrt(shape[-1])
    # Linear weights [out, in] and embeddings: unit-variance outputs.
    fan_in = shape[-1]
    return noise / math.sqrt(fan_in)


# Tensors the original checkpoint keeps in fp32 (small, precision-sensitive); the rest is bf16.
FP32_LEAVES = ("attn_sink", "ape", "bias", "hc_head_fn", "hc_head_base", "hc_head_scale")


def _storage_dtype(name: str) -> torch.dtype:
    leaf = name.rsplit(".", 1)[-1]
    if leaf in FP32_LEAVES or leaf.startswith(("hc_attn_", "hc_ffn_")):
        return torch.float32
    return torch.bfloat16


def demo_state_dict(config: dict[str, Any], seed: int = 0) -> dict[str, torch.Tensor]:
    """All demo tensors in original names (experts split per expert into w1/w3/w2), sorted by name."""
    out: dict[str, torch.Tensor] = {}
    for hf_name, (shape, _dtype) in hf_shapes(config).items():
        name = original_name(hf_name)
        match = _EXPERTS.match(name)
        if match:
            prefix, kind = match.groups()
            n_exp, rows, cols = shape
            for e in range(n_exp):
                if kind == "gate_up_proj":
                    inter = rows // 2
                    for w, sl in (("w1", slice(0, inter)), ("w3", slice(inter, rows))):
                        key = f"{prefix}.{e}.{w}.weight"
                        out[key] = _value(key, (sl.stop - sl.start, cols), config, seed).to(torch.bfloat16)
                else:
                    key = f"{prefix}.{e}.w2.weight"
                    out[key] = _value(key, (rows, cols), config, seed).to(torch.bfloat16)
            continue
        value = _value(name, shape, config, seed)
        out[name] = value if value.dtype == torch.int32 else value.to(_storage_dtype(name))
    return dict(sorted(out.items()))
