"""The CPU-engine helpers vs the semantics of SGLang's Triton kernels of the same name, checked by
running SGLang's own Triton kernels under the interpreter on the same inputs where they exist."""

from __future__ import annotations

import importlib

import pytest
import sgl_kernel
import torch


def _sglang(mod: str, name: str):
    try:
        return getattr(importlib.import_module(mod), name)
    except Exception as exc:  # pragma: no cover - depends on the installed SGLang
        pytest.skip(f"{mod}.{name} not importable here: {exc}")


def test_assign_req_to_token_pool_and_extend_locs() -> None:
    r2t = torch.zeros(4, 32, dtype=torch.int32)
    req = torch.tensor([2, 0], dtype=torch.int64)
    start, end = torch.tensor([3, 0]), torch.tensor([7, 5])
    locs = torch.arange(100, 109, dtype=torch.int64)
    sgl_kernel.assign_req_to_token_pool_cpu(req, r2t, start, end, locs, 32)
    assert r2t[2, 3:7].tolist() == [100, 101, 102, 103] and r2t[0, 0:5].tolist() == [104, 105, 106, 107, 108]
    assert r2t[2, :3].eq(0).all() and r2t[1].eq(0).all()
    out = torch.full((9,), -1, dtype=torch.int64)
    sgl_kernel.assign_extend_cache_locs_cpu(req, r2t, start, end, out, 32)
    assert out.tolist() == list(range(100, 109))


def test_draft_locs_bonus_and_accept() -> None:
    r2t = torch.arange(64, dtype=torch.int32).view(2, 32)
    out = torch.full((8,), -1, dtype=torch.int64)
    sgl_kernel.assign_draft_cache_locs_contiguous_cpu(torch.tensor([1, 0]), r2t, torch.tensor([5, 2]), out, 32, 2, 2)
    assert out.tolist() == [37, 38, 39, 40, 2, 3, 4, 5]
    acc = torch.tensor([[10, 11, 12], [20, 21, 22]])
    bonus = torch.full((2,), -1)
    sgl_kernel.fill_bonus_tokens_cpu(acc, torch.tensor([2, 3]), bonus, 3)
    assert bonus.tolist() == [11, 22]
    dst = torch.full((4,), -1, dtype=torch.int64)
    sgl_kernel.fill_accept_out_cache_loc_cpu(torch.tensor([0, -1, 3, 4]), torch.tensor([7, 8, 9, 10, 11]), dst)
    assert dst[:3].tolist() == [7, 10, 11]


def test_copy_all_layer_kv_cache_overlapping() -> None:
    bufs = [torch.arange(40, dtype=torch.float32).view(10, 4).clone() for _ in range(2)]
    ptrs = torch.tensor([b.data_ptr() for b in bufs], dtype=torch.int64)
    strides = torch.tensor([16, 16], dtype=torch.int64)
    before = bufs[0].clone()
    sgl_kernel.copy_all_layer_kv_cache_cpu(ptrs, strides, torch.tensor([1, 2]), torch.tensor([2, 5]))
    for b in bufs:
        assert torch.equal(b[1], before[2]) and torch.equal(b[2], before[5]) and torch.equal(b[0], before[0])


def _tree_inputs() -> tuple:
    # topk 2, depth 2, 4 draft tokens + root; parent_list / selected index as EAGLE builds them.
    parent_list = torch.tensor([[-1, 0, 1, 2, 3]], dtype=torch.int64)
    selected = torch.tensor([[0, 1, 2, 4]], dtype=torch.int64)
    return parent_list, selected, torch.tensor([6], dtype=torch.int64)


@pytest.mark.parametrize("mode", [0, 1])
def test_build_tree_matches_sglang_triton(mode: int) -> None:
    triton_fn = _sglang("sglang.kernels.ops.speculative.spec_tree", "sgl_build_tree_kernel_triton")
    n, depth, topk = 5, 2, 2
    parent_list, selected, seq = _tree_inputs()
    outs = []
    for fn in ("shim", "upstream"):
        size = n * (int(seq.sum()) + n) if mode == 0 else n * n
        mask = torch.zeros(size, dtype=torch.bool)
        pos = torch.full((n,), -1, dtype=torch.int64)
        ri, rn, rs = (torch.full((1, n), -1, dtype=torch.int64) for _ in range(3))
        if fn == "shim":
            sgl_kernel.build_tree_kernel_efficient_cpu(parent_list, selected, seq, mask, pos, ri, rn, rs, topk, depth,
                                                       n, mode)
        else:
            triton_fn(parent_list, selected, seq, mask, pos, ri, rn, rs, topk, depth, n, mode)
        outs.append((mask, pos, ri, rn, rs))
    for a, b in zip(*outs, strict=False):
        assert torch.equal(a, b)


def test_verify_tree_greedy_matches_sglang_triton() -> None:
    triton_fn = _sglang("sglang.kernels.ops.speculative.spec_tree", "verify_tree_greedy_triton")
    cand = torch.tensor([[5, 7, 8, 9], [1, 2, 3, 4]])
    ri = torch.tensor([[0, 1, 2, 3], [4, 5, 6, 7]])
    rn = torch.tensor([[1, 3, -1, -1], [2, -1, -1, -1]])
    rs = torch.tensor([[-1, 2, -1, -1], [-1, -1, -1, -1]])
    target = torch.tensor([[8, 1, 9, 6], [9, 9, 9, 9]])
    res = []
    for fn in ("shim", "upstream"):
        pred = torch.full((8,), -1)
        acc = torch.full((2, 3), -1)
        num = torch.full((2,), -1)
        kw = dict(predicts=pred, accept_index=acc, accept_token_num=num, candidates=cand)
        if fn == "shim":
            sgl_kernel.verify_tree_greedy_cpu(**kw, retrive_index=ri, retrive_next_token=rn,
                                              retrive_next_sibling=rs, target_predict=target)
        else:
            triton_fn(pred, acc, num, cand, ri, rn, rs, target)
        res.append((pred, acc, num))
    for a, b in zip(*res, strict=False):
        assert torch.equal(a, b)
    assert res[0][2].tolist() == [1, 0]
