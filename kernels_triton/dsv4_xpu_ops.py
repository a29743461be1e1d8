"""DeepSeek-V4 kernels of SGLang's device-generic ("XPU") route, in PyTorch (device-agnostic).

SGLang 0.5.23 sends DeepSeek-V4 through plain `sgl_kernel` functions wherever a module's `_is_xpu` /
`is_xpu()` is true, instead of FlashMLA, TileLang and its CUDA JIT kernels; shims/sgl_kernel/dsv4_xpu.py
serves those names from here (it only adapts signatures). Every function reproduces the CUDA JIT
kernel the XPU branch replaces (the call sites in `sglang/kernels/ops/attention/dsv4/{compress,
norm_rope}.py` and `srt/models/deepseek_v4.py` fix the signatures), written from the kernels' semantics:

- compress plans: uint8 buffers whose byte layout is fixed by the CUDA structs (little endian)
  `DecodePlan {u32 seq_len; i32 write_loc; i32 read_page_0; i32 read_page_1}` (16 B),
  `CompressPlan {u32 seq_len; u16 ragged_id; u16 buffer_len; i32 read_page_0; i32 read_page_1}`
  (16 B, invalid = seq_len 0xFFFFFFFF, 0, 0, -1, -1) and `WritePlan {u32 ragged_id; i32 write_loc}`
  (8 B, invalid = all ones). They are built on the host (they are tiny) and moved to the device.
- C4 / C128 compression: softmax-gated pooling (score + ape bias) over a window of 8 tokens with
  overlap (ratio 4) or 128 tokens (ratio 128), reading older tokens from the paged kv/score state
  buffer and newer ones from the ragged input; decode also writes the new token into the state.
- norm + RoPE + store: RMSNorm, interleaved-pair RoPE on the last 64 dims, then the FP8 store into
  the V4 KV cache (584 B/token, 7 UE8M0 tiles of 64 + bf16 rope; layout in kernels_triton.formats)
  or the indexer caches (FP8: Hadamard + one fp32 scale per 128; FP4: Hadamard + e2m1 with one
  UE8M0 scale per 32).
- V4.1's ratio-1/2 stores (fused_store_cache_v4 / _indexer, store_fp4_index_k_cache).

These functions are their own torch reference: plain tensor code that runs on the inputs' device
(CPU and CUDA alike); the tests compare them with float64 definitions and SGLang's reference code.

CUDA graphs: every function SGLang calls in a decode forward (the decode planners, flash_compress*_decode,
compress_norm_rope_store with is_decode, fused_k_norm_rope_flashmla, fused_q_norm_rope,
fused_q_indexer_rope_hadamard_quant, fused_store_cache_*) is written without host syncs or
data-dependent shapes, so it can be captured: rows that the kernel skips are computed anyway and
masked out (`_select_rows`), and their scatter writes are redirected so that they change no memory
(`_put` with `keep`, `_write_state_masked`). Speculative target verify plans and runs the prefill
compressor inside its graph too: padded prefill plans (use_cuda_graph, or lengths on the device)
are built in fixed shapes (`_prefill_tokens`, `_compact_padded`), and flash_compress*_prefill and
compress_norm_rope_store mask as well (flash_compress*_prefill compacts on the host only for plans
above `_MASKED_WINDOW_BYTES`, i.e. large eager prefills). Only the unpadded prefill plan (a row count
that depends on the data) is built on the host; SGLang asks for it in eager prefill only.
"""

from __future__ import annotations

import torch

from kernels_triton._dispatch import first_rows
from kernels_triton.formats import E4M3_MAX as FP8_MAX
from kernels_triton.formats import (
    INDEXER_FP4_BYTES,
    INDEXER_FP8_BYTES,
    V4_DATA_BYTES,
    V4_SCALE_BYTES,
    V4_TILE,
)
from kernels_triton.formats import V4_DIM_NOPE as V4_NOPE
from kernels_triton.formats import V4_DIM_ROPE as ROPE_DIM
from kernels_triton.formats import v4_page_bytes as _v4_page_bytes
from kernels_triton.formats.codecs import e2m1_encode, e8m0_shift_to_float, to_e4m3_bytes
from kernels_triton.formats.codecs import ue8m0_exponent as _ue8m0
from kernels_triton.formats.codecs import ue8m0_inverse as _inv_ue8m0

# ------------------------------------------------------------------------------------------------
# Layout constants (facts from SGLang 0.5.23's compress_v2.cuh, kv_layout.cuh, fused_norm_rope_v2.cuh;
# the V4 cache and indexer cache byte layouts are in kernels_triton.formats)
# ------------------------------------------------------------------------------------------------
PLAN_BYTES = 16  # DecodePlan and CompressPlan
WRITE_PLAN_BYTES = 8  # WritePlan
QUANT_EPS = 1e-4  # the fused kernels clamp amax at 1e-4 before deriving a scale
_U32_INVALID = -1  # 0xFFFFFFFF read as int32


def _tdiv(a: torch.Tensor, b: int) -> torch.Tensor:
    """C integer division (truncates toward zero), so negative sentinels map as the CUDA code maps them."""
    return torch.div(a, b, rounding_mode="trunc")


def _tmod(a: torch.Tensor, b: int) -> torch.Tensor:
    """C `%` (sign of the dividend)."""
    return torch.fmod(a, b)


def _host_i64(t: torch.Tensor) -> torch.Tensor:
    return t.detach().to("cpu", torch.int64)


def _dev_i64(t: torch.Tensor) -> torch.Tensor:
    """int64 on the tensor's own device: the decode planners are element-wise, so they stay on the
    GPU without a host round trip (one less sync per layer, and capturable in a CUDA graph)."""
    return t.detach().to(torch.int64)


# ------------------------------------------------------------------------------------------------
# Graph-safe row masking (no host sync, no data-dependent shape)
# ------------------------------------------------------------------------------------------------
_SAME_SIZE_INT = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def _select_rows(keep: torch.Tensor, new: torch.Tensor, old: torch.Tensor) -> torch.Tensor:
    """Row i of `new` where keep[i], else row i of `old`, bit for bit (selected on an integer view, so
    NaN payloads and -0.0 in rows that are kept as they were come back unchanged)."""
    it = _SAME_SIZE_INT[old.element_size()]
    shape = (-1,) + (1,) * (old.dim() - 1)
    out = torch.where(keep.view(shape), new.to(old.dtype).contiguous().view(it), old.contiguous().view(it))
    return out.view(old.dtype)


def _table_rows(table: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """table[idx] with Python's wrap-around for -len <= idx < 0; other out-of-range indices (which only
    masked-out rows may carry) are clamped instead of faulting."""
    n = table.shape[0]
    idx = idx.to(torch.int64)
    return table[torch.where(idx < 0, idx + n, idx).clamp(0, n - 1)]


# ------------------------------------------------------------------------------------------------
# Plan packing
# ------------------------------------------------------------------------------------------------
def _pack_words(words: torch.Tensor, device: torch.device) -> torch.Tensor:
    """int64 [N, k] words -> uint8 [N, 4k]: each word stored as a little-endian 32-bit value."""
    w32 = (words & 0xFFFFFFFF).to(torch.int64)
    w32 = torch.where(w32 >= 2**31, w32 - 2**32, w32).to(torch.int32).contiguous()
    return w32.view(torch.uint8).reshape(words.shape[0], 4 * words.shape[1]).to(device)


def _plan_c_words(seq_len: torch.Tensor, ragged: torch.Tensor, buffer_len: torch.Tensor,
                  rp0: torch.Tensor, rp1: torch.Tensor) -> torch.Tensor:
    """CompressPlan as four 32-bit words: u16 ragged_id and u16 buffer_len share word 1."""
    return torch.stack([seq_len, (ragged & 0xFFFF) | ((buffer_len & 0xFFFF) << 16), rp0, rp1], dim=1)


def _prefill_events(seq_lens: torch.Tensor, extend_lens: torch.Tensor, num_q_tokens: int, ratio: int,
                    first_write: torch.Tensor, extra_write: torch.Tensor | None
                    ) -> tuple[torch.Tensor, ...]:
    """Stage 0 of the prefill planner: which ragged tokens compress and which write into the state.

    Returns, per compress event, (batch, position, ragged_id, buffer_len) and per write event
    (batch, position, ragged_id), in batch-then-token order (the host planner's order).
    `first_write[b]` is the first position of request b that is written; `extra_write` is a
    per-token mask of additional writes (the ratio-4 SWA page tail), or None.
    """
    if ratio not in (4, 128):
        raise ValueError(f"compress_ratio must be 4 or 128, got {ratio}")
    ext = extend_lens
    if bool((ext <= 0).any()) or bool((ext > seq_lens).any()):
        raise ValueError("every request needs 0 < extend_len <= seq_len")
    if int(ext.sum()) != num_q_tokens:
        raise ValueError(f"extend lengths sum to {int(ext.sum())}, not num_q_tokens={num_q_tokens}")
    if num_q_tokens > 65536 or seq_lens.shape[0] > num_q_tokens:
        raise ValueError("ragged ids are uint16: at most 65536 tokens, and batch_size <= num_q_tokens")
    window = ratio * 2 if ratio == 4 else ratio
    batch = torch.repeat_interleave(torch.arange(seq_lens.shape[0]), ext)
    starts = torch.cumsum(ext, 0) - ext
    ragged = torch.arange(num_q_tokens)
    j = ragged - starts[batch]
    pos = (seq_lens - ext)[batch] + j
    is_c = (pos + 1) % ratio == 0
    buffer_len = window - torch.clamp(j + 1, max=window)
    is_w = pos >= first_write[batch]
    if extra_write is not None:
        is_w |= extra_write(pos)
    return (batch[is_c], pos[is_c], ragged[is_c], buffer_len[is_c], batch[is_w], pos[is_w], ragged[is_w])


def _prefill_tokens(seq_lens: torch.Tensor, extend_lens: torch.Tensor, num_q_tokens: int, ratio: int,
                    first_write: torch.Tensor, extra_write: object) -> tuple[torch.Tensor, ...]:
    """Stage 0 for every ragged token, in fixed shapes (the padded, CUDA-graph-safe planner).

    Returns [num_q_tokens] tensors (batch, position, ragged_id, buffer_len, is_compress, is_write) on
    seq_lens' device; the events are the tokens with is_compress / is_write, in token order (the
    order of `_prefill_events`). Tokens past sum(extend_lens) are neither. The input checks of
    `_prefill_events` run only on host tensors (on the device they would sync).
    """
    if ratio not in (4, 128):
        raise ValueError(f"compress_ratio must be 4 or 128, got {ratio}")
    n, b = int(num_q_tokens), seq_lens.shape[0]
    if n > 65536 or b > n or (b == 0 and n > 0):
        raise ValueError("ragged ids are uint16: at most 65536 tokens, and 0 < batch_size <= num_q_tokens")
    ext = extend_lens
    if seq_lens.device.type == "cpu" and ext.device.type == "cpu":
        if bool((ext <= 0).any()) or bool((ext > seq_lens).any()):
            raise ValueError("every request needs 0 < extend_len <= seq_len")
        if int(ext.sum()) != n:
            raise ValueError(f"extend lengths sum to {int(ext.sum())}, not num_q_tokens={n}")
    window = ratio * 2 if ratio == 4 else ratio
    ends = torch.cumsum(ext, 0)
    ragged = torch.arange(n, device=seq_lens.device)
    batch = torch.searchsorted(ends, ragged, right=True).clamp(max=max(b - 1, 0))
    in_range = ragged < ends[-1:] if b else torch.zeros_like(ragged, dtype=torch.bool)
    j = ragged - (ends - ext)[batch]
    pos = (seq_lens - ext)[batch] + j
    is_c = ((pos + 1) % ratio == 0) & in_range
    buffer_len = window - torch.clamp(j + 1, max=window)
    is_w = pos >= first_write[batch]
    if extra_write is not None:
        is_w |= extra_write(pos)
    return batch, pos, ragged, buffer_len, is_c, is_w & in_range


def _compact_padded(words: torch.Tensor, keep: torch.Tensor, invalid: list[int]) -> torch.Tensor:
    """The rows of `words` [n, k] with keep, in order, then rows of `invalid` up to n rows (the padded
    plan), in fixed shapes: a cumsum ranks the kept rows; the others are scattered into a spare row n
    of the scratch buffer, which is dropped."""
    n, k = words.shape
    out = torch.empty((n + 1, k), dtype=words.dtype, device=words.device)
    for c, v in enumerate(invalid):
        out[:, c].fill_(v)  # a device fill, not a host copy
    dest = torch.where(keep, torch.cumsum(keep.to(torch.int64), 0) - 1, n)
    out[dest] = words
    return out[:n]


def _state_loc(r2t: torch.Tensor, f2s: torch.Tensor, rid: torch.Tensor, pos: torch.Tensor, swa_page_size: int,
               ring_size: int) -> torch.Tensor:
    """Ratio-4 state slot of token `pos` of request `rid`: full loc -> SWA loc -> ring slot of its page."""
    stride = r2t.shape[1]
    flat = r2t.reshape(-1)
    raw = flat[(rid * stride + pos).clamp(0, flat.numel() - 1)].to(torch.int64)
    swa = f2s[raw.clamp(0, f2s.numel() - 1)].to(torch.int64)
    swa = ((swa + 2**31) % 2**32) - 2**31  # the kernel holds the SWA loc in an int32
    return _tdiv(swa, swa_page_size) * ring_size + _tmod(swa, ring_size)


def _ring_loc(rid: torch.Tensor, pos: torch.Tensor, ring_size: int) -> torch.Tensor:
    """Ratio-128 state slot: a per-request ring of `ring_size` tokens."""
    return rid * ring_size + _tmod(pos, ring_size)


def plan_compress_prefill(req_pool_indices: torch.Tensor, req_to_token: torch.Tensor, full_to_state: torch.Tensor,
                          seq_lens: torch.Tensor, extend_lens: torch.Tensor, pin_buffer: torch.Tensor,
                          num_q_tokens: int, compress_ratio: int, swa_page_size: int, ring_size: int,
                          use_cuda_graph: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Replaces sgl_kernel `plan_compress_prefill` (XPU) = JIT `c_plan.cuh::plan_compress_prefill`
    with use_req_ring=False.

    Returns (plan_c uint8 [C, 16], plan_w uint8 [W, 8]) on `req_pool_indices.device`. A token at
    position p compresses when (p + 1) % ratio == 0; it is written into the compress state when it
    may still be read by a later compression (p >= first_w_pos, or for ratio 4 the last `ratio`
    slots of its SWA page). C and W are the event counts, or num_q_tokens (padded with invalid plans)
    when `use_cuda_graph` or when seq_lens live on the GPU (the device planner always pads).
    `pin_buffer` is the host scratch of the CUDA planner; unused here.
    """
    del pin_buffer
    ratio = int(compress_ratio)
    sps, ring = int(swa_page_size), int(ring_size)
    if sps % ring != 0 or ring % ratio != 0:
        raise ValueError("need swa_page_size % ring_size == 0 and ring_size % compress_ratio == 0")
    device = req_pool_indices.device
    pad = bool(use_cuda_graph) or seq_lens.device.type != "cpu"
    if pad:
        # Padded plans (prefill graphs, and speculative target verify, which SGLang plans inside its
        # CUDA graph): built on the device in fixed shapes, no host round trip.
        sl, el = _dev_i64(seq_lens).to(device), _dev_i64(extend_lens).to(device)
        rid_all, r2t, f2s = _dev_i64(req_pool_indices), req_to_token.detach().to(device), \
            _dev_i64(full_to_state).to(device)
    else:
        sl, el = _host_i64(seq_lens), _host_i64(extend_lens)
        rid_all, r2t, f2s = _host_i64(req_pool_indices), req_to_token.detach().cpu(), _host_i64(full_to_state)
    overlap = ratio == 4
    window = 2 * ratio if overlap else ratio
    # Trailing tokens kept resident for speculative verify (0 when the ring is one window wide).
    mtp_pad = ring - window + 2 if ring > window else 0
    last_c = sl // ratio * ratio
    first_w = torch.minimum(last_c - (ratio if overlap else 0), sl - mtp_pad)
    extra = (lambda p: p % sps >= sps - ratio) if overlap else None
    if pad:
        # Words for every token; the events are compacted at the end.
        cb, cpos, cragged, cbuf, is_c, is_w = _prefill_tokens(sl, el, int(num_q_tokens), ratio, first_w, extra)
        wb, wpos, wragged = cb, cpos, cragged
    else:
        cb, cpos, cragged, cbuf, wb, wpos, wragged = _prefill_events(sl, el, int(num_q_tokens), ratio, first_w,
                                                                     extra)

    crid = rid_all[cb]
    pos1 = cpos
    pos0 = torch.clamp(pos1 - ratio, min=0)
    if ratio == 128:
        rp0, rp1 = _tdiv(_ring_loc(crid, pos0, ring), ratio), _tdiv(_ring_loc(crid, pos1, ring), ratio)
    else:
        rp0 = _tdiv(_state_loc(r2t, f2s, crid, pos0, sps, ring), ratio)
        rp1 = _tdiv(_state_loc(r2t, f2s, crid, pos1, sps, ring), ratio)
    # A window fully inside the extend reads no state: its pages keep the stage-0 values (-1, batch id).
    has_buf = cbuf > 0
    rp0 = torch.where(has_buf, rp0, torch.full_like(rp0, -1))
    rp1 = torch.where(has_buf, rp1, cb)
    words_c = _plan_c_words(pos1 + 1, cragged, cbuf, rp0, rp1)

    wrid = rid_all[wb]
    wloc = _ring_loc(wrid, wpos, ring) if ratio == 128 else _state_loc(r2t, f2s, wrid, wpos, sps, ring)
    words_w = torch.stack([wragged, wloc], dim=1)
    if pad:
        words_c = _compact_padded(words_c, is_c, [_U32_INVALID, 0, -1, -1])
        words_w = _compact_padded(words_w, is_w, [_U32_INVALID, -1])
    return _pack_words(words_c, device), _pack_words(words_w, device)


def plan_compress_decode(req_pool_indices: torch.Tensor, req_to_token: torch.Tensor, full_to_state: torch.Tensor,
                         seq_lens: torch.Tensor, compress_ratio: int, swa_page_size: int,
                         ring_size: int) -> torch.Tensor:
    """Replaces sgl_kernel `plan_compress_decode` (XPU) = JIT `plan_compress_decode` (use_req_ring=False).

    One DecodePlan per request (uint8 [B, 16]): the new token (position seq_len - 1) is written at
    write_loc; read_page_0 / read_page_1 are the state pages holding positions seq_len-1-ratio
    (clamped at 0) and seq_len-1.
    """
    ratio, sps, ring = int(compress_ratio), int(swa_page_size), int(ring_size)
    device = req_pool_indices.device
    rid, sl = _dev_i64(req_pool_indices), _dev_i64(seq_lens).to(device)
    pos1 = sl - 1
    pos0 = torch.clamp(pos1 - ratio, min=0)
    if ratio == 128:
        write = _ring_loc(rid, pos1, ring)
        rp0 = _tdiv(_ring_loc(rid, pos0, ring), ratio)
        rp1 = _tdiv(write, ratio)
    else:
        r2t, f2s = req_to_token.detach().to(device), _dev_i64(full_to_state).to(device)
        write = _state_loc(r2t, f2s, rid, pos1, sps, ring)
        rp0 = _tdiv(_state_loc(r2t, f2s, rid, pos0, sps, ring), ratio)
        rp1 = _tdiv(write, ratio)
    return _pack_words(torch.stack([sl, write, rp0, rp1], dim=1), device)


def _legacy_page(rid: torch.Tensor, pos: torch.Tensor, ratio: int) -> torch.Tensor:
    """Legacy per-request ring: ratio 4 owns 2 pages per request (alternating by window), 128 one."""
    if ratio == 4:
        return rid * 2 + (_tdiv(pos, 4) & 1)
    return rid


def _legacy_loc(rid: torch.Tensor, pos: torch.Tensor, ratio: int) -> torch.Tensor:
    return _legacy_page(rid, pos, ratio) * ratio + _tmod(pos, ratio)


def plan_compress_prefill_legacy(req_pool_indices: torch.Tensor, seq_lens: torch.Tensor,
                                 extend_lens: torch.Tensor, pin_buffer: torch.Tensor, num_q_tokens: int,
                                 compress_ratio: int, use_cuda_graph: bool = False
                                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """Replaces sgl_kernel `plan_compress_prefill_legacy` (XPU) = JIT `plan_compress_prefill_legacy`.

    Same events as `plan_compress_prefill` without the SWA-page tail writes or the MTP pad, slots from
    the legacy per-request ring (`_legacy_page`). Every valid CompressPlan gets its read pages.
    """
    del pin_buffer
    ratio = int(compress_ratio)
    device = req_pool_indices.device
    pad = bool(use_cuda_graph)
    if pad:  # fixed shapes on the device, as in plan_compress_prefill
        sl, el, rid_all = _dev_i64(seq_lens).to(device), _dev_i64(extend_lens).to(device), _dev_i64(req_pool_indices)
    else:
        sl, el, rid_all = _host_i64(seq_lens), _host_i64(extend_lens), _host_i64(req_pool_indices)
    first_w = sl // ratio * ratio - (ratio if ratio == 4 else 0)
    if pad:
        cb, cpos, cragged, cbuf, is_c, is_w = _prefill_tokens(sl, el, int(num_q_tokens), ratio, first_w, None)
        wb, wpos, wragged = cb, cpos, cragged
    else:
        cb, cpos, cragged, cbuf, wb, wpos, wragged = _prefill_events(sl, el, int(num_q_tokens), ratio, first_w,
                                                                     None)
    crid = rid_all[cb]
    pos0 = torch.clamp(cpos - ratio, min=0)
    words_c = _plan_c_words(cpos + 1, cragged, cbuf, _legacy_page(crid, pos0, ratio), _legacy_page(crid, cpos, ratio))
    words_w = torch.stack([wragged, _legacy_loc(rid_all[wb], wpos, ratio)], dim=1)
    if pad:
        words_c = _compact_padded(words_c, is_c, [_U32_INVALID, 0, -1, -1])
        words_w = _compact_padded(words_w, is_w, [_U32_INVALID, -1])
    return _pack_words(words_c, device), _pack_words(words_w, device)


def plan_compress_decode_legacy(req_pool_indices: torch.Tensor, seq_lens: torch.Tensor,
                                compress_ratio: int) -> torch.Tensor:
    """Replaces sgl_kernel `plan_compress_decode_legacy` (XPU) = JIT `plan_compress_decode_legacy`."""
    ratio = int(compress_ratio)
    rid, sl = _dev_i64(req_pool_indices), _dev_i64(seq_lens).to(req_pool_indices.device)
    pos1 = sl - 1
    pos0 = torch.clamp(pos1 - ratio, min=0)
    words = torch.stack([sl, _legacy_loc(rid, pos1, ratio), _legacy_page(rid, pos0, ratio),
                         _legacy_page(rid, pos1, ratio)], dim=1)
    return _pack_words(words, req_pool_indices.device)


def _unpack_words(plan: torch.Tensor, width: int) -> torch.Tensor:
    """uint8 [N, 4*width] plan -> int64 [N, width] (each word read as int32)."""
    return plan.contiguous().view(torch.int32).reshape(plan.shape[0], width).to(torch.int64)


def _decode_plan(plan_d: torch.Tensor) -> tuple[torch.Tensor, ...]:
    w = _unpack_words(plan_d, 4)
    return w[:, 0] & 0xFFFFFFFF, w[:, 1], w[:, 2], w[:, 3]


def _compress_plan(plan_c: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """(valid, seq_len, ragged_id, buffer_len, read_page_0, read_page_1) of CompressPlans."""
    w = _unpack_words(plan_c, 4)
    valid = w[:, 0] != _U32_INVALID
    return valid, w[:, 0] & 0xFFFFFFFF, w[:, 1] & 0xFFFF, (w[:, 1] >> 16) & 0xFFFF, w[:, 2], w[:, 3]


def _write_plan(plan_w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    w = _unpack_words(plan_w, 2)
    return w[:, 0] != _U32_INVALID, w[:, 0] & 0xFFFFFFFF, w[:, 1]


# ------------------------------------------------------------------------------------------------
# C4 / C128 compression
# ------------------------------------------------------------------------------------------------
def _gated_pool(kv: torch.Tensor, score: torch.Tensor, ape: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
    """[R, W, D] values and scores (input dtype) + ape [W, D] -> [R, D]: softmax over W in fp32."""
    logits = score.float() + ape.float().unsqueeze(0)
    weights = torch.softmax(logits, dim=1)
    return (weights * kv.float()).sum(1).to(out_dtype)


def _as_input(buf_vals: torch.Tensor, in_dtype: torch.dtype) -> torch.Tensor:
    """State values are first rounded to the input dtype (the kernels convert before the math)."""
    return buf_vals.to(in_dtype)


def _check_compress(kv_buffer: torch.Tensor, kv_input: torch.Tensor, ape: torch.Tensor, ratio: int) -> int:
    coff = 4 if ratio == 4 else 2
    hd = kv_input.shape[-1] // coff
    if kv_buffer.dim() != 3 or kv_buffer.shape[1] != ratio or kv_buffer.shape[2] != coff * hd:
        raise ValueError(f"kv_buffer must be [pages, {ratio}, {coff * hd}], got {tuple(kv_buffer.shape)}")
    if tuple(ape.shape) != ((8 if ratio == 4 else 128), hd):
        raise ValueError(f"ape must be [{8 if ratio == 4 else 128}, {hd}], got {tuple(ape.shape)}")
    return hd


def _c4_window(kv_buffer: torch.Tensor, kv_input: torch.Tensor, src: torch.Tensor, rp0: torch.Tensor,
               rp1: torch.Tensor, buffer_len: torch.Tensor, need_overlap: torch.Tensor, hd: int
               ) -> tuple[torch.Tensor, torch.Tensor]:
    """The 8-token window of each compression: (kv, score) [R, 8, hd] in the input dtype.

    Slot i < 4 is the overlap half (previous window: first and third quarter of an element), slot
    i >= 4 the current window (second and fourth quarter). Slot i comes from the state page when
    i < buffer_len, else from ragged input row src - 7 + i. Without overlap (first window) the
    overlap half has value 0 and score -inf.
    """
    dev, in_dtype = kv_input.device, kv_input.dtype
    r = src.shape[0]
    i = torch.arange(4, device=dev)
    n_in = kv_input.shape[0]
    ov_rows = kv_input[(src[:, None] - 7 + i).clamp(0, n_in - 1)]  # [R, 4, 4hd]
    cur_rows = kv_input[(src[:, None] - 3 + i).clamp(0, n_in - 1)]
    buf0 = _as_input(kv_buffer[rp0.clamp(0, kv_buffer.shape[0] - 1)], in_dtype)  # [R, 4, 4hd]
    buf1 = _as_input(kv_buffer[rp1.clamp(0, kv_buffer.shape[0] - 1)], in_dtype)
    use0 = (i[None, :] < buffer_len[:, None]).unsqueeze(-1)
    use1 = ((i[None, :] + 4) < buffer_len[:, None]).unsqueeze(-1)
    ov = torch.where(use0, buf0, ov_rows)
    cur = torch.where(use1, buf1, cur_rows)
    kv = torch.cat([ov[..., :hd], cur[..., hd:2 * hd]], dim=1)
    score = torch.cat([ov[..., 2 * hd:3 * hd], cur[..., 3 * hd:]], dim=1)
    no_ov = ~need_overlap.view(r, 1, 1) & (torch.arange(8, device=dev) < 4).view(1, 8, 1)
    kv = kv.masked_fill(no_ov, 0)
    score = score.float().masked_fill(no_ov, float("-inf"))
    return kv, score


def _c128_window(kv_buffer: torch.Tensor, kv_input: torch.Tensor, src: torch.Tensor, rp1: torch.Tensor,
                 buffer_len: torch.Tensor, hd: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The 128-token window: slot j from state page rp1 when j < buffer_len, else input row src-127+j."""
    dev = kv_input.device
    j = torch.arange(128, device=dev)
    rows = kv_input[(src[:, None] - 127 + j).clamp(0, kv_input.shape[0] - 1)]  # [R, 128, 2hd]
    buf = _as_input(kv_buffer[rp1.clamp(0, kv_buffer.shape[0] - 1)], kv_input.dtype)
    win = torch.where((j[None, :] < buffer_len[:, None]).unsqueeze(-1), buf, rows)
    return win[..., :hd], win[..., hd:]


def _write_state(kv_buffer: torch.Tensor, rows: torch.Tensor, loc: torch.Tensor) -> None:
    """kv_buffer viewed as one element per token slot: slot loc[i] <- rows[i] (cast to the buffer dtype)."""
    if loc.numel():
        kv_buffer.view(-1, kv_buffer.shape[-1])[loc] = rows.to(kv_buffer.dtype)


def _write_state_masked(kv_buffer: torch.Tensor, rows: torch.Tensor, loc: torch.Tensor, keep: torch.Tensor) -> None:
    """`_write_state` of the rows with keep, in fixed shapes: the other rows repeat the first kept
    row's write, or (none kept) write slot 0's own values back (see `_put`)."""
    if loc.numel() == 0:
        return
    flat = kv_buffer.view(-1, kv_buffer.shape[-1])
    data = rows.to(kv_buffer.dtype)
    first = torch.argmax(keep.to(torch.int32)).view(1)
    any_keep = keep.any()
    loc_m = torch.where(any_keep, loc.index_select(0, first), torch.zeros_like(first))
    data_m = torch.where(any_keep, data.index_select(0, first), flat[:1])
    flat[torch.where(keep, loc, loc_m)] = torch.where(keep[:, None], data, data_m)


# Up to this many bytes of windows, the prefill compressors pool every plan row and mask (fixed
# shapes: target-verify plans are built and consumed inside SGLang's CUDA graph); a larger (prefill)
# plan compacts its valid rows on the host instead, since pooling padding rows would cost more.
_MASKED_WINDOW_BYTES = 64 << 20


def flash_compress4_decode(kv_buffer: torch.Tensor, kv_input: torch.Tensor, kv_output: torch.Tensor,
                           ape: torch.Tensor, plan_d: torch.Tensor) -> None:
    """Replaces sgl_kernel `flash_compress4_decode` (XPU) = JIT `FlashCompress4Kernel::run_decode` (c4_v2.cuh).

    kv_buffer [pages, 4, 4*hd] (| kv overlap | kv | score overlap | score |), kv_input [B, 4*hd],
    kv_output [B, hd], ape [8, hd]. Writes each token into its state slot, then for requests whose
    seq_len is a multiple of 4 pools the 8 state slots of pages read_page_0 (overlap half) and
    read_page_1 into kv_output (other rows untouched).
    """
    hd = _check_compress(kv_buffer, kv_input, ape, 4)
    dev = kv_input.device
    seq, write, rp0, rp1 = (t.to(dev) for t in _decode_plan(plan_d))
    _write_state(kv_buffer, kv_input, write)
    n = seq.shape[0]
    if n == 0:
        return
    # Graph-safe: pool every row (the window reads are clamped in range) and keep the result only
    # where the request compresses; the other output rows get their old bytes back.
    rows = torch.arange(n, device=dev)
    kv, score = _c4_window(kv_buffer, kv_input, rows, rp0, rp1, torch.full_like(rows, 8), seq > 4, hd)
    out = kv_output[:n]
    out.copy_(_select_rows(seq % 4 == 0, _gated_pool(kv, score, ape, kv_output.dtype), out))


def flash_compress4_prefill(kv_buffer: torch.Tensor, kv_input: torch.Tensor, kv_output: torch.Tensor,
                            ape: torch.Tensor, plan_c: torch.Tensor, plan_w: torch.Tensor) -> None:
    """Replaces sgl_kernel `flash_compress4_prefill` (XPU) = JIT `FlashCompress4Kernel::run_prefill`.

    kv_input is ragged [num_q_tokens, 4*hd]; kv_output [C, hd] gets one row per CompressPlan (invalid
    plans leave their row). All compressions read the state before the write plans store tokens.
    """
    hd = _check_compress(kv_buffer, kv_input, ape, 4)
    dev = kv_input.device
    valid, seq, ragged, buf_len, rp0, rp1 = (t.to(dev) for t in _compress_plan(plan_c))
    c = valid.shape[0]
    if c and c * 8 * 2 * hd * 4 <= _MASKED_WINDOW_BYTES:  # graph-safe: pool every row, keep the valid ones
        kv, score = _c4_window(kv_buffer, kv_input, ragged, rp0, rp1, buf_len, seq > 4, hd)
        out = kv_output[:c]
        out.copy_(_select_rows(valid, _gated_pool(kv, score, ape, kv_output.dtype), out))
    elif c:  # a large prefill plan (never captured): only the valid rows
        rows = torch.nonzero(valid).flatten()
        kv, score = _c4_window(kv_buffer, kv_input, ragged[rows], rp0[rows], rp1[rows], buf_len[rows],
                               seq[rows] > 4, hd)
        kv_output[rows] = _gated_pool(kv, score, ape, kv_output.dtype)
    w_valid, w_ragged, w_loc = (t.to(dev) for t in _write_plan(plan_w))
    _write_state_masked(kv_buffer, _table_rows(kv_input, w_ragged), w_loc, w_valid)


def flash_compress128_decode(kv_buffer: torch.Tensor, kv_input: torch.Tensor, kv_output: torch.Tensor,
                             ape: torch.Tensor, plan_d: torch.Tensor) -> None:
    """Replaces sgl_kernel `flash_compress128_decode` (XPU) = JIT `FlashCompress128Kernel::run_decode` (c128_v2.cuh).

    kv_buffer [pages, 128, 2*hd] (| kv | score |), kv_input [B, 2*hd], ape [128, hd]. Writes the token,
    then when it filled the last slot of its page (write_loc % 128 == 127) pools page read_page_1.
    """
    hd = _check_compress(kv_buffer, kv_input, ape, 128)
    dev = kv_input.device
    _, write, _, rp1 = (t.to(dev) for t in _decode_plan(plan_d))
    _write_state(kv_buffer, kv_input, write)
    n = write.shape[0]
    if n == 0:
        return
    # Graph-safe, as in flash_compress4_decode: pool all rows, keep those that filled their page.
    rows = torch.arange(n, device=dev)
    kv, score = _c128_window(kv_buffer, kv_input, rows, rp1, torch.full_like(rows, 128), hd)
    out = kv_output[:n]
    out.copy_(_select_rows(_tmod(write, 128) == 127, _gated_pool(kv, score, ape, kv_output.dtype), out))


def flash_compress128_prefill(kv_buffer: torch.Tensor, kv_input: torch.Tensor, kv_output: torch.Tensor,
                              ape: torch.Tensor, plan_c: torch.Tensor, plan_w: torch.Tensor) -> None:
    """Replaces sgl_kernel `flash_compress128_prefill` (XPU) = JIT `FlashCompress128Kernel::run_prefill`."""
    hd = _check_compress(kv_buffer, kv_input, ape, 128)
    dev = kv_input.device
    valid, _, ragged, buf_len, _, rp1 = (t.to(dev) for t in _compress_plan(plan_c))
    c = valid.shape[0]
    if c and c * 128 * 2 * hd * 4 <= _MASKED_WINDOW_BYTES:  # graph-safe, as in flash_compress4_prefill
        kv, score = _c128_window(kv_buffer, kv_input, ragged, rp1, buf_len, hd)
        out = kv_output[:c]
        out.copy_(_select_rows(valid, _gated_pool(kv, score, ape, kv_output.dtype), out))
    elif c:
        rows = torch.nonzero(valid).flatten()
        kv, score = _c128_window(kv_buffer, kv_input, ragged[rows], rp1[rows], buf_len[rows], hd)
        kv_output[rows] = _gated_pool(kv, score, ape, kv_output.dtype)
    w_valid, w_ragged, w_loc = (t.to(dev) for t in _write_plan(plan_w))
    _write_state_masked(kv_buffer, _table_rows(kv_input, w_ragged), w_loc, w_valid)


# ------------------------------------------------------------------------------------------------
# Norm, RoPE, Hadamard, quantization, cache stores
# ------------------------------------------------------------------------------------------------
def _rms_norm(x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
    """fp32 RMSNorm over the last dim (weight, when given, already in the kernel's dtype)."""
    xf = x.float()
    y = xf * torch.rsqrt(xf.square().mean(-1, keepdim=True) + eps)
    return y if weight is None else y * weight.float()


def _rope_pairs(x: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
    """Rotate interleaved (real, imag) pairs of fp32 `x` [..., 64] by `freqs` [..., 64] = (cos, sin) pairs."""
    xr, xi = x[..., 0::2], x[..., 1::2]
    c, s = freqs[..., 0::2], freqs[..., 1::2]
    return torch.stack([xr * c - xi * s, xr * s + xi * c], dim=-1).flatten(-2)


def _hadamard128(x: torch.Tensor) -> torch.Tensor:
    """Orthonormal Walsh-Hadamard transform (natural order) of fp32 rows [..., 128].

    Butterflies over index bits 0..6 in that order, lower half keeping the sum: the kernels' order.
    """
    shape = x.shape
    y = x.reshape(-1, 128)
    for b in range(7):
        h = 1 << b
        v = y.reshape(-1, 128 // (2 * h), 2, h)
        y = torch.stack([v[:, :, 0] + v[:, :, 1], v[:, :, 0] - v[:, :, 1]], dim=2).reshape(-1, 128)
    # torch.full fills on the device (torch.tensor would copy from the host: not capturable).
    return (y * torch.rsqrt(torch.full((), 128.0, device=x.device))).reshape(shape)


_to_e4m3 = to_e4m3_bytes  # saturating fp32 -> e4m3 bytes (round to nearest even)


def _e2m1_code(x: torch.Tensor) -> torch.Tensor:
    """e2m1 code of fp32 x, ties down (threshold rounding, SGLang's FP4 indexer store)."""
    return e2m1_encode(x, ties="down")


def _pages(kvcache: torch.Tensor, page_bytes: int) -> torch.Tensor:
    """The cache as [num_pages, page_bytes] uint8 (the kernels require exactly this page stride)."""
    u8 = kvcache.view(torch.uint8) if kvcache.element_size() == 1 else kvcache
    if u8.dim() != 2 or u8.stride(0) != page_bytes or u8.stride(1) != 1:
        raise ValueError(f"kvcache must be [pages, {page_bytes}] bytes with stride ({page_bytes}, 1), "
                         f"got shape {tuple(u8.shape)} stride {u8.stride()}")
    return u8


def _put(pages: torch.Tensor, page: torch.Tensor, offset: torch.Tensor, data: torch.Tensor,
         keep: torch.Tensor | None = None) -> None:
    """pages[page[i], offset[i] + k] = data[i, k] for all k; with `keep`, only rows with keep[i] change memory.

    Masked-out rows still take part in the (fixed-shape) scatter, but their page/offset (possibly
    garbage) are never used: they repeat the first kept row's write (same place, same bytes, so the
    order of duplicate writes does not matter) or, when no row is kept, write the bytes already at
    page 0, offset 0 back to where they are.
    """
    if keep is not None and data.shape[0]:
        first = torch.argmax(keep.to(torch.int32)).view(1)  # first kept row (0 when none is)
        any_keep = keep.any()
        page_m = torch.where(any_keep, page.index_select(0, first), torch.zeros_like(first))
        off_m = torch.where(any_keep, offset.index_select(0, first), torch.zeros_like(first))
        data_m = torch.where(any_keep, data.index_select(0, first), pages[0, :data.shape[1]].unsqueeze(0))
        page = torch.where(keep, page, page_m)
        offset = torch.where(keep, offset, off_m)
        data = torch.where(keep[:, None], data, data_m)
    cols = offset[:, None] + torch.arange(data.shape[1], device=pages.device)[None, :]
    pages[page[:, None].expand_as(cols), cols] = data


def _store_v4(pages: torch.Tensor, loc: torch.Tensor, page_size: int, data: torch.Tensor, freqs: torch.Tensor,
              round_nope_bf16: bool, keep: torch.Tensor | None = None) -> None:
    """Normalized fp32 rows [N, 512] -> V4 cache rows at `loc`: rope the tail, FP8-quantize the 448 nope dims.

    Each 64-wide tile gets a UE8M0 scale 2^ceil(log2(max(amax, 1e-4) / 448)). The compress store
    rounds the nope values to bf16 first (it mirrors the unfused bf16 path); the main K store does not.
    """
    nope = data[:, :V4_NOPE]
    if round_nope_bf16:
        nope = nope.to(torch.bfloat16).float()
    tiles = nope.reshape(-1, V4_NOPE // V4_TILE, V4_TILE)
    e = _ue8m0(torch.clamp(tiles.abs().amax(-1), min=QUANT_EPS) / FP8_MAX)
    q = _to_e4m3(tiles * _inv_ue8m0(e).unsqueeze(-1)).reshape(-1, V4_NOPE)
    rope = _rope_pairs(data[:, V4_NOPE:], freqs).to(torch.bfloat16).contiguous().view(torch.uint8)
    page, slot = loc // page_size, loc % page_size
    _put(pages, page, slot * V4_DATA_BYTES, torch.cat([q, rope], dim=1), keep)
    _put(pages, page, page_size * V4_DATA_BYTES + slot * V4_SCALE_BYTES, e.to(torch.uint8), keep)


def _store_indexer_fp8(pages: torch.Tensor, loc: torch.Tensor, page_size: int, data: torch.Tensor,
                       keep: torch.Tensor | None = None) -> None:
    """Hadamard-rotated fp32 rows [N, 128] -> FP8 indexer cache (128 e4m3 + fp32 scale amax/448)."""
    scale = torch.clamp(data.abs().amax(-1), min=QUANT_EPS) / FP8_MAX
    q = _to_e4m3(data * (1.0 / scale).unsqueeze(-1))
    page, slot = loc // page_size, loc % page_size
    _put(pages, page, slot * 128, q, keep)
    _put(pages, page, page_size * 128 + slot * 4, scale.contiguous().view(torch.uint8).reshape(-1, 4), keep)


def _quant_fp4_rows(data: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 rows [N, 128] -> (e2m1 bytes [N, 64], even index in the low nibble; UE8M0 bytes [N, 4] per 32)."""
    groups = data.reshape(-1, 4, 32)
    e = _ue8m0(torch.clamp(groups.abs().amax(-1), min=QUANT_EPS) / 6.0)
    codes = _e2m1_code(groups * _inv_ue8m0(e).unsqueeze(-1)).reshape(-1, 128)
    packed = (codes[:, 0::2] | (codes[:, 1::2] << 4)).to(torch.uint8)
    return packed, e.to(torch.uint8)


def _store_indexer_fp4(pages: torch.Tensor, loc: torch.Tensor, page_size: int, data: torch.Tensor,
                       keep: torch.Tensor | None = None) -> None:
    packed, e = _quant_fp4_rows(data)
    page, slot = loc // page_size, loc % page_size
    _put(pages, page, slot * 64, packed, keep)
    _put(pages, page, page_size * 64 + slot * 4, e, keep)


def compress_norm_rope_store(kv: torch.Tensor, plan: torch.Tensor, norm_weight: torch.Tensor, norm_eps: float,
                             freqs_cis: torch.Tensor, out_loc: torch.Tensor, kvcache: torch.Tensor,
                             is_decode: bool, compress_ratio: int, page_size: int, use_fp4: bool = False) -> None:
    """Replaces sgl_kernel `compress_norm_rope_store` (XPU) = JIT `FusedNormRopeKernel::forward[_fp4]`
    (fused_norm_rope_v2.cuh), V4 layout, no bf16 store.

    kv [N, hd] compressed rows (hd 512: FlashMLA latent; 128: indexer), plan [N, 16] (DecodePlan when
    is_decode, else CompressPlan), freqs_cis [max_pos, 64] fp32 (cos, sin) pairs, out_loc int64
    (indexed by batch row in decode, by the plan's ragged_id in prefill). Rows that compressed
    (decode: seq_len % ratio == 0; prefill: valid plan) are RMS-normalized with norm_weight (cast to
    kv's dtype, as the CUDA wrapper does), roped at position seq_len - ratio and stored.
    """
    ratio, page_size = int(compress_ratio), int(page_size)
    hd = kv.shape[-1]
    if hd not in (128, 512):
        raise ValueError(f"head_dim must be 128 (indexer) or 512 (latent), got {hd}")
    if use_fp4 and hd != 128:
        raise ValueError("the FP4 store is the indexer's (head_dim 128)")
    dev = kv.device
    keep = None
    if is_decode:
        # Decode (captured in CUDA graphs): every batch row is computed and the rows that did not
        # compress are masked out of the store (no host sync, fixed shapes).
        seq, _, _, _ = (t.to(dev) for t in _decode_plan(plan))
        n = seq.shape[0]
        if n == 0:
            return
        keep = seq % ratio == 0
        loc = first_rows(out_loc, n).to(torch.int64)
        freqs = _table_rows(freqs_cis, seq - ratio).float()
        data = _rms_norm(kv[:n], norm_weight.to(kv.dtype), norm_eps)
    else:
        # CompressPlans (prefill, and speculative target verify inside the graph): all rows, the
        # invalid (padding) plans masked out.
        keep, seq, ragged, _, _, _ = (t.to(dev) for t in _compress_plan(plan))
        n = keep.shape[0]
        if n == 0:
            return
        loc = _table_rows(out_loc, ragged).to(torch.int64)
        freqs = _table_rows(freqs_cis, seq - ratio).float()
        data = _rms_norm(kv[:n], norm_weight.to(kv.dtype), norm_eps)
    if hd == 512:
        _store_v4(_pages(kvcache, _v4_page_bytes(page_size)), loc, page_size, data, freqs, round_nope_bf16=True,
                  keep=keep)
        return
    data = torch.cat([data[:, :ROPE_DIM], _rope_pairs(data[:, ROPE_DIM:], freqs)], dim=1)
    data = _hadamard128(data)
    if use_fp4:
        _store_indexer_fp4(_pages(kvcache, INDEXER_FP4_BYTES * page_size), loc, page_size, data, keep)
    else:
        _store_indexer_fp8(_pages(kvcache, INDEXER_FP8_BYTES * page_size), loc, page_size, data, keep)


def fused_k_norm_rope_flashmla(kv: torch.Tensor, kv_weight: torch.Tensor, freqs_cis: torch.Tensor,
                               positions: torch.Tensor, out_loc: torch.Tensor, kvcache: torch.Tensor, eps: float,
                               page_size: int) -> None:
    """Replaces sgl_kernel `fused_k_norm_rope_flashmla` (XPU) = JIT `FusedKNormRopeFlashMLAKernel::forward`
    (main_norm_rope.cuh), V4 layout.

    kv [B, 512] (rows may be strided), RMSNorm with kv_weight, RoPE of the last 64 dims at
    positions[b], FP8 store into the V4 cache at out_loc[b]; rows with out_loc < 0 are skipped.
    """
    page_size = int(page_size)
    loc = out_loc.to(torch.int64)
    n = loc.shape[0]
    if n == 0:
        return
    # Graph-safe: all rows are normalized and roped; rows with out_loc < 0 are masked out of the store.
    data = _rms_norm(kv[:n], kv_weight.to(kv.dtype), eps)
    freqs = _table_rows(freqs_cis, first_rows(positions, n)).float()
    _store_v4(_pages(kvcache, _v4_page_bytes(page_size)), loc, page_size, data, freqs, round_nope_bf16=False,
              keep=loc >= 0)


def fused_q_norm_rope(q_input: torch.Tensor, q_output: torch.Tensor, freqs_cis: torch.Tensor,
                      positions: torch.Tensor, eps: float) -> None:
    """Replaces sgl_kernel `fused_q_norm_rope` (XPU) = JIT `FusedQNormRopeKernel::forward` with the norm.

    q [B, H, D]: per head RMSNorm without weight, rounded to q's dtype, then RoPE (fp32 math) of the
    last 64 dims at positions[b], written to q_output [B, H, D] (same dtype; may alias nothing).
    """
    normed = _rms_norm(q_input, None, eps).to(q_input.dtype)
    freqs = freqs_cis[positions.to(torch.int64)].float().unsqueeze(1)  # [B, 1, 64]
    rope = _rope_pairs(normed[..., -ROPE_DIM:].float(), freqs).to(q_output.dtype)
    q_output[..., :-ROPE_DIM] = normed[..., :-ROPE_DIM].to(q_output.dtype)
    q_output[..., -ROPE_DIM:] = rope


def fused_q_indexer_rope_hadamard_quant(q_input: torch.Tensor, q_fp8: torch.Tensor, weight: torch.Tensor,
                                        weights_out: torch.Tensor, weight_scale: float, freqs_cis: torch.Tensor,
                                        positions: torch.Tensor) -> None:
    """Replaces sgl_kernel `fused_q_indexer_rope_hadamard_quant` (XPU) = JIT
    `FusedQIndexerRopeHadamardQuantKernel::forward` (V4: rope on the trailing 64 dims, Hadamard on).

    q [B, H, 128] -> RoPE at positions[b], 128-point Hadamard, per-(token, head) FP8 with scale
    max(amax, 1e-4) / 448 into q_fp8; weights_out [B, H, 1] = weight * weight_scale * scale (fp32).
    """
    data = q_input.float()
    freqs = freqs_cis[positions.to(torch.int64)].float().unsqueeze(1)
    data = torch.cat([data[..., :ROPE_DIM], _rope_pairs(data[..., ROPE_DIM:], freqs)], dim=-1)
    data = _hadamard128(data)
    scale = torch.clamp(data.abs().amax(-1), min=QUANT_EPS) / FP8_MAX  # [B, H]
    q_fp8.view(torch.uint8).copy_(_to_e4m3(data * (1.0 / scale).unsqueeze(-1)))
    w = weight.float() * torch.full((), float(weight_scale), dtype=torch.float32, device=weight.device)
    weights_out.copy_((w * scale).unsqueeze(-1))


# ------------------------------------------------------------------------------------------------
# DeepSeek-V4.1 (ratio 1/2 layers) on the V4 cache layout
# ------------------------------------------------------------------------------------------------
def fused_store_cache_v4(input: torch.Tensor, cache: torch.Tensor, indices: torch.Tensor, page_size: int) -> None:
    """Replaces JIT `FusedStoreCacheFlashMLAKernel<..., V4>::run` (deepseek_v4/store.cuh), which
    `sglang.kernels.ops.attention.dsv4.attn.fused_store_cache(type="flashmla", layout=V4)` calls to
    write V4.1's ratio-1/2 latents (already normalized, roped and fake-quantized) into the V4 cache.

    input [N, 512] (bf16 or fp32), stored as is: the 448 nope dims FP8 e4m3 in 7 tiles of 64, each
    with the UE8M0 scale 2^ceil(log2(max(amax, 1e-4) / 448)); the 64 rope dims cast to bf16. Every
    row is written, like the kernel (callers send padding rows to a dummy slot).
    """
    page_size = int(page_size)
    if input.dim() != 2 or input.shape[1] != V4_NOPE + ROPE_DIM:
        raise ValueError(f"fused_store_cache_v4: input must be [N, 512], got {tuple(input.shape)}")
    if indices.shape[0] != input.shape[0]:
        raise ValueError(f"fused_store_cache_v4: {indices.shape[0]} indices for {input.shape[0]} rows")
    if input.shape[0] == 0:
        return
    pages = _pages(cache, _v4_page_bytes(page_size))
    loc = indices.to(torch.int64)
    tiles = input[:, :V4_NOPE].float().reshape(-1, V4_NOPE // V4_TILE, V4_TILE)
    e = _ue8m0(torch.clamp(tiles.abs().amax(-1), min=QUANT_EPS) / FP8_MAX)
    q = _to_e4m3(tiles * _inv_ue8m0(e).unsqueeze(-1)).reshape(-1, V4_NOPE)
    rope = input[:, V4_NOPE:].to(torch.bfloat16).contiguous().view(torch.uint8)
    page, slot = loc // page_size, loc % page_size
    _put(pages, page, slot * V4_DATA_BYTES, torch.cat([q, rope], dim=1))
    _put(pages, page, page_size * V4_DATA_BYTES + slot * V4_SCALE_BYTES, e.to(torch.uint8))


def fused_store_cache_indexer(input: torch.Tensor, cache: torch.Tensor, indices: torch.Tensor,
                              page_size: int) -> None:
    """Replaces JIT `FusedStoreCacheIndexerKernel::run` (deepseek_v4/store.cuh): rows [N, 128] to the
    FP8 indexer cache (128 e4m3 + one fp32 scale max(amax, 1e-4) / 448 per row), no transform."""
    page_size = int(page_size)
    if input.dim() != 2 or input.shape[1] != 128:
        raise ValueError(f"fused_store_cache_indexer: input must be [N, 128], got {tuple(input.shape)}")
    if input.shape[0] == 0:
        return
    _store_indexer_fp8(_pages(cache, INDEXER_FP8_BYTES * page_size), indices.to(torch.int64), page_size,
                       input.float())


def _e2m1_code_rne(x: torch.Tensor) -> torch.Tensor:
    """e2m1 code of fp32 x rounded to nearest with ties to the even code (0.25 -> 0, 0.75 -> 1.0, ...)."""
    return e2m1_encode(x, ties="even")


def store_fp4_index_k_cache(input: torch.Tensor, cache: torch.Tensor, loc: torch.Tensor, page_size: int,
                            rne: bool = False) -> None:
    """Replaces `sglang.kernels.ops.kvcache.dsv4_fp4_index_k_cache.store_fp4_index_k_cache` (Triton:
    `quantize_fp4_indexer_tensor` + a paged store), which writes V4.1's ratio-1/2 index keys.

    input [N, 128] -> per row 64 bytes of e2m1 pairs (element 2j in the low nibble) at
    slot * 64 of its page, then 4 UE8M0 exponents (one per 32 values, group g in byte g) at
    page_size * 64 + slot * 4. Scale of a group: the smallest power of two >= max(amax / 6, 1e-4),
    exponent clamped to [1, 254]; codes by threshold rounding (ties down) or, with rne, to nearest
    even. Every row is written.
    """
    page_size = int(page_size)
    if input.shape[-1] != 128:
        raise ValueError(f"store_fp4_index_k_cache: rows must have 128 values, got {tuple(input.shape)}")
    rows = input.reshape(-1, 128)
    if loc.numel() != rows.shape[0]:
        raise ValueError(f"store_fp4_index_k_cache: {loc.numel()} slots for {rows.shape[0]} rows")
    if rows.shape[0] == 0:
        return
    pages = _pages(cache, INDEXER_FP4_BYTES * page_size)
    groups = rows.float().reshape(-1, 4, 32)
    e = _ue8m0(torch.clamp(groups.abs().amax(-1) / 6.0, min=QUANT_EPS)).clamp(1, 254)
    scaled = groups / e8m0_shift_to_float(e).unsqueeze(-1)
    codes = (_e2m1_code_rne if rne else _e2m1_code)(scaled).reshape(-1, 128)
    packed = (codes[:, 0::2] | (codes[:, 1::2] << 4)).to(torch.uint8)
    slot = loc.reshape(-1).to(torch.int64)
    page, off = slot // page_size, slot % page_size
    _put(pages, page, off * 64, packed)
    _put(pages, page, page_size * 64 + off * 4, e.to(torch.uint8))
