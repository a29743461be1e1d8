"""DeepSeek-V4.x KV cache bytes as SGLang 0.5.23 sizes its pools, from the config alone.

Follows sglang/srt/model_executor/pool_configurator.py (the DSV4 configurator's
`_get_bytes_per_full_token`, `_get_bytes_per_swa_token`, `_compressed_bytes_per_full_token`) in
its default mode on CUDA: paged pools of 256-token pages in the V4 layout (584 bytes a token,
pages padded to 576-byte rows: kernels_triton.formats.v4_page_bytes), the SWA pool sized as a
ratio of the full pool (DSV4_DEFAULT_SWA_FULL_TOKENS_RATIO = 0.1 unless --swa-full-tokens-ratio),
compressed storage owned by the ratio-4/128 layers (V4) or by the kv-source layers of ratio 1/2
(V4.1), and V4.1's low-ratio indexer keys in FP4 (index_head_dim / 2 + index_head_dim / 32 bytes).
On CUDA SGLang sets max_running_requests 256 for DeepSeek-V4 itself (winport passes 16 unless told
otherwise: WORKSTATION_RUNNING_REQUESTS), and with chunked prefill that
puts the SWA pool in cap mode (pool_configurator.py _resolve_swa_cap_tokens, compute_swa_request_cap):
a fixed pool of `swa_cap_tokens` slots, sized from the request cap and 4 x max_running_requests cached
prefix tails, and no SWA share per full token; measured on the H200 (2026-12-03): 606,464 slots,
1.98 GiB for the V4.1 demo, exactly this module's figure. The ratio mode stays for --swa-full-tokens-ratio.
Not modelled (small next to the pools): the encoder-replay request windows, the c4/c128 compress-state
rings (V4's ratio-4 layers price c4 state per SWA slot too; V4.1 has no ratio-4 layer) and the
per-layer padding page. With DSpark SGLang inflates every per-token figure by (target layers + 1) /
target layers, as here, and its verify blocks widen the cap's eviction term (draft_tokens); its
decode allocation under speculation is taken as one page, as without it (not checked).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kernels_triton.formats import v4_page_bytes

PAGE = 256  # SGLang hard-codes page_size 256 for DeepSeek-V4 (arg_groups/model_overrides/deepseek_v4.py)
DEFAULT_SWA_RATIO = 0.1  # pool_configurator.DSV4_DEFAULT_SWA_FULL_TOKENS_RATIO
MAX_RUNNING_REQUESTS = 256  # what SGLang 0.5.23 sets for DeepseekV4ForCausalLM ("Setting max_running_requests to 256")
# What `winport serve` and `winport plan` use on CUDA when --max-running-requests is not given: a
# workstation serves one person and a few agents, not 256 clients, and the cap-mode SWA pool grows with
# the cap (V4.1-Flash: 14.19 GB at 256, 1.25 GB at 16; with the decode graphs
# that stop at 16 too, 46 FP8 expert slots a layer at 80 of 96 GiB instead of 36).
WORKSTATION_RUNNING_REQUESTS = 16
SWA_EVICTION_INTERVAL = 128  # SGLang's SGLANG_SWA_EVICTION_INTERVAL default
PREFIX_TAILS_PER_REQUEST = 4  # cached prefix tails cap mode keeps per running request (radix cache on)
DEFAULT_WINDOW = 128  # DeepSeek-V4.x sliding_window


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
    swa: float  # SWA pool per full token (ratio mode: swa_ratio x the SWA bytes of a slot; cap mode: 0)
    swa_cap_tokens: int = 0  # cap mode: the SWA pool's slots, whatever the context
    swa_slot: float = 0.0  # bytes of one SWA slot across the layers

    @property
    def fixed(self) -> int:
        """Bytes of the cap-mode SWA pool (0 in ratio mode)."""
        return int(self.swa_cap_tokens * self.swa_slot)

    @property
    def per_token(self) -> float:
        """The pools that grow with the context, per token of it."""
        return self.full + self.swa

    def total(self, tokens: int) -> int:
        """Bytes of every pool for `tokens` of context."""
        return self.fixed + int(self.per_token * tokens)


def swa_cap_tokens(config: dict[str, Any], chunk: int, max_running: int = MAX_RUNNING_REQUESTS,
                   draft_tokens: int = 1, radix_cache: bool = True, overlap: bool = True) -> int:
    """SGLang's cap-mode SWA slots: per running request its window, an eviction interval of verify
    tokens and two pages (padding, the decode allocation), plus `chunk` tokens for each prefill chunk
    in flight (2 with the overlap scheduler) and a page, plus 4 x max_running cached prefix tails of a
    window and a page each; rounded up to whole pages."""
    window = int(config.get("sliding_window") or DEFAULT_WINDOW)
    per_request = window + SWA_EVICTION_INTERVAL * draft_tokens + PAGE + PAGE
    cap = per_request * max_running + (2 if overlap else 1) * chunk + PAGE
    tails = PREFIX_TAILS_PER_REQUEST * max_running if radix_cache else 0
    cap += tails * (window + PAGE)
    return -(-cap // PAGE) * PAGE


def kv_bytes(config: dict[str, Any], swa_ratio: float = DEFAULT_SWA_RATIO, draft: bool = False,
             cap_chunk: int | None = None, max_running: int = MAX_RUNNING_REQUESTS) -> KVBytes:
    """KV bytes of `config` (module docstring for what is and is not counted): cap mode, SGLang's default
    on CUDA, when `cap_chunk` (the chunked-prefill size) is given, with a pool for `max_running` running
    requests, else ratio mode with `swa_ratio`."""
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
    slot = _paged(0) * layers
    if draft:
        scale = (layers + 1) / layers
        full, slot = full * scale, slot * scale
    if cap_chunk is None:
        return KVBytes(full=full, swa=swa_ratio * slot, swa_slot=slot)
    block = int(config.get("dspark_block_size") or 1) if draft else 1
    return KVBytes(full=full, swa=0.0, swa_cap_tokens=swa_cap_tokens(config, cap_chunk, max_running, draft_tokens=block),
                   swa_slot=slot)
