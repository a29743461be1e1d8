"""DeepSeek-V4.1-Flash's text config, written from its published hparams (shared/FACTS.md), for
plans made without the model's files. Values the facts do not give are marked "assumed": none of
them moves a plan by more than a few MiB."""

from __future__ import annotations

from typing import Any

from winport.demo.config import demo_config
from winport.demo.full_width import FULL_WIDTH
from winport.demo.quantize import V41_BLOCK, quantization_config

LAYERS = 40
ENGRAM_ROWS = 384_000_000  # a layer; ~203 GB for two layers at 264 B a row


def v41_flash_config() -> dict[str, Any]:
    """config.json of DeepSeek-V4.1-Flash (text model, DSpark draft excluded)."""
    cfg = {k: v for k, v in demo_config("v41").items() if not k.startswith(("dspark_", "enable_confidence",
                                                                            "confidence_head"))}
    cfg.update(FULL_WIDTH)
    cfg.update({
        "vocab_size": 129280,
        "num_hidden_layers": LAYERS,
        "compress_ratios": [0, 0] + [2] * 18 + [1] * 20,
        "kv_source_layer_ids": [2, 8, 14, 20],
        "index_source_layer_ids": [2, 8, 14, 20, 24, 28, 32, 36],
        "candidate_source_layer_id": 20,
        "engram_layer_ids": [1, 14],
        "engram_num_embeddings": [ENGRAM_ROWS, ENGRAM_ROWS],
        "num_hash_layers": 3, "n_hash_layers": 3,  # assumed (V4-Flash's count; tid2eid is 3 MiB a layer)
        "num_nextn_predict_layers": 0,
        "quantization_config": quantization_config(V41_BLOCK),
        "max_position_embeddings": 1048576,  # assumed: V4's 1M context
        "rope_scaling": {"type": "yarn", "factor": 16, "original_max_position_embeddings": 65536,
                         "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0},  # assumed
    })
    return cfg
