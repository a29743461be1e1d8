"""moe_align_block_size (exact, against a counting reference as upstream's test_moe_align.py) and
moe_sum / moe_sum_reduce (atol 2e-2)."""

from __future__ import annotations

import pytest
import sgl_kernel
import torch

from kernels_triton import moe_sum
from tests.ops._helpers import PATHS, assert_no_nan_close, poisoned


@pytest.mark.parametrize("tokens,topk,experts,block", [(1, 6, 64, 16), (33, 2, 160, 32), (64, 6, 384, 64)])
@pytest.mark.parametrize("pad", [True, False])
def test_moe_align_block_size(tokens: int, topk: int, experts: int, block: int, pad: bool) -> None:
    _check_align(tokens, topk, experts, block, pad, "cpu")


@pytest.mark.gpu
@pytest.mark.parametrize("tokens", [1, 8192])
def test_moe_align_block_size_gpu(tokens: int) -> None:
    """V4.1-Flash sizes on the GPU: 384 experts (+1 bucket), top-6, blocks of 64."""
    _check_align(tokens, 6, 384, 64, True, "cuda")


def _check_align(tokens: int, topk: int, experts: int, block: int, pad: bool, device: str) -> None:
    """Run the shim on random distinct top-k ids and check every expert's padded segment against a count."""
    ids = torch.argsort(torch.rand(tokens, experts), dim=1)[:, :topk].to(torch.int32).to(device)
    n = experts + 1
    max_pad = ids.numel() + n * (block - 1)
    sorted_ids = torch.full((max_pad,), -7 if pad else ids.numel(), dtype=torch.int32, device=device)
    exp_ids = torch.zeros(max_pad // block + 1, dtype=torch.int32, device=device)
    post = torch.empty(1, dtype=torch.int32, device=device)
    cums = torch.empty(n + 1, dtype=torch.int32, device=device)
    sgl_kernel.moe_align_block_size(ids, n, block, sorted_ids, exp_ids, post, cums, pad)
    ids, sorted_ids, exp_ids, post = ids.cpu(), sorted_ids.cpu(), exp_ids.cpu(), post.cpu()
    counts = torch.bincount(ids.view(-1).long(), minlength=experts)
    padded = (counts + block - 1) // block * block
    assert int(post) == int(padded.sum())
    start = 0
    for e in range(experts):
        seg = sorted_ids[start:start + padded[e]]
        real = seg[seg < ids.numel()]
        assert sorted(real.tolist()) == torch.nonzero(ids.view(-1) == e).view(-1).tolist()
        assert (seg[len(real):] == ids.numel()).all()
        assert (exp_ids[start // block:(start + padded[e]) // block] == e).all()
        start += int(padded[e])


def test_moe_align_invalid_expert_bucket() -> None:
    ids = torch.tensor([[0, -1], [1, 0]], dtype=torch.int32)
    sorted_ids = torch.full((32,), 4, dtype=torch.int32)
    exp_ids = torch.full((8,), 99, dtype=torch.int32)
    post = torch.empty(1, dtype=torch.int32)
    sgl_kernel.moe_align_block_size(ids, 3, 4, sorted_ids, exp_ids, post, None)
    assert int(post) == 12 and exp_ids[:3].tolist() == [-1, 0, 1]
    sgl_kernel.moe_align_block_size(ids, 3, 4, sorted_ids, exp_ids, post, None, ignore_invalid_expert=True)
    assert int(post) == 8 and exp_ids[:2].tolist() == [0, 1]


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("m,topk,k", [(1, 2, 128), (33, 6, 511), (0, 6, 64)])
def test_moe_sum(path: str, dtype: torch.dtype, m: int, topk: int, k: int) -> None:
    x = torch.randn(m, topk, k, dtype=dtype)
    out = poisoned(m, k, dtype=dtype)
    if path == "torch":
        sgl_kernel.moe_sum(x, out)
    else:
        moe_sum.moe_sum_triton(x, out)
    # upstream compares with input.sum(dim=1) in the input dtype (fp32 accumulate, one rounding)
    # Triton's CPU interpreter truncates fp32 -> bf16 instead of rounding: allow one bf16 ulp there.
    rtol = 8e-3 if (path == "triton" and dtype == torch.bfloat16) else 0
    assert_no_nan_close(out, x.sum(dim=1), rtol, 2e-2 if dtype != torch.float32 else 1e-5)


@pytest.mark.parametrize("path", PATHS)
def test_moe_sum_reduce(path: str) -> None:
    x = torch.randn(9, 6, 256, dtype=torch.bfloat16)
    out = poisoned(9, 256, dtype=torch.bfloat16)
    if path == "torch":
        sgl_kernel.moe_sum_reduce(x, out, 1.5)
    else:
        moe_sum.moe_sum_triton(x, out, 1.5)
    assert_no_nan_close(out, x.float().sum(1) * 1.5, 1e-2, 5e-2)


@pytest.mark.gpu
def test_moe_sum_reduce_gpu() -> None:
    x = torch.randn(4096, 6, 5120, dtype=torch.bfloat16, device="cuda")
    out = torch.full((4096, 5120), float("nan"), dtype=torch.bfloat16, device="cuda")
    sgl_kernel.moe_sum_reduce(x, out, 1.5)
    assert_no_nan_close(out, x.float().sum(1) * 1.5, 1e-2, 5e-2)


@pytest.mark.parametrize("ignore_invalid", [False, True])
def test_moe_align_random_with_invalid_ids_and_capture_proxy(ignore_invalid: bool) -> None:
    # Random ids incl. -1 (EP-masked) and out-of-range ids, against a per-bucket counting reference,
    # then the same call on meta tensors under the CUDA-graph capture proxy of test_dsv4_graph_safe
    # (no host sync, no data-dependent shape, no host -> device copy): SGLang calls it inside graphs.
    from tests.ops.test_dsv4_graph_safe import _run_on_meta

    torch.manual_seed(7)
    experts, block = 12, 8
    n = experts + 1
    ids = torch.randint(-1, experts + 2, (37, 3), dtype=torch.int32)
    max_pad = ids.numel() + n * (block - 1)
    sorted_ids = torch.full((max_pad,), -7, dtype=torch.int32)
    exp_ids = torch.full((max_pad // block + 1,), 99, dtype=torch.int32)
    post = torch.full((1,), -1, dtype=torch.int32)
    cums = torch.full((n + 1,), -1, dtype=torch.int32)
    sgl_kernel.moe_align_block_size(ids, n, block, sorted_ids, exp_ids, post, cums, True, ignore_invalid)
    flat = ids.view(-1).long()
    valid = (flat >= 0) & (flat < experts)
    bucket = torch.where(valid, flat + 1, torch.full_like(flat, -1 if ignore_invalid else 0))
    start = 0
    for b in range(n):
        members = torch.nonzero(bucket == b).view(-1).tolist()
        size = (len(members) + block - 1) // block * block
        seg = sorted_ids[start:start + size]
        assert sorted(seg[:len(members)].tolist()) == members
        assert (seg[len(members):] == ids.numel()).all()
        assert (exp_ids[start // block:(start + size) // block] == b - 1).all()
        assert int(cums[b]) == start
        start += size
    assert int(post) == start == int(cums[n])
    assert (exp_ids[start // block:] == 99).all() and (sorted_ids[start:] == -7).all()
    _run_on_meta(sgl_kernel.moe_align_block_size, ids, n, block, sorted_ids, exp_ids, post, cums, True,
                 ignore_invalid)
