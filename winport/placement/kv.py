"""DeepSeek-V4.x KV cache bytes as SGLang 0.5.23 sizes its pools, from the config alone.

Follows sglang/srt/model_executor/pool_configurator.py (the DSV4 configurator's
`_get_bytes_per_full_token`, `_get_bytes_per_swa_token`, `_compressed_bytes_per_full_token`) in
its default mode on CUDA: paged pools of 256-token pages in the V4 layout (584 bytes a token,
pages padded to 576-byte rows: kernels_triton.formats.v4_page_bytes), the SWA pool sized as a
ratio of the full pool (DSV4_DEFAULT_SWA_FULL_TOKENS_RATIO = 0.1 unless --swa-full-tokens-ratio),
compressed storage owned by the ratio-4/128 layers (V4) or by the kv-source layers of ratio 1/2
(V4.1), and V4.1's low-ratio indexer keys in FP4 (index_head_dim / 2 + index_head_dim / 32 bytes).
Not modelled: the encoder-replay request windows, the c4/c128 compress-state rings and the
per-layer padding page (small next to the pools), and the cap-mode SWA pool, which is NOT small and IS
on the default path: SGLang sets max_running_requests 256 for DeepSeek-V4, and with chunked prefill
it then sizes the SWA pool from compute_swa_request_cap plus 4 x max_running_requests prefix tails
(606,464 tokens at window 128; measured on the H200 2026-12-03: 1.98 GB for the V4.1 demo, which
made SGLang refuse a 6 GiB plan). Open in issue 24. With DSpark SGLang inflates every per-token
figure by (target layers + 1) / target layers, as here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kernels_triton.formats import v4_page_bytes

PAGE = 256  # SGLang hard-codes page_size 256 for DeepSeek-V4 (arg_groups/model_overrides/deepseek_v4.py)
DEFAULT_SWA_RATIO = 0.1  # pool_configurator.DSV4_DEFAULT_SWA_FULL_TOKENS_RATIO


def _paged(ratio: int) -> float:
    tokens = PAGE // ratio if ratio else PAGE
    return v4_page_bytes(tokens) / tokens


def _index_fp8(head_dim: int) -> int:
    return head_dim + head_dim // 128 * 4


def _index_fp4(head_dim: int) -> int:
    return head_dim // 2 + head_dim // 32


def owners_by_ratio(config: dict[str, Any]) -> dict[int, list[int]]:
    """Layers owning compressed storage: every ratio-4/128 layer, the kv sources of ratio 1/2 (a config
    without compress_ratios has none)."""
    layers = int(config["num_hidden_layers"])
    ratios = list(config.get("compress_ratios") or [0] * layers)[:layers]
    sources = config.get("kv_source_layer_ids") or []
    out: dict[int, list[int]] = {}
    for r in (4, 128, 1, 2):
        layers = [i for i in sources if ratios[i] == r] if r in (1, 2) else [i for i, x in enumerate(ratios) if x == r]
        if layers:
            out[r] = layers
    return out


@dataclass(frozen=True)
class KVBytes:
    """Bytes one token of context adds to the KV pools (full and SWA share, in SGLang's sizing)."""

    full: float  # compressed pools (and indexer keys) per full token
    swa: float  # SWA pool per full token (swa_ratio x the SWA bytes of a slot)

    @property
    def per_token(self) -> float:
        """All pools together, per token of context."""
        return self.full + self.swa


def kv_bytes(config: dict[str, Any], swa_ratio: float = DEFAULT_SWA_RATIO, draft: bool = False) -> KVBytes:
    """KV bytes per token of `config` (module docstring for what is and is not counted)."""
    layers = int(config["num_hidden_layers"])
    idx_dim = int(config.get("index_head_dim", 128))
    full = 0.0
    for ratio, owners in owners_by_ratio(config).items():
        if ratio in (1, 2):
            per_layer = (_paged(ratio) + _index_fp4(idx_dim)) / ratio
        elif ratio == 4:
            per_layer = _paged(4) / 4 + _index_fp8(idx_dim) / 4
        else:
            per_layer = _paged(128) / 128
        full += per_layer * len(owners)
    swa = swa_ratio * _paged(0) * layers
    if draft:
        scale = (layers + 1) / layers
        full, swa = full * scale, swa * scale
    return KVBytes(full=full, swa=swa)
