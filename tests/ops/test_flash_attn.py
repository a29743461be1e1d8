"""FA3 flash_attn_varlen_func / flash_attn_with_kvcache vs a float attention reference (upstream
test_flash_attention.py: causal bottom-right, sliding window, softcap, GQA, paged KV; bf16 atol
around 1e-2 scaled by the reference's own bf16 error)."""

from __future__ import annotations

import math

import flash_attn_interface
import pytest
import torch
from sgl_kernel.flash_attn import flash_attn_varlen_func, flash_attn_with_kvcache

from kernels_triton import flash_attn as fa


def _naive(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, window: tuple[int, int],
           softcap: float) -> tuple[torch.Tensor, torch.Tensor]:
    """One sequence, float64: q [Sq, Hq, D], k/v [Sk, Hk, D] -> (out, lse [Sq, Hq])."""
    sq, sk, hq, d = q.shape[0], k.shape[0], q.shape[1], q.shape[2]
    r = hq // k.shape[1]
    kk, vv = k.double().repeat_interleave(r, 1), v.double().repeat_interleave(r, 1)
    s = torch.einsum("qhd,khd->hqk", q.double(), kk) / math.sqrt(d)
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    i = torch.arange(sq)[:, None] + sk - sq
    j = torch.arange(sk)[None, :]
    left, right = window
    if causal:
        right = 0
    ok = torch.ones(sq, sk, dtype=torch.bool)
    if right >= 0:
        ok &= j <= i + right
    if left >= 0:
        ok &= j >= i - left
    s = s.masked_fill(~ok, float("-inf"))
    lse = torch.logsumexp(s, -1)
    return torch.einsum("hqk,khd->qhd", torch.exp(s - lse[..., None]).nan_to_num(0), vv), lse.t()


CASES = [(False, (-1, -1), 0.0), (True, (-1, -1), 0.0), (True, (8, 0), 0.0), (False, (4, 3), 30.0)]


@pytest.mark.parametrize("path", ["torch", "triton"])
@pytest.mark.parametrize("causal,window,softcap", CASES)
@pytest.mark.parametrize("hq,hk,d", [(4, 1, 64), (2, 2, 80)])
def test_varlen(path: str, causal: bool, window: tuple[int, int], softcap: float, hq: int, hk: int, d: int) -> None:
    lq, lk = [7, 1, 20], [7, 33, 20]
    cq = torch.tensor([0, *torch.tensor(lq).cumsum(0).tolist()], dtype=torch.int32)
    ck = torch.tensor([0, *torch.tensor(lk).cumsum(0).tolist()], dtype=torch.int32)
    q = torch.randn(sum(lq), hq, d, dtype=torch.bfloat16)
    k = torch.randn(sum(lk), hk, d, dtype=torch.bfloat16)
    v = torch.randn_like(k)
    if path == "torch":
        out, lse = flash_attn_varlen_func(q, k, v, cq, ck, max(lq), max(lk), causal=causal, window_size=window,
                                          softcap=softcap, return_softmax_lse=True)
        lse = lse.t()
    else:
        out, lse = fa.attention_triton(q, k, v, cq, max(lq), cu_seqlens_k=ck, causal=causal, window_size=window,
                                       softcap=softcap)
    assert not torch.isnan(out).any()
    for b in range(3):
        ro, rl = _naive(q[cq[b]:cq[b + 1]], k[ck[b]:ck[b + 1]], v[ck[b]:ck[b + 1]], causal, window, softcap)
        torch.testing.assert_close(out[cq[b]:cq[b + 1]].double(), ro, atol=2e-2, rtol=2e-2)
        torch.testing.assert_close(lse[cq[b]:cq[b + 1]].double(), rl, atol=1e-3, rtol=1e-3)


@pytest.mark.parametrize("path", ["torch", "triton"])
@pytest.mark.parametrize("causal", [False, True])
def test_with_kvcache_paged(path: str, causal: bool) -> None:
    bsz, sq, hq, hk, d, page = 3, 2, 4, 1, 64, 16
    seqlens = torch.tensor([5, 40, 17], dtype=torch.int32)
    pages = torch.randperm(12).to(torch.int32)
    pt = pages[:9].view(bsz, 3)
    kc = torch.randn(12, page, hk, d, dtype=torch.bfloat16)
    vc = torch.randn_like(kc)
    q = torch.randn(bsz, sq, hq, d, dtype=torch.bfloat16)
    if path == "torch":
        out = flash_attn_with_kvcache(q, kc, vc, cache_seqlens=seqlens, page_table=pt, causal=causal)
    else:
        cq = torch.arange(0, (bsz + 1) * sq, sq, dtype=torch.int32)
        out, _ = fa.attention_triton(q.view(-1, hq, d), kc, vc, cq, sq, seqused_k=seqlens, page_table=pt, causal=causal)
        out = out.view(q.shape)
    for b in range(bsz):
        pos = torch.arange(int(seqlens[b]))
        rows = pt[b, pos // page].long() * page + pos % page
        kb, vb = kc.view(-1, hk, d)[rows], vc.view(-1, hk, d)[rows]
        ro, _ = _naive(q[b], kb, vb, causal, (-1, -1), 0.0)
        torch.testing.assert_close(out[b].double(), ro, atol=2e-2, rtol=2e-2)


def test_dense_cache_lse_layout_and_aliases() -> None:
    q = torch.randn(2, 3, 4, 64, dtype=torch.bfloat16)
    kc = torch.randn(2, 10, 2, 64, dtype=torch.bfloat16)
    out, lse = flash_attn_with_kvcache(q, kc, kc.clone(), cache_seqlens=torch.tensor([10, 6], dtype=torch.int32),
                                       causal=True, return_softmax_lse=True)
    assert out.shape == q.shape and lse.shape == (2, 4, 3)
    assert flash_attn_interface.flash_attn_varlen_func is flash_attn_varlen_func
    with pytest.raises(NotImplementedError):
        flash_attn_with_kvcache(q, kc, kc, k=kc[:, :1])


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True])
def test_varlen_gpu(causal: bool) -> None:
    lens = [1024, 333, 2048]
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32, device="cuda")
    q = torch.randn(sum(lens), 16, 80, dtype=torch.bfloat16, device="cuda")  # vision-tower-like heads
    k, v = torch.randn_like(q), torch.randn_like(q)
    out = flash_attn_varlen_func(q, k, v, cu, cu, max(lens), max(lens), causal=causal)
    ro, _ = fa.attention_ref(q, k, v, cu, cu_seqlens_k=cu, causal=causal)
    torch.testing.assert_close(out.float(), ro.float(), atol=2e-2, rtol=2e-2)


@pytest.mark.gpu
@pytest.mark.parametrize("causal,window", [(True, (-1, -1)), (False, (-1, -1)), (True, (256, 0))])
def test_with_kvcache_paged_gpu(causal: bool, window: tuple[int, int]) -> None:
    """flash_attn_with_kvcache on the GPU, as the fa3 backend calls it: a paged cache (pages of 64), GQA
    (32 q heads over 4 kv heads, head dim 128), decode (1 query) and a short extend (5 queries) over
    contexts up to ~3000 tokens, with and without a sliding window; fp64 reference per sequence."""
    torch.manual_seed(11)
    bsz, hq, hk, d, page = 4, 32, 4, 128, 64
    seqlens = torch.tensor([5, 700, 2999, 64], dtype=torch.int32)
    per = -(-int(seqlens.max()) // page)
    n_pages = bsz * per + 3
    pt = torch.randperm(n_pages)[: bsz * per].view(bsz, per).to(torch.int32)
    kc = torch.randn(n_pages, page, hk, d, dtype=torch.bfloat16)
    vc = torch.randn_like(kc)
    for sq in (1, 5):
        q = torch.randn(bsz, sq, hq, d, dtype=torch.bfloat16)
        out = flash_attn_with_kvcache(q.cuda(), kc.cuda(), vc.cuda(), cache_seqlens=seqlens.cuda(),
                                      page_table=pt.cuda(), causal=causal, window_size=window)
        assert out.is_cuda and not torch.isnan(out).any()
        out = out.cpu()
        for b in range(bsz):
            pos = torch.arange(int(seqlens[b]))
            rows = pt[b, pos // page].long() * page + pos % page
            kb, vb = kc.view(-1, hk, d)[rows], vc.view(-1, hk, d)[rows]
            ro, _ = _naive(q[b], kb, vb, causal, window, 0.0)
            torch.testing.assert_close(out[b].double(), ro, atol=2e-2, rtol=2e-2)
