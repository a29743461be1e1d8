"""Sparse MLA decode (FlashMLA `flash_mla_with_kvcache`, V4 FP8 cache) and prefill (`flash_mla_sparse_fwd`).

The reference is float64 attention written from FlashMLA's documented definition (this file), fed
with K rows read back by SGLang's own V4 cache reader (`dequantize_k_cache_paged_ref`, imported).

Tolerance (out, bf16): kernel and reference read the same FP8 bytes, and e4m3 x 2**k is exact in
bf16/fp32, so the FP8 quantization error is common to both and not part of the tolerance. What
differs: the probabilities are rounded to bf16 before the PV product (relative 2**-9 each, so at
most 2**-9 * max|V| summed over a row whose weights add to 1) and the output is rounded to bf16
(2**-9 relative); fp32 accumulation adds ~1e-6. Hence |out - ref| <= 2**-9 * max|V| + 2**-9 *
|ref| + 1e-5, checked as atol = 1.5 * 2**-9 * max|V| (max over the attended rows), rtol = 2**-8.
lse is fp32 arithmetic on fp32 scores: atol 1e-4.
test_decode_vs_unquantized_k bounds the FP8 error itself separately.
"""

from __future__ import annotations

import math

import pytest
import torch

from kernels_triton import dsv4_kv_layout as kvl
from kernels_triton import sparse_mla as sm
from tests.ops._helpers import PATHS

try:  # SGLang's shipped reader; the GPU machine may not have sglang installed
    from sglang.test.kernels.deepseek_v4 import k_cache_reference as sgl_ref
except ImportError:  # pragma: no cover - then our reader, itself tested against SGLang's on CPU
    sgl_ref = None
needs_sglang = pytest.mark.skipif(sgl_ref is None, reason="sglang not installed")


def _read_rows(buf: torch.Tensor, ids: torch.Tensor, page_size: int) -> torch.Tensor:
    if sgl_ref is not None:
        return sgl_ref.dequantize_k_cache_paged_ref(buf, ids, page_size)[:, 0]
    return kvl.gather_k_v4_reference(buf, ids, page_size, torch.bfloat16)


def _make_cache(pages: int, page_size: int, device: str = "cpu", poison: float = 0.3) -> torch.Tensor:
    """A V4 pool buffer with random K; a fraction of the tokens poisoned with FP8 NaN bytes."""
    buf = kvl.alloc_k_cache(pages, page_size, device)
    n = pages * page_size
    k = (torch.randn(n, 512, device=device) * 2).bfloat16()
    kvl.store_k_v4_reference(k, buf, torch.arange(n, device=device), page_size)
    bad = torch.nonzero(torch.rand(n, device=device) < poison).flatten()
    if bad.numel():
        off = (bad // page_size) * buf.shape[1] + (bad % page_size) * kvl.DATA_BYTES
        buf.view(-1)[off[:, None] + torch.arange(448, device=device)[None, :]] = 0x7F  # e4m3 NaN
    buf.poisoned = bad  # type: ignore[attr-defined]
    return buf


def _good_ids(buf: torch.Tensor, shape: tuple[int, ...], n_tokens: int) -> torch.Tensor:
    ok = torch.ones(n_tokens, dtype=torch.bool, device=buf.device)
    ok[buf.poisoned] = False  # type: ignore[attr-defined]
    good = torch.nonzero(ok).flatten()
    return good[torch.randint(0, good.numel(), shape, device=buf.device)].int()


def _f64_attend(q: torch.Tensor, kv: torch.Tensor, valid: torch.Tensor, scale: float,
                sink: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """FlashMLA's definition in float64: q [T,H,D], kv [T,K,D], valid [T,K] -> out, lse, max."""
    s = torch.einsum("thd,tkd->thk", q.double(), kv.double()) * scale
    s = s.masked_fill(~valid[:, None, :], -math.inf)
    lse = torch.logsumexp(s, -1)
    mx = s.amax(-1)
    p = torch.exp(s - lse[..., None]).nan_to_num(0.0)
    out = p @ kv.double() if kv.shape[1] else torch.zeros_like(q.double())
    if sink is not None:
        out = out / (1 + torch.exp(sink.double()[None, :] - lse))[..., None]
    lonely = lse == -math.inf
    out[lonely] = 0.0
    lse = lse.masked_fill(lonely, math.inf)
    return out, lse, mx


def _decode_f64(q, caches, scale, sink):  # noqa: ANN001, ANN202
    """caches: list of (pool buffer, page_size, indices [b,s_q,k], lengths [b] or None)."""
    b, s_q, h, d = q.shape
    kvs, valids = [], []
    for buf, ps, idx, lens in caches:
        flat = idx.reshape(b * s_q, -1).long()
        valid = flat >= 0
        if lens is not None:
            valid &= torch.arange(flat.shape[1], device=q.device)[None, :] < lens.long().repeat_interleave(s_q)[:, None]
        rows = _read_rows(buf, flat.clamp_min(0).reshape(-1), ps)
        rows = rows.double().reshape(b * s_q, -1, d).masked_fill(~valid[..., None], 0.0)  # masked NaN rows
        kvs.append(rows)
        valids.append(valid)
    kv = torch.cat(kvs, 1)
    out, lse, _ = _f64_attend(q.reshape(b * s_q, h, d), kv, torch.cat(valids, 1), scale, sink)
    return out.reshape(b, s_q, h, d), lse.reshape(b, s_q, h).transpose(1, 2), float(kv.abs().max())


def _check(out: torch.Tensor, lse: torch.Tensor, ref_out: torch.Tensor, ref_lse: torch.Tensor,
           vmax: float) -> None:
    assert not out.isnan().any() and not lse.isnan().any(), "NaN in output"
    torch.testing.assert_close(out.double(), ref_out, rtol=2.0 ** -8, atol=1.5 * 2.0 ** -9 * vmax + 1e-5)
    assert torch.equal(lse.isinf(), ref_lse.isinf())
    fin = ref_lse.isfinite()
    torch.testing.assert_close(lse.double()[fin], ref_lse[fin], rtol=0, atol=1e-4)


def _decode(path: str, *args, **kwargs):  # noqa: ANN002, ANN003, ANN202
    fn = sm.sparse_mla_decode_reference if path == "torch" else sm.sparse_mla_decode_triton
    return fn(*args, **kwargs)


DECODE_CASES = {
    # name: (b, s_q, h, topk, extra_topk, lengths, extra lengths, sink)
    "full": (2, 2, 20, 72, 40, True, True, "rand"),
    "no_sink_no_extra": (3, 1, 16, 64, 0, False, False, None),
    "lonely_rows": (2, 1, 8, 32, 16, "zero", "zero", "rand"),
    "inf_sink": (1, 1, 4, 40, 24, True, False, "inf"),
    "window_only_extra_empty": (2, 1, 12, 128, 64, True, "zero", "rand"),
}


def _decode_case(case: str) -> tuple[tuple, tuple]:
    """Inputs of one DECODE_CASES entry (positional arguments of the decode functions) and the float64
    reference (out, lse, max |kv|)."""
    b, s_q, h, topk, ex_topk, lens_kind, ex_lens_kind, sink_kind = DECODE_CASES[case]
    ps, pages, ex_ps, ex_pages = 64, 3, 16, 5
    main = _make_cache(pages, ps)
    q = torch.randn(b, s_q, h, 512).bfloat16()
    idx = _good_ids(main, (b, s_q, topk), pages * ps)
    idx[..., 3] = -1
    lens = None
    if lens_kind:
        lens = torch.randint(topk // 2, topk + 1, (b,)).int() if lens_kind is True else torch.zeros(b).int()
        if lens_kind is True:
            lens[0] = topk // 2 + 1  # a window boundary inside a 32-token block
        for bi in range(b):  # slots past the length point at poisoned rows: must be ignored
            if main.poisoned.numel():  # type: ignore[attr-defined]
                idx[bi, :, int(lens[bi]):] = int(main.poisoned[0])  # type: ignore[attr-defined]
    caches = [(main, ps, idx, lens)]
    extra = ex_idx = ex_lens = None
    if ex_topk:
        extra = _make_cache(ex_pages, ex_ps)
        ex_idx = _good_ids(extra, (b, s_q, ex_topk), ex_pages * ex_ps)
        ex_idx[0, 0, -1] = -1
        if ex_lens_kind:
            ex_lens = (torch.randint(1, ex_topk + 1, (b,)) if ex_lens_kind is True else torch.zeros(b)).int()
        caches.append((extra, ex_ps, ex_idx, ex_lens))
    # sinks near the rows' lse (about log(#tokens)), so the sink weight is far from 0 and 1
    sink = {"rand": torch.randn(h) + 4, "inf": torch.full((h,), math.inf), None: None}[sink_kind]
    scale = 512 ** -0.5
    args = (q, kvl.paged_view(main, ps), idx, lens, sink, None if extra is None else kvl.paged_view(extra, ex_ps),
            ex_idx, ex_lens, scale, 512)
    return args, _decode_f64(q, caches, scale, sink)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("case", list(DECODE_CASES))
def test_decode_matches_f64(path: str, case: str) -> None:
    args, (ref_out, ref_lse, vmax) = _decode_case(case)
    b, s_q, h = args[0].shape[:3]
    out, lse = _decode(path, *args)
    assert out.shape == (b, s_q, h, 512) and out.dtype == torch.bfloat16
    assert lse.shape == (b, h, s_q) and lse.dtype == torch.float32
    _check(out, lse, ref_out, ref_lse, vmax)
    if case == "lonely_rows":
        assert (out == 0).all() and torch.isposinf(lse).all()
    if case == "inf_sink":
        assert (out == 0).all() and lse.isfinite().all()


@pytest.mark.parametrize("num_splits", [2, 3, 8])
@pytest.mark.parametrize("case", ["full", "lonely_rows", "window_only_extra_empty"])
def test_decode_splits_match_f64(case: str, num_splits: int) -> None:
    """The split path (partials merged by the combine kernel) against float64 with the same bounds as
    the single pass: a split count that is not a power of two, splits that see no token (short or
    zero lengths) and the sink applied after the merge. The default split count is 1 at these CPU
    sizes, so only this test runs the combine kernel with the tight bound."""
    args, (ref_out, ref_lse, vmax) = _decode_case(case)
    out, lse = sm.sparse_mla_decode_triton(*args, num_splits=num_splits, block_n=16)
    _check(out, lse, ref_out, ref_lse, vmax)


def test_decode_splits_agree() -> None:
    """The split-KV path (partials + combine) equals the single-pass kernel."""
    main = _make_cache(2, 64, poison=0.0)
    q = torch.randn(1, 1, 16, 512).bfloat16()
    idx = torch.randint(0, 128, (1, 1, 128)).int()
    sink = torch.randn(16)
    one = sm.sparse_mla_decode_triton(q, kvl.paged_view(main, 64), idx, None, sink, num_splits=1)
    four = sm.sparse_mla_decode_triton(q, kvl.paged_view(main, 64), idx, None, sink, num_splits=4)
    torch.testing.assert_close(one[0].float(), four[0].float(), rtol=0, atol=2.0 ** -7 * 8)
    torch.testing.assert_close(one[1], four[1], rtol=0, atol=1e-5)


def test_decode_vs_unquantized_k() -> None:
    """Against the bf16 K before FP8 storage, within a bound derived from e4m3's precision.

    Each nope value is off by at most 2**-4 relative (3 mantissa bits, round to nearest), or by
    half the subnormal step 2**-10 * tile scale; rope is exact. So each score moves by at most
    ds = scale * sum_d |q_d| * |dk_d|, the softmax weights by a factor within exp(+-2 max ds), and
    |d out| <= max|dV| + (exp(2 max ds) - 1) * max|V|; plus the bf16 terms of the module docstring.
    """
    ps = 64
    k = (torch.randn(2 * ps, 512) * 0.5).bfloat16()
    buf = kvl.alloc_k_cache(2, ps)
    kvl.store_k_v4_reference(k, buf, torch.arange(2 * ps), ps)
    q = (torch.randn(1, 1, 8, 512) * 0.5).bfloat16()
    idx = torch.arange(2 * ps).int().view(1, 1, -1)
    out, _ = sm.sparse_mla_decode_reference(q, kvl.paged_view(buf, ps), idx)
    kf = k.double()
    valid = torch.ones(1, 2 * ps, dtype=torch.bool)
    exact, _, _ = _f64_attend(q.reshape(1, 8, 512), kf[None], valid, 512 ** -0.5, None)
    tile_scale = torch.exp2(kvl.quantize_k_v4_reference(k)[2].double() - 127).repeat_interleave(64, 1)
    dk = torch.cat([torch.maximum(kf[:, :448].abs() * 2.0 ** -4, tile_scale * 2.0 ** -10),
                    torch.zeros(2 * ps, 64, dtype=torch.float64)], 1)
    ds = (512 ** -0.5) * (q.double().abs().reshape(8, 512) @ dk.T).max()
    vmax = kf.abs().max()
    bound = dk.max() + (math.exp(2 * float(ds)) - 1) * vmax + 2.0 ** -7 * vmax
    err = (out.double().reshape(8, 512) - exact[0]).abs().max()
    assert err <= bound, f"{err=} {bound=}"


PREFILL_CASES = {
    "full": (9, 20, 48, True, "rand"),
    "no_len_no_sink": (5, 16, 64, False, None),
    "lonely_and_inf_sink": (4, 8, 32, "zero", "inf"),
}


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("case", list(PREFILL_CASES))
def test_prefill_matches_f64(path: str, case: str) -> None:
    s_q, h, topk, lens_kind, sink_kind = PREFILL_CASES[case]
    s_kv = 50
    kv = torch.randn(s_kv, 1, 512).bfloat16()
    nan_rows = torch.tensor([7, 31])
    kv[nan_rows] = float("nan")
    q = torch.randn(s_q, h, 512).bfloat16()
    good = torch.tensor([i for i in range(s_kv) if i not in nan_rows.tolist()])
    idx = good[torch.randint(0, good.numel(), (s_q, 1, topk))].int()
    idx[:, 0, 1] = -1
    idx[:, 0, 2] = s_kv + 5  # >= s_kv: invalid
    lens = None
    if lens_kind:
        lens = torch.randint(topk // 2, topk + 1, (s_q,)).int() if lens_kind is True else torch.zeros(s_q).int()
        for i in range(s_q):
            idx[i, 0, int(lens[i]):] = int(nan_rows[0])  # past the length: a NaN row, must be ignored
    sink = {"rand": torch.randn(h) + 3, "inf": torch.full((h,), math.inf), None: None}[sink_kind]
    fn = sm.sparse_mla_prefill_reference if path == "torch" else sm.sparse_mla_prefill_triton
    out, mx, lse = fn(q, kv, idx, 0.06, 512, sink, lens)
    assert out.shape == (s_q, h, 512) and mx.shape == lse.shape == (s_q, h)
    ids = idx[:, 0].long()
    valid = (ids >= 0) & (ids < s_kv)
    if lens is not None:
        valid &= torch.arange(topk)[None, :] < lens[:, None]
    g = kv[ids.clamp(0, s_kv - 1), 0].double().masked_fill(~valid[..., None], 0.0)
    ref_out, ref_lse, ref_mx = _f64_attend(q, g, valid, 0.06, sink)
    _check(out, lse, ref_out, ref_lse, vmax=float(kv[good].abs().max()))
    assert torch.equal(mx.isneginf(), ref_mx.isneginf())
    fin = ref_mx.isfinite()
    torch.testing.assert_close(mx.double()[fin], ref_mx[fin], rtol=0, atol=1e-4)


@needs_sglang
def test_shims_flash_mla_and_sgl_kernel() -> None:
    """The upstream names: flash_mla (with FlashMLASchedMeta reuse rules), sgl_kernel, SGLang's wrapper."""
    import flash_mla
    import sgl_kernel
    from sglang.kernels.ops.attention import flash_mla_interface as sgl_fmi

    main = _make_cache(2, 64, poison=0.0)
    q = torch.randn(1, 1, 16, 512).bfloat16()
    idx = torch.randint(0, 128, (1, 1, 64)).int()
    sink = torch.randn(16)
    meta, none = flash_mla.get_mla_metadata()
    assert none is None and isinstance(meta, flash_mla.FlashMLASchedMeta)
    k4 = kvl.paged_view(main, 64)
    out, lse = flash_mla.flash_mla_with_kvcache(q, k4, None, None, 512, meta, is_fp8_kvcache=True, indices=idx,
                                                attn_sink=sink)
    ref = sm.sparse_mla_decode_reference(q, k4, idx, None, sink)
    torch.testing.assert_close(out.float(), ref[0].float(), rtol=0, atol=2.0 ** -7 * 8)
    assert meta.have_initialized and meta.config.topk == 64
    with pytest.raises(AssertionError):  # reused with another topk: upstream refuses too
        flash_mla.flash_mla_with_kvcache(q, k4, None, None, 512, meta, is_fp8_kvcache=True, indices=idx[..., :32])
    out2, _ = sgl_kernel.flash_mla_with_kvcache(q=q, k_cache=k4, block_table=None, cache_seqlens=None, head_dim_v=512,
                                                tile_scheduler_metadata=None, indices=idx, attn_sink=sink)
    assert torch.equal(out2, out)
    out3, _ = sgl_fmi.flash_mla_with_kvcache(q=q, k_cache=k4, block_table=None, cache_seqlens=None, head_dim_v=512,
                                             tile_scheduler_metadata=flash_mla.get_mla_metadata()[0],
                                             softmax_scale=512 ** -0.5, is_fp8_kvcache=True, indices=idx,
                                             attn_sink=sink, use_legacy=True)
    assert torch.equal(out3, out)
    kv = torch.randn(40, 1, 512).bfloat16()
    qp = torch.randn(3, 16, 512).bfloat16()
    ip = torch.randint(0, 40, (3, 1, 32)).int()
    o_e, m_e, l_e = flash_mla.flash_mla_sparse_fwd(qp, kv, ip, 0.05)
    o_2, m_2, l_2 = sgl_kernel.flash_mla_sparse_fwd(qp, kv, ip, 0.05)
    o_s, _, l_s = sgl_fmi.flash_mla_sparse_fwd(qp, kv, ip, 0.05)
    assert torch.equal(o_e, o_2) and torch.equal(o_e, o_s)
    torch.testing.assert_close(l_2, l_e * math.log2(math.e))  # sgl-kernel's statistics are base 2
    torch.testing.assert_close(l_s, l_2)
    with pytest.raises(NotImplementedError):
        flash_mla.flash_mla_with_kvcache(q, k4, None, None, 512, flash_mla.get_mla_metadata()[0])
    with pytest.raises(AttributeError):
        flash_mla.fused_norm_rope_attn_rope_cast.prefill  # noqa: B018  (MegaAttention: not implemented)


# --------------------------------------------------------------------------------------------
# GPU, V4.1-Flash sizes: 64 heads x 512, SWA window 128 on 256-token pages, 512 compressed top-k
# --------------------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("b,s_q", [(1, 1), (4, 1), (2, 4)])
def test_gpu_decode_v41_flash_sizes(b: int, s_q: int) -> None:
    dev = "cuda"
    main = _make_cache(64, 256, dev, poison=0.01)
    extra = _make_cache(256, 64, dev, poison=0.01)
    q = torch.randn(b, s_q, 64, 512, device=dev).bfloat16()
    idx = _good_ids(main, (b, s_q, 128), 64 * 256)
    ex_idx = _good_ids(extra, (b, s_q, 512), 256 * 64)
    lens = torch.randint(1, 129, (b,), device=dev).int()
    ex_lens = torch.randint(0, 513, (b,), device=dev).int()
    sink = torch.randn(64, device=dev) + 5
    out, lse = sm.sparse_mla_decode_triton(q, kvl.paged_view(main, 256), idx, lens, sink,
                                           kvl.paged_view(extra, 64), ex_idx, ex_lens, 512 ** -0.5)
    ref_out, ref_lse, vmax = _decode_f64(q, [(main, 256, idx, lens), (extra, 64, ex_idx, ex_lens)], 512 ** -0.5,
                                         sink)
    _check(out, lse, ref_out, ref_lse, vmax)


@pytest.mark.gpu
def test_gpu_decode_in_graph_merges_after_the_splits() -> None:
    """Batch 1 splits the keys and merges the splits in a second kernel: captured in a CUDA graph
    together with the copy that feeds q and replayed on new queries, every replay must match the
    float64 reference of that replay's q (the merge must see this replay's partials)."""
    dev = "cuda"
    main = _make_cache(64, 256, dev, poison=0.01)
    extra = _make_cache(256, 64, dev, poison=0.01)
    idx = _good_ids(main, (1, 1, 128), 64 * 256)
    ex_idx = _good_ids(extra, (1, 1, 512), 256 * 64)
    lens = torch.tensor([128], device=dev, dtype=torch.int32)
    ex_lens = torch.tensor([512], device=dev, dtype=torch.int32)
    sink = torch.randn(64, device=dev) + 5
    src = torch.randn(1, 1, 64, 512, device=dev).bfloat16()
    q = torch.empty_like(src)

    def step() -> tuple[torch.Tensor, torch.Tensor]:
        q.copy_(src)
        return sm.sparse_mla_decode_triton(q, kvl.paged_view(main, 256), idx, lens, sink,
                                           kvl.paged_view(extra, 64), ex_idx, ex_lens, 512 ** -0.5)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()  # compile outside the capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out, lse = step()
    for _ in range(3):
        src.copy_(torch.randn_like(src, dtype=torch.float32).bfloat16())
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        ref_out, ref_lse, vmax = _decode_f64(src, [(main, 256, idx, lens), (extra, 64, ex_idx, ex_lens)],
                                             512 ** -0.5, sink)
        _check(out, lse, ref_out, ref_lse, vmax)


@pytest.mark.gpu
def test_gpu_prefill_v41_flash_sizes() -> None:
    dev = "cuda"
    s_q, s_kv, topk = 512, 4096, 640
    kv = torch.randn(s_kv, 1, 512, device=dev).bfloat16()
    q = torch.randn(s_q, 64, 512, device=dev).bfloat16()
    idx = torch.randint(-1, s_kv, (s_q, 1, topk), device=dev).int()
    lens = torch.randint(0, topk + 1, (s_q,), device=dev).int()
    sink = torch.randn(64, device=dev)
    out, mx, lse = sm.sparse_mla_prefill_triton(q, kv, idx, 512 ** -0.5, 512, sink, lens)
    r_out, r_mx, r_lse = sm.sparse_mla_prefill_reference(q, kv, idx, 512 ** -0.5, 512, sink, lens)
    _check(out, lse, r_out.double(), r_lse.double(), vmax=float(kv.abs().max()))
