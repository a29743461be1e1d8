"""Tests of shims/sgl_kernel/dsv4_xpu.py (SGLang's XPU-route DeepSeek-V4 functions) on CPU.

References: the layout helpers of SGLang's own DeepSeek-V4 kernel tests
(`sglang.test.kernels.deepseek_v4.common`: state slot formulas, FP4 index-K quantizer and store;
`k_cache_reference.dequantize_k_cache_paged_ref`), scalar loops packing the CUDA plan structs with
`struct`, and float64 math from the definitions. Outputs are poisoned; plans are compared byte for byte.
"""

from __future__ import annotations

import struct

import pytest
import sglang.test.kernels.deepseek_v4.common as sgl_common
import torch
from sglang.test.kernels.deepseek_v4.k_cache_reference import dequantize_k_cache_paged_ref

from kernels_triton import dsv4_xpu_ops as XO
from shims.sgl_kernel import dsv4_xpu as X
from tests.ops._helpers import assert_no_nan_close, poisoned

sgl_common.get_device = lambda: "cpu"  # their context builders ask for an accelerator; we are on CPU


# ------------------------------------------------------------------------------------------------
# Plans: byte-exact against scalar loops over the CUDA structs
# ------------------------------------------------------------------------------------------------
def _pc(seq_len: int, ragged: int, buf: int, rp0: int, rp1: int) -> bytes:
    return struct.pack("<IHHii", seq_len, ragged, buf, rp0, rp1)


_PC_INVALID = struct.pack("<IHHii", 0xFFFFFFFF, 0, 0, -1, -1)
_PW_INVALID = struct.pack("<Ii", 0xFFFFFFFF, -1)


def _expected_prefill(pairs, ratio, loc_of, page_of, first_write, extra_write, num_q, pad, legacy):
    """Scalar planner: loops over requests and tokens exactly as the definition reads."""
    window = 8 if ratio == 4 else ratio
    cs, ws, counter = [], [], 0
    for b, (s, e) in enumerate(pairs):
        p0 = s - e
        for j in range(e):
            pos, rag = p0 + j, counter + j
            if (pos + 1) % ratio == 0:
                buf = window - min(j + 1, window)
                if buf > 0 or legacy:
                    cs.append(_pc(pos + 1, rag, buf, page_of(b, max(pos - ratio, 0)), page_of(b, pos)))
                else:
                    cs.append(_pc(pos + 1, rag, buf, -1, b))
            if pos >= first_write(s) or extra_write(pos):
                ws.append(struct.pack("<Ii", rag, loc_of(b, pos)))
        counter += e
    if pad:
        cs += [_PC_INVALID] * (num_q - len(cs))
        ws += [_PW_INVALID] * (num_q - len(ws))
    return b"".join(cs), b"".join(ws)


PAIRS = [(37, 37), (70, 9), (9, 1), (300, 129), (256, 256)]


@pytest.mark.parametrize("ratio", [4, 128])
@pytest.mark.parametrize("pad", [False, True])
def test_plan_compress_prefill_bytes(ratio: int, pad: bool) -> None:
    # ratio 4 with a 16-slot ring also exercises the speculative write pad (ring - window + 2).
    ring_size = (16 if pad else 8) if ratio == 4 else 128
    ctx = sgl_common.make_paged_context(len(PAIRS), ratio, head_dim=64, swa_page_size=128, ring_size=ring_size,
                                        num_swa_pages_per_req=4, max_tokens_per_req=512)
    # Permute requests and SWA slots so the lookups are not identities.
    ctx.req_pool_indices = torch.tensor([3, 0, 4, 1, 2])
    ctx.full_to_swa = torch.randperm(ctx.full_to_swa.numel())
    ring, sps = ctx.ring_size, ctx.swa_page_size
    seq, ext, num_q = sgl_common.to_seq_extend(PAIRS)
    plan_c, plan_w = X.plan_compress_prefill(ctx.req_pool_indices, ctx.req_to_token, ctx.full_to_swa, seq, ext,
                                             torch.empty(0, dtype=torch.uint8), num_q, ratio, sps, ring, pad)
    assert plan_c.dtype == plan_w.dtype == torch.uint8 and plan_c.shape[1] == 16 and plan_w.shape[1] == 8

    def rid(b: int) -> int:
        return int(ctx.req_pool_indices[b])

    if ratio == 4:
        def loc_of(b, p):
            return ctx.state_loc(b, p)
        def extra(p):
            return (p % sps >= sps - 4)
    else:
        def loc_of(b, p):
            return rid(b) * ring + p % ring
        def extra(p):
            return (False)
    window = 8 if ratio == 4 else ratio
    mtp_pad = ring - window + 2 if ring > window else 0

    def first_write(s):
        return min(s // ratio * ratio - (ratio if ratio == 4 else 0), s - mtp_pad)

    exp_c, exp_w = _expected_prefill(PAIRS, ratio, loc_of, lambda b, p: loc_of(b, p) // ratio, first_write, extra,
                                     num_q, pad, legacy=False)
    assert bytes(plan_c.flatten().tolist()) == exp_c
    assert bytes(plan_w.flatten().tolist()) == exp_w


@pytest.mark.parametrize("ratio", [4, 128])
def test_plan_compress_prefill_legacy_bytes(ratio: int) -> None:
    ctx = sgl_common.make_legacy_context(len(PAIRS), ratio, head_dim=64)
    ctx.req_pool_indices = torch.tensor([2, 4, 0, 3, 1])
    seq, ext, num_q = sgl_common.to_seq_extend(PAIRS)
    for pad in (False, True):
        plan_c, plan_w = X.plan_compress_prefill_legacy(ctx.req_pool_indices, seq, ext, torch.empty(0), num_q,
                                                        ratio, pad)
        exp_c, exp_w = _expected_prefill(
            PAIRS, ratio, ctx.state_loc, lambda b, p: ctx.state_loc(b, p) // ratio,
            lambda s: s // ratio * ratio - (ratio if ratio == 4 else 0), lambda p: False, num_q, pad, legacy=True)
        assert bytes(plan_c.flatten().tolist()) == exp_c
        assert bytes(plan_w.flatten().tolist()) == exp_w


@pytest.mark.parametrize("ratio", [4, 128])
def test_plan_compress_decode_bytes(ratio: int) -> None:
    seqs = [1, 4, 5, 8, 127, 128, 129, 300]
    ctx = sgl_common.make_paged_context(len(seqs), ratio, head_dim=64, swa_page_size=128,
                                        num_swa_pages_per_req=4, max_tokens_per_req=512)
    ctx.req_pool_indices = torch.randperm(len(seqs))
    ctx.full_to_swa = torch.randperm(ctx.full_to_swa.numel())
    sl = torch.tensor(seqs)
    plan = X.plan_compress_decode(ctx.req_pool_indices, ctx.req_to_token, ctx.full_to_swa, sl, ratio,
                                  ctx.swa_page_size, ctx.ring_size)
    exp = b""
    for b, s in enumerate(seqs):
        p1, p0 = s - 1, max(s - 1 - ratio, 0)
        if ratio == 4:
            w, r0 = ctx.state_loc(b, p1), ctx.state_loc(b, p0)
        else:
            rid = int(ctx.req_pool_indices[b])
            w, r0 = rid * ctx.ring_size + p1 % ctx.ring_size, rid * ctx.ring_size + p0 % ctx.ring_size
        exp += struct.pack("<Iiii", s, w, r0 // ratio, w // ratio)
    assert bytes(plan.flatten().tolist()) == exp

    legacy = sgl_common.make_legacy_context(len(seqs), ratio)
    plan_l = X.plan_compress_decode_legacy(legacy.req_pool_indices, sl, ratio)
    exp_l = b"".join(struct.pack("<Iiii", s, legacy.state_loc(b, s - 1),
                                 legacy.state_loc(b, max(s - 1 - ratio, 0)) // ratio,
                                 legacy.state_loc(b, s - 1) // ratio) for b, s in enumerate(seqs))
    assert bytes(plan_l.flatten().tolist()) == exp_l


# ------------------------------------------------------------------------------------------------
# Compression: plans + state + flash_compress over a prefill then decode, vs float64 pooling
# ------------------------------------------------------------------------------------------------
def _pool64(tokens: torch.Tensor, ape: torch.Tensor, ratio: int, hd: int, n: int) -> torch.Tensor:
    """Compressed entry n (tokens [ratio*n, ratio*n + ratio)) from the whole history, float64."""
    t = tokens.double()
    a = ape.double()
    if ratio == 4:
        cur = t[4 * n: 4 * n + 4]
        kv, sc = [cur[:, hd:2 * hd]], [cur[:, 3 * hd:]]
        if n > 0:
            prev = t[4 * n - 4: 4 * n]
            kv.insert(0, prev[:, :hd])
            sc.insert(0, prev[:, 2 * hd:3 * hd])
            bias = a
        else:
            bias = a[4:]
        kv, sc = torch.cat(kv), torch.cat(sc)
    else:
        win = t[128 * n: 128 * n + 128]
        kv, sc, bias = win[:, :hd], win[:, hd:], a
    w = torch.softmax(sc + bias, dim=0)
    return (w * kv).sum(0)


@pytest.mark.parametrize("ratio,hd,prefill,decode", [(4, 128, [(11, 11), (19, 8)], 9),
                                                     (128, 64, [(130, 130), (300, 170)], 90)])
def test_compress_prefill_then_decode(ratio: int, hd: int, prefill, decode: int) -> None:
    bs = 2
    ctx = sgl_common.make_paged_context(bs, ratio, head_dim=hd, swa_page_size=128, num_swa_pages_per_req=4,
                                        max_tokens_per_req=512)
    coff = 4 if ratio == 4 else 2
    total = prefill[-1][0] + decode
    tokens = [torch.randn(total, coff * hd) for _ in range(bs)]
    ape = torch.randn(8 if ratio == 4 else 128, hd)
    pool = torch.randn(ctx.num_pages, ratio, coff * hd)  # stale state: must never be read unwritten
    prefill_fn = X.flash_compress4_prefill if ratio == 4 else X.flash_compress128_prefill
    decode_fn = X.flash_compress4_decode if ratio == 4 else X.flash_compress128_decode
    for s, e in prefill:
        seq, ext, num_q = sgl_common.to_seq_extend([(s, e)] * bs)
        plan_c, plan_w = X.plan_compress_prefill(ctx.req_pool_indices, ctx.req_to_token, ctx.full_to_swa, seq, ext,
                                                 torch.empty(0), num_q, ratio, ctx.swa_page_size, ctx.ring_size)
        inp = torch.cat([t[s - e:s] for t in tokens])
        out = poisoned(plan_c.shape[0], hd)
        prefill_fn(pool, inp, out, ape, plan_c, plan_w)
        ends = [p for b_ in range(bs) for p in range(s - e, s) if (p + 1) % ratio == 0]
        reqs = [b_ for b_ in range(bs) for p in range(s - e, s) if (p + 1) % ratio == 0]
        assert out.shape[0] == len(ends)
        exp = torch.stack([_pool64(tokens[b_], ape, ratio, hd, p // ratio) for b_, p in zip(reqs, ends, strict=True)])
        assert_no_nan_close(out, exp, rtol=1e-5, atol=1e-5)
    for step in range(decode):
        s = prefill[-1][0] + step + 1
        sl = torch.full((bs,), s)
        plan_d = X.plan_compress_decode(ctx.req_pool_indices, ctx.req_to_token, ctx.full_to_swa, sl, ratio,
                                        ctx.swa_page_size, ctx.ring_size)
        out = poisoned(bs, hd)
        decode_fn(pool, torch.stack([t[s - 1] for t in tokens]), out, ape, plan_d)
        if s % ratio == 0:
            exp = torch.stack([_pool64(t, ape, ratio, hd, s // ratio - 1) for t in tokens])
            assert_no_nan_close(out, exp, rtol=1e-5, atol=1e-5)
        else:
            assert torch.isnan(out).all(), "decode wrote an output row without a compression"


def test_compress4_legacy_bf16_input_fp32_state() -> None:
    """Mixed dtypes: bf16 input rounded state, legacy rings, output dtype of kv_output."""
    hd, bs = 128, 3
    ctx = sgl_common.make_legacy_context(bs, 4, head_dim=hd)
    tokens = [torch.randn(13, 4 * hd).to(torch.bfloat16) for _ in range(bs)]
    ape = torch.randn(8, hd).to(torch.bfloat16)
    pool = torch.randn(ctx.num_pages, 4, 4 * hd)
    seq, ext, num_q = sgl_common.to_seq_extend([(10, 10)] * bs)
    plan_c, plan_w = X.plan_compress_prefill_legacy(ctx.req_pool_indices, seq, ext, torch.empty(0), num_q, 4)
    out = poisoned(plan_c.shape[0], hd, dtype=torch.float32)
    X.flash_compress4_prefill(pool, torch.cat([t[:10] for t in tokens]), out, ape, plan_c, plan_w)
    exp = torch.stack([_pool64(t, ape, 4, hd, n) for t in tokens for n in (0, 1)])
    assert_no_nan_close(out, exp, rtol=1e-5, atol=1e-5)
    for s in (11, 12):
        plan_d = X.plan_compress_decode_legacy(ctx.req_pool_indices, torch.full((bs,), s), 4)
        out = poisoned(bs, hd, dtype=torch.bfloat16)
        X.flash_compress4_decode(pool, torch.stack([t[s - 1] for t in tokens]), out, ape, plan_d)
    exp = torch.stack([_pool64(t, ape, 4, hd, 2) for t in tokens])
    assert_no_nan_close(out, exp, rtol=1e-2, atol=1e-2)


# ------------------------------------------------------------------------------------------------
# Norm + RoPE + store
# ------------------------------------------------------------------------------------------------
def _freqs(max_pos: int) -> torch.Tensor:
    """[max_pos, 64] fp32 (cos, sin) pairs, as view_as_real(freqs_cis).flatten(-2)."""
    inv = 1.0 / (10000 ** (torch.arange(32, dtype=torch.float64) / 32))
    ang = torch.arange(max_pos, dtype=torch.float64)[:, None] * inv[None, :]
    return torch.view_as_real(torch.polar(torch.ones_like(ang), ang)).flatten(-2).float()


def _norm_rope64(x: torch.Tensor, w: torch.Tensor | None, eps: float, freqs: torch.Tensor,
                 pos: torch.Tensor) -> torch.Tensor:
    """float64 RMSNorm(x) * w, then interleaved RoPE of the last 64 dims at `pos`."""
    x = x.double()
    y = x * torch.rsqrt(x.square().mean(-1, keepdim=True) + eps)
    if w is not None:
        y = y * w.double()
    f = freqs[pos].double()
    while f.dim() < y.dim():
        f = f.unsqueeze(-2)
    r = torch.view_as_complex(y[..., -64:].contiguous().view(*y.shape[:-1], 32, 2))
    c = torch.view_as_complex(f.contiguous().view(*f.shape[:-1], 32, 2))
    y = y.clone()
    y[..., -64:] = torch.view_as_real(r * c).flatten(-2)
    return y


def _hadamard64(n: int = 128) -> torch.Tensor:
    h = torch.ones(1, 1, dtype=torch.float64)
    while h.shape[0] < n:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return h / n ** 0.5


def _fp8_close(deq: torch.Tensor, ref: torch.Tensor, tile_scale: torch.Tensor) -> None:
    """Dequantized FP8 within one e4m3 rounding (rel 2^-4) plus the subnormal step of its scale."""
    assert not torch.isnan(deq).any()
    err = (deq.double() - ref.double()).abs()
    bound = ref.double().abs() * 2.0 ** -4 * 1.01 + tile_scale.double() * 2.0 ** -9
    assert bool((err <= bound).all()), f"max excess {(err - bound).max().item()}"


def _assert_untouched(cache: torch.Tensor, before: torch.Tensor, written: torch.Tensor) -> None:
    assert torch.equal(cache[~written], before[~written]), "bytes outside the stored rows changed"


def _v4_written_mask(cache: torch.Tensor, loc: torch.Tensor, page_size: int) -> torch.Tensor:
    m = torch.zeros_like(cache, dtype=torch.bool)
    for lc in loc.tolist():
        p, s = divmod(lc, page_size)
        m[p, s * 576:(s + 1) * 576] = True
        m[p, page_size * 576 + s * 8: page_size * 576 + s * 8 + 7] = True
    return m


def _check_v4_rows(cache, loc, page_size, ref):
    deq = dequantize_k_cache_paged_ref(cache, loc.to(torch.int32), page_size).float().reshape(-1, 512)
    scale = ref[:, :448].float().abs().reshape(-1, 7, 64).amax(-1).clamp_min(1e-4) / 448
    tile_scale = torch.exp2(torch.ceil(torch.log2(scale))).repeat_interleave(64, dim=1)
    _fp8_close(deq[:, :448], ref[:, :448], tile_scale)
    assert_no_nan_close(deq[:, 448:], ref[:, 448:].float(), rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("is_decode", [True, False])
def test_compress_norm_rope_store_v4(is_decode: bool) -> None:
    page_size, ratio, n_pages = 64, 4, 3
    pb = XO._v4_page_bytes(page_size)
    freqs = _freqs(512)
    w = torch.randn(512) * 0.5 + 1
    kv = torch.randn(6, 512)
    if is_decode:
        seqs = torch.tensor([8, 9, 12, 100, 4, 7])
        plan = XO._pack_words(torch.stack([seqs, seqs * 0, seqs * 0, seqs * 0], 1), torch.device("cpu"))
        rows = torch.tensor([0, 2, 3, 4])
        out_loc = torch.randperm(n_pages * page_size)[:6]
        loc = out_loc[rows]
    else:
        seqs = torch.tensor([8, 12, 100, 4, 40, 16])
        ragged = torch.tensor([0, 5, 2, 9, 7, 1])
        words = XO._plan_c_words(seqs, ragged, ragged * 0, ragged * 0 - 1, ragged * 0)
        words[4] = torch.tensor([-1, 0, -1, -1])  # an invalid (padding) plan
        plan = XO._pack_words(words, torch.device("cpu"))
        rows = torch.tensor([0, 1, 2, 3, 5])
        out_loc = torch.randperm(n_pages * page_size)[:10]
        loc = out_loc[ragged[rows]]
    cache = torch.randint(0, 256, (n_pages, pb), dtype=torch.uint8)
    before = cache.clone()
    X.compress_norm_rope_store(kv, plan, w, 1e-6, freqs, out_loc, cache, is_decode, ratio, page_size)
    ref = _norm_rope64(kv[rows], w, 1e-6, freqs, seqs[rows] - ratio)
    _check_v4_rows(cache, loc, page_size, ref)
    _assert_untouched(cache, before, _v4_written_mask(cache, loc, page_size))


def test_fused_k_norm_rope_flashmla() -> None:
    page_size = 64
    kv_full = torch.randn(5, 300 + 512).to(torch.bfloat16)
    kv = kv_full[:, 300:]  # strided rows, as the caller's qkv_a slice
    w = (torch.randn(512) * 0.5 + 1).to(torch.bfloat16)
    pos = torch.tensor([0, 7, 300, 5, 63])
    out_loc = torch.tensor([3, -1, 130, 64, 1], dtype=torch.int32)
    freqs = _freqs(512)
    cache = torch.randint(0, 256, (3, XO._v4_page_bytes(page_size)), dtype=torch.uint8)
    before = cache.clone()
    X.fused_k_norm_rope_flashmla(kv, w, freqs, pos, out_loc, cache, 1e-6, page_size)
    keep = out_loc >= 0
    loc = out_loc[keep].long()
    ref = _norm_rope64(kv[keep], w, 1e-6, freqs, pos[keep])
    _check_v4_rows(cache, loc, page_size, ref)
    _assert_untouched(cache, before, _v4_written_mask(cache, loc, page_size))


def test_compress_norm_rope_store_indexer_fp8() -> None:
    page_size, ratio = 32, 128
    kv = torch.randn(4, 128)
    w = torch.randn(128) * 0.5 + 1
    seqs = torch.tensor([128, 256, 130, 384])
    plan = XO._pack_words(torch.stack([seqs, seqs * 0, seqs * 0, seqs * 0], 1), torch.device("cpu"))
    out_loc = torch.tensor([5, 40, 7, 63])
    freqs = _freqs(512)
    cache = torch.randint(0, 256, (2, 132 * page_size), dtype=torch.uint8)
    X.compress_norm_rope_store(kv, plan, w, 1e-6, freqs, out_loc, cache, True, ratio, page_size)
    rows = torch.tensor([0, 1, 3])
    ref = _norm_rope64(kv[rows], w, 1e-6, freqs, seqs[rows] - ratio) @ _hadamard64().t()
    for r, lc in zip(range(3), out_loc[rows].tolist(), strict=True):
        p, s = divmod(lc, page_size)
        vals = cache[p, s * 128:(s + 1) * 128].view(torch.float8_e4m3fn).float()
        scale = cache[p, 128 * page_size + 4 * s: 128 * page_size + 4 * s + 4].view(torch.float32)
        exp_scale = ref[r].abs().max() / 448
        assert abs(scale.item() - exp_scale.item()) <= 1e-5 * exp_scale.item()
        _fp8_close(vals * scale, ref[r], scale.expand(128))


def test_compress_norm_rope_store_indexer_fp4_matches_sglang_reference() -> None:
    page_size, ratio = 64, 4  # SGLang's FP4 store reference is written for 64-slot pages
    kv = torch.randn(5, 128)
    w = torch.randn(128) * 0.5 + 1
    seqs = torch.tensor([4, 8, 12, 16, 20])
    ragged = torch.tensor([0, 1, 2, 3, 4])
    plan = XO._pack_words(XO._plan_c_words(seqs, ragged, ragged * 0, ragged * 0 - 1, ragged * 0), torch.device("cpu"))
    out_loc = torch.tensor([3, 64, 100, 0, 127])
    freqs = _freqs(64)
    cache = torch.zeros(2, 68 * page_size, dtype=torch.uint8)
    X.compress_norm_rope_store(kv, plan, w, 1e-6, freqs, out_loc, cache, False, ratio, page_size, True)
    ref = (_norm_rope64(kv, w, 1e-6, freqs, seqs - ratio) @ _hadamard64().t()).float()
    packed, sf = sgl_common.quantize_fp4_indexer_ref(ref)
    expected = sgl_common.store_fp4_index_cache_ref(packed, sf, out_loc, 2)
    # float64 vs fp32 rotation may flip a code that sits exactly on a rounding midpoint: allow a handful
    mismatch = (cache != expected).sum().item()
    assert mismatch <= 4, f"{mismatch} bytes differ from SGLang's FP4 index-K reference"


def test_fused_q_norm_rope() -> None:
    q = torch.randn(3, 4, 512).to(torch.bfloat16)
    out = poisoned(3, 4, 512, dtype=torch.bfloat16)
    pos = torch.tensor([0, 17, 400], dtype=torch.int32)
    freqs = _freqs(512)
    X.fused_q_norm_rope(q, out, freqs, pos, 1e-6)
    ref = _norm_rope64(q, None, 1e-6, freqs, pos.long())
    assert_no_nan_close(out, ref, rtol=2e-2, atol=2e-2)


def test_fused_q_indexer_rope_hadamard_quant() -> None:
    b, h = 3, 4
    q = torch.randn(b, h, 128).to(torch.bfloat16)
    weight = torch.randn(b, h).to(torch.bfloat16)
    q_fp8 = torch.full((b, h, 128), float("nan")).to(torch.float8_e4m3fn)
    w_out = poisoned(b, h, 1)
    pos = torch.tensor([1, 50, 300])
    freqs = _freqs(512)
    X.fused_q_indexer_rope_hadamard_quant(q, q_fp8, weight, w_out, 0.125, freqs, pos)
    x = q.double()
    f = torch.view_as_complex(freqs[pos].double().view(b, 1, 32, 2))
    r = torch.view_as_real(torch.view_as_complex(x[..., 64:].contiguous().view(b, h, 32, 2)) * f).flatten(-2)
    ref = torch.cat([x[..., :64], r], -1) @ _hadamard64().t()
    scale = ref.abs().amax(-1) / 448
    assert_no_nan_close(w_out.squeeze(-1), weight.double() * 0.125 * scale, rtol=1e-5, atol=1e-7)
    deq = q_fp8.float() * scale.unsqueeze(-1).float()
    _fp8_close(deq, ref, scale.unsqueeze(-1).expand(b, h, 128))


# ------------------------------------------------------------------------------------------------
# Top-k transforms through torch.ops.sgl_kernel
# ------------------------------------------------------------------------------------------------
def test_topk_transform_paged() -> None:
    b, width, k, page = 4, 300, 16, 8
    scores = torch.randn(b, width)
    seq = torch.tensor([0, 10, 16, 300], dtype=torch.int32)
    table = torch.randint(0, 1000, (b, 40), dtype=torch.int32)
    out = poisoned(b, k, dtype=torch.int32)
    raw = poisoned(b, k, dtype=torch.int32)
    torch.ops.sgl_kernel.topk_transform(scores, seq, table, out, page, raw)
    for i in range(b):
        s = int(seq[i])
        exp_raw = list(range(min(s, k))) if s <= k else sorted(scores[i, :s].topk(k).indices.tolist())
        got = raw[i].tolist()
        got_sel = sorted(x for x in got if x >= 0) if s > k else got[:s]
        assert got_sel == exp_raw and got.count(-1) == k - len(exp_raw)
        for r, o in zip(got, out[i].tolist(), strict=True):
            assert o == (-1 if r < 0 else int(table[i, r // page]) * page + r % page)
    out2 = poisoned(b, k, dtype=torch.int32)
    torch.ops.sgl_kernel.topk_transform(scores, seq, table, out2, page)
    assert torch.equal(out2, out)


def test_topk_transform_ragged() -> None:
    n, width, k = 5, 200, 8
    scores = torch.randn(n, width)
    saved = scores.clone()
    seq = torch.tensor([3, 8, 9, 100, 0], dtype=torch.int32)
    starts = torch.tensor([0, 5, 17, 99, 3], dtype=torch.int32)
    offsets = torch.tensor([1000, 0, -17, 7, 5], dtype=torch.int32)
    out = poisoned(n, k, dtype=torch.int32)
    torch.ops.sgl_kernel.topk_transform_ragged(scores, seq, out, offsets, starts)
    for i in range(n):
        s, st, off = int(seq[i]), int(starts[i]), int(offsets[i])
        if s <= k:
            exp = [p + off for p in range(s)] + [-1] * (k - s)
            assert out[i].tolist() == exp
        else:
            exp = sorted((scores[i, st:st + s].topk(k).indices + off).tolist())
            assert sorted(out[i].tolist()) == exp
    assert torch.equal(scores, saved)
    out0 = poisoned(n, k, dtype=torch.int32)
    torch.ops.sgl_kernel.topk_transform_ragged(scores, seq, out0, starts)  # row_starts omitted -> 0
    assert sorted(out0[3].tolist()) == sorted((scores[3, :100].topk(k).indices + starts[3]).tolist())


# ------------------------------------------------------------------------------------------------
# mHC adapters
# ------------------------------------------------------------------------------------------------
def test_fused_hc_head() -> None:
    t, hc, h = 3, 4, 64
    x = torch.randn(t, hc, h).to(torch.bfloat16)
    fn = torch.randn(hc, hc * h) * 0.05
    scale, base = torch.rand(1) + 0.5, torch.randn(hc) * 0.1
    y = X.fused_hc_head(x, fn, scale, base, 1e-6, 1e-6)
    xf = x.double().reshape(t, -1)
    mixes = (xf @ fn.double().t()) * torch.rsqrt(xf.square().mean(-1, keepdim=True) + 1e-6)
    pre = torch.sigmoid(mixes * scale.double() + base.double()) + 1e-6
    assert y.dtype == torch.bfloat16
    assert_no_nan_close(y, (pre.unsqueeze(-1) * x.double()).sum(1), rtol=1e-2, atol=1e-2)


def test_mhc_fused_post_pre_is_post_then_pre() -> None:
    t, hc, h = 3, 4, 64
    x = torch.randn(t, h).to(torch.bfloat16)
    residual = torch.randn(t, hc, h).to(torch.bfloat16)
    post = torch.rand(t, hc) * 2
    comb = torch.rand(t, hc, hc)
    fn = torch.randn((2 + hc) * hc, hc * h) * 0.05
    scale, base = torch.rand(3) + 0.5, torch.randn((2 + hc) * hc) * 0.1
    nw = torch.rand(h) + 0.5
    res, post2, comb2, y = X.mhc_fused_post_pre(x, residual, post.unsqueeze(-1), comb, fn, scale, base, 1e-6, 1e-6,
                                                1e-6, 2.0, 5, norm_weight=nw, norm_eps=1e-6)
    exp_res = post.double().unsqueeze(-1) * x.double().unsqueeze(1) + torch.einsum(
        "tij,tih->tjh", comb.double(), residual.double())
    assert res.dtype == torch.bfloat16 and post2.shape == (t, hc, 1) and comb2.shape == (t, hc, hc)
    assert_no_nan_close(res, exp_res, rtol=1e-2, atol=1e-2)
    p3, c3, y3 = X.mhc_pre(res, fn, scale, base, 1e-6, 1e-6, 1e-6, 2.0, 5, norm_weight=nw, norm_eps=1e-6)
    assert p3.shape == (t, hc)  # the XPU branch of hc_pre uses post without squeezing
    assert torch.equal(p3, post2.squeeze(-1)) and torch.equal(c3, comb2) and torch.equal(y3, y)
    out = X.hc_post(x, residual, post, comb)
    assert torch.equal(out, res)
    pre, post4, comb4 = X.hc_split_sinkhorn(torch.randn(t, 1, (2 + hc) * hc), scale, base, hc, 5, 1e-6)
    assert pre.shape == (t, 1, hc) and comb4.shape == (t, 1, hc, hc)
    assert_no_nan_close(comb4.sum(-2), torch.ones(t, 1, hc), rtol=1e-3, atol=1e-3)
