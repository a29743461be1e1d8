"""The decode-path functions of shims/sgl_kernel/dsv4_xpu.py (and the deep_gemm shim) are CUDA-graph safe.

SGLang captures DeepSeek-V4's decode forward (metadata included) in CUDA graphs; a host sync
(`.item()`, `bool(t)`, `nonzero`, `.cpu()`) or a host-to-device copy (`torch.tensor(x, device=gpu)`)
inside it fails the capture. The functions were rewritten in masked form (compute every row, select
with a where, redirect the scatter writes of skipped rows so that they change nothing).

1. Equality: each rewritten function gives bit-identical results -- outputs and every buffer it
   writes, compared byte for byte over the whole buffer, with buffers poisoned with random bytes
   (NaN payloads included) -- to the implementation it replaced (kept below as `_old_*`, written with
   the module's unchanged helpers) on random inputs with edge rows: rows that do not compress,
   negative / garbage locations, seq lens at window and page boundaries, tied scores.
2. Capturability proxy: the function runs on `meta` tensors under `_graph_capture_proxy()`. On meta a
   host sync or data-dependent shape raises (`.item()`, `bool()`, `nonzero`, `.cpu()`); the proxy adds
   what meta lets through: `torch.tensor`/`torch.as_tensor` onto a device and copies from host
   tensors onto a device. `test_proxy_catches_the_old_implementations` shows it rejects the old code.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

import shims.deep_gemm as deep_gemm
from kernels_triton import dsv4_xpu_ops as XO
from kernels_triton import indexer as IX
from shims.sgl_kernel import dsv4_xpu as X

CPU = torch.device("cpu")


# ------------------------------------------------------------------------------------------------
# The capture proxy
# ------------------------------------------------------------------------------------------------
class _NoHostToDeviceFactories(TorchFunctionMode):
    """torch.tensor / torch.as_tensor with an accelerator device copy host data to it (not capturable)."""

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        # by name: torch.tensor may be a wrapper by now (winport.patches.cpu_pin_memory wraps the
        # factories when kt-kernel is imported on CPU-only torch); the mode sees the builtin it calls
        if getattr(func, "__name__", None) in ("tensor", "as_tensor") and kwargs.get("device") is not None \
                and torch.device(kwargs["device"]).type != "cpu":
            raise RuntimeError(f"graph proxy: {func.__name__}(..., device={kwargs['device']}) copies from the host")
        return func(*args, **kwargs)


class _NoHostToDeviceCopies(TorchDispatchMode):
    """A copy from a host tensor onto a device tensor is a cudaMemcpy from pageable memory (not capturable)."""

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        name = str(func)
        if name.startswith("aten._to_copy") and isinstance(args[0], torch.Tensor) and args[0].device.type == "cpu" \
                and kwargs.get("device") is not None and torch.device(kwargs["device"]).type != "cpu":
            raise RuntimeError("graph proxy: host -> device copy (.to(device) of a CPU tensor)")
        if name.startswith("aten.copy_") and args[1].device.type == "cpu" and args[0].device.type != "cpu":
            raise RuntimeError("graph proxy: host -> device copy_")
        if name.startswith(("aten._local_scalar_dense", "aten.nonzero", "aten.masked_select")):
            raise RuntimeError(f"graph proxy: {name} syncs with the host")
        return func(*args, **kwargs)


@contextlib.contextmanager
def _graph_capture_proxy() -> Iterator[None]:
    with _NoHostToDeviceFactories(), _NoHostToDeviceCopies():
        yield


def _meta(t: torch.Tensor) -> torch.Tensor:
    """A meta tensor of t's shape, dtype and strides (no data: any read of values fails)."""
    return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="meta")


def _run_on_meta(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    conv = [(_meta(a) if isinstance(a, torch.Tensor) else a) for a in args]
    conv = [tuple(_meta(x) for x in a) if isinstance(a, tuple) else a for a in conv]
    kw = {k: (_meta(v) if isinstance(v, torch.Tensor) else v) for k, v in kwargs.items()}
    with _graph_capture_proxy():
        return fn(*conv, **kw)


# ------------------------------------------------------------------------------------------------
# The replaced implementations (the reference for bit equality)
# ------------------------------------------------------------------------------------------------
def _old_flash_compress4_decode(kv_buffer, kv_input, kv_output, ape, plan_d):  # noqa: ANN001, ANN202
    hd = XO._check_compress(kv_buffer, kv_input, ape, 4)
    seq, write, rp0, rp1 = XO._decode_plan(plan_d)
    XO._write_state(kv_buffer, kv_input, write)
    rows = torch.nonzero(seq % 4 == 0).flatten()
    if rows.numel() == 0:
        return
    full = torch.full_like(rows, 8)
    kv, score = XO._c4_window(kv_buffer, kv_input, rows, rp0[rows], rp1[rows], full, seq[rows] > 4, hd)
    kv_output[rows] = XO._gated_pool(kv, score, ape, kv_output.dtype)


def _old_flash_compress128_decode(kv_buffer, kv_input, kv_output, ape, plan_d):  # noqa: ANN001, ANN202
    hd = XO._check_compress(kv_buffer, kv_input, ape, 128)
    _, write, _, rp1 = XO._decode_plan(plan_d)
    XO._write_state(kv_buffer, kv_input, write)
    rows = torch.nonzero(XO._tmod(write, 128) == 127).flatten()
    if rows.numel() == 0:
        return
    kv, score = XO._c128_window(kv_buffer, kv_input, rows, rp1[rows], torch.full_like(rows, 128), hd)
    kv_output[rows] = XO._gated_pool(kv, score, ape, kv_output.dtype)


def _old_flash_compress4_prefill(kv_buffer, kv_input, kv_output, ape, plan_c, plan_w):  # noqa: ANN001, ANN202
    hd = XO._check_compress(kv_buffer, kv_input, ape, 4)
    valid, seq, ragged, buf_len, rp0, rp1 = XO._compress_plan(plan_c)
    rows = torch.nonzero(valid).flatten()
    if rows.numel():
        kv, score = XO._c4_window(kv_buffer, kv_input, ragged[rows], rp0[rows], rp1[rows], buf_len[rows],
                                 seq[rows] > 4, hd)
        kv_output[rows] = XO._gated_pool(kv, score, ape, kv_output.dtype)
    w_valid, w_ragged, w_loc = XO._write_plan(plan_w)
    XO._write_state(kv_buffer, kv_input[w_ragged[w_valid]], w_loc[w_valid])


def _old_flash_compress128_prefill(kv_buffer, kv_input, kv_output, ape, plan_c, plan_w):  # noqa: ANN001, ANN202
    hd = XO._check_compress(kv_buffer, kv_input, ape, 128)
    valid, _, ragged, buf_len, _, rp1 = XO._compress_plan(plan_c)
    rows = torch.nonzero(valid).flatten()
    if rows.numel():
        kv, score = XO._c128_window(kv_buffer, kv_input, ragged[rows], rp1[rows], buf_len[rows], hd)
        kv_output[rows] = XO._gated_pool(kv, score, ape, kv_output.dtype)
    w_valid, w_ragged, w_loc = XO._write_plan(plan_w)
    XO._write_state(kv_buffer, kv_input[w_ragged[w_valid]], w_loc[w_valid])


def _old_compress_norm_rope_store_prefill(kv, plan, norm_weight, norm_eps, freqs_cis, out_loc, kvcache,  # noqa: ANN001, ANN202
                                          is_decode, compress_ratio, page_size, use_fp4=False):
    assert not is_decode
    ratio, hd = compress_ratio, kv.shape[-1]
    valid, seq, ragged, _, _, _ = XO._compress_plan(plan)
    rows = torch.nonzero(valid).flatten()
    loc = out_loc[ragged[rows]].to(torch.int64)
    if rows.numel() == 0:
        return
    freqs = freqs_cis[(seq[rows] - ratio).to(torch.int64)].float()
    data = XO._rms_norm(kv[rows], norm_weight.to(kv.dtype), norm_eps)
    if hd == 512:
        XO._store_v4(XO._pages(kvcache, XO._v4_page_bytes(page_size)), loc, page_size, data, freqs, round_nope_bf16=True)
        return
    data = torch.cat([data[:, :XO.ROPE_DIM], XO._rope_pairs(data[:, XO.ROPE_DIM:], freqs)], dim=1)
    data = _old_hadamard128(data)
    if use_fp4:
        XO._store_indexer_fp4(XO._pages(kvcache, XO.INDEXER_FP4_BYTES * page_size), loc, page_size, data)
    else:
        XO._store_indexer_fp8(XO._pages(kvcache, XO.INDEXER_FP8_BYTES * page_size), loc, page_size, data)


def _old_hadamard128(x):  # noqa: ANN001, ANN202
    shape = x.shape
    y = x.reshape(-1, 128)
    for b in range(7):
        h = 1 << b
        v = y.reshape(-1, 128 // (2 * h), 2, h)
        y = torch.stack([v[:, :, 0] + v[:, :, 1], v[:, :, 0] - v[:, :, 1]], dim=2).reshape(-1, 128)
    return (y * torch.rsqrt(torch.tensor(128.0, device=x.device))).reshape(shape)


def _old_compress_norm_rope_store_decode(kv, plan, norm_weight, norm_eps, freqs_cis, out_loc, kvcache,  # noqa: ANN001, ANN202
                                         is_decode, compress_ratio, page_size, use_fp4=False):
    assert is_decode
    ratio, hd = compress_ratio, kv.shape[-1]
    seq, _, _, _ = XO._decode_plan(plan)
    rows = torch.nonzero(seq % ratio == 0).flatten()
    loc = out_loc[rows].to(torch.int64)
    if rows.numel() == 0:
        return
    freqs = freqs_cis[(seq[rows] - ratio).to(torch.int64)].float()
    data = XO._rms_norm(kv[rows], norm_weight.to(kv.dtype), norm_eps)
    if hd == 512:
        XO._store_v4(XO._pages(kvcache, XO._v4_page_bytes(page_size)), loc, page_size, data, freqs, round_nope_bf16=True)
        return
    data = torch.cat([data[:, :XO.ROPE_DIM], XO._rope_pairs(data[:, XO.ROPE_DIM:], freqs)], dim=1)
    data = _old_hadamard128(data)
    if use_fp4:
        XO._store_indexer_fp4(XO._pages(kvcache, XO.INDEXER_FP4_BYTES * page_size), loc, page_size, data)
    else:
        XO._store_indexer_fp8(XO._pages(kvcache, XO.INDEXER_FP8_BYTES * page_size), loc, page_size, data)


def _old_fused_k_norm_rope_flashmla(kv, kv_weight, freqs_cis, positions, out_loc, kvcache, eps, page_size):  # noqa: ANN001, ANN202
    loc = out_loc.to(torch.int64)
    rows = torch.nonzero(loc >= 0).flatten()
    if rows.numel() == 0:
        return
    data = XO._rms_norm(kv[rows], kv_weight.to(kv.dtype), eps)
    freqs = freqs_cis[positions[rows].to(torch.int64)].float()
    XO._store_v4(XO._pages(kvcache, XO._v4_page_bytes(page_size)), loc[rows], page_size, data, freqs,
                round_nope_bf16=False)


def _old_fused_q_indexer_rope_hadamard_quant(q_input, q_fp8, weight, weights_out, weight_scale, freqs_cis,  # noqa: ANN001, ANN202
                                             positions):
    data = q_input.float()
    freqs = freqs_cis[positions.to(torch.int64)].float().unsqueeze(1)
    data = torch.cat([data[..., :XO.ROPE_DIM], XO._rope_pairs(data[..., XO.ROPE_DIM:], freqs)], dim=-1)
    data = _old_hadamard128(data)
    scale = torch.clamp(data.abs().amax(-1), min=XO.QUANT_EPS) / XO.FP8_MAX
    q_fp8.view(torch.uint8).copy_(XO._to_e4m3(data * (1.0 / scale).unsqueeze(-1)))
    w = weight.float() * torch.tensor(float(weight_scale), dtype=torch.float32, device=weight.device)
    weights_out.copy_((w * scale).unsqueeze(-1))


def _old_topk_transform(scores, seq_lens, page_table, out_page_indices, page_size, out_raw_indices=None):  # noqa: ANN001, ANN202
    bits = page_size.bit_length() - 1
    b, k = out_page_indices.shape
    dev = scores.device
    sl = seq_lens.to(torch.int64)
    cols = torch.arange(k, device=dev)
    raw = torch.where(cols[None, :] < sl[:, None], cols[None, :], -1).expand(b, k).clone()
    big = sl > k
    if bool(big.any()):
        rows = torch.nonzero(big).flatten()
        valid = torch.arange(scores.shape[1], device=dev)[None, :] < sl[rows, None]
        raw[rows] = IX._topk_select(IX.topk_order_key(scores[rows]), valid, k)
    pt = page_table.to(torch.int64)
    page = pt.gather(1, (raw.clamp(min=0) >> bits).clamp(max=pt.shape[1] - 1))
    out = torch.where(raw >= 0, (page << bits) | (raw & (page_size - 1)), -1)
    out_page_indices.copy_(out.to(out_page_indices.dtype))
    if out_raw_indices is not None:
        out_raw_indices.copy_(raw.to(out_raw_indices.dtype))


def _old_topk_transform_ragged(scores, seq_lens, out_indices, out_offsets, row_starts=None):  # noqa: ANN001, ANN202
    n, k = out_indices.shape
    dev = scores.device
    sl = seq_lens.to(torch.int64)
    off = out_offsets.to(torch.int64)
    starts = torch.zeros_like(sl) if row_starts is None else row_starts.to(torch.int64)
    cols = torch.arange(k, device=dev)
    pos = torch.where(cols[None, :] < sl[:, None], cols[None, :], -1).expand(n, k).clone()
    big = sl > k
    if bool(big.any()):
        rows = torch.nonzero(big).flatten()
        span = int(sl[rows].max())
        j = torch.arange(span, device=dev)
        idx = (starts[rows, None] + j[None, :]).clamp(0, scores.shape[1] - 1)
        keys = IX.topk_order_key(scores[rows].gather(1, idx))
        pos[rows] = IX._topk_select(keys, j[None, :] < sl[rows, None], k)
    out = torch.where(pos >= 0, pos + off[:, None], -1)
    out_indices.copy_(out.to(out_indices.dtype))


# ------------------------------------------------------------------------------------------------
# Inputs
# ------------------------------------------------------------------------------------------------
def _random_bytes(*shape: int, dtype: torch.dtype) -> torch.Tensor:
    """A buffer of random bytes viewed as dtype (NaN payloads, infinities and -0.0 included)."""
    size = torch.Size(shape).numel() * torch.empty(0, dtype=dtype).element_size()
    return torch.randint(0, 256, (size,), dtype=torch.uint8).view(dtype).view(*shape)


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and \
        torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))


def _decode_plan_bytes(seq: torch.Tensor, write: torch.Tensor, rp0: torch.Tensor, rp1: torch.Tensor) -> torch.Tensor:
    return XO._pack_words(torch.stack([seq, write, rp0, rp1], dim=1).to(torch.int64), CPU)


def _freqs(max_pos: int) -> torch.Tensor:
    ang = torch.arange(max_pos, dtype=torch.float64)[:, None] * (1e-4 ** (torch.arange(32) / 32.0))[None, :]
    return torch.stack([ang.cos(), ang.sin()], dim=-1).reshape(max_pos, 64).float()


def _run_both(new: Callable[..., Any], old: Callable[..., Any], args: list[Any],
              written: list[int]) -> None:
    """Call new and old on clones of args; every argument index in `written` must match byte for byte."""
    a = [x.clone() if isinstance(x, torch.Tensor) else x for x in args]
    b = [x.clone() if isinstance(x, torch.Tensor) else x for x in args]
    new(*a)
    old(*b)
    for i in written:
        assert _same_bits(a[i], b[i]), f"argument {i} differs"
    for i, x in enumerate(args):  # inputs not listed as written must be left alone by both
        if i not in written and isinstance(x, torch.Tensor):
            assert _same_bits(a[i], x) and _same_bits(b[i], x), f"input {i} modified"


# ------------------------------------------------------------------------------------------------
# 1. Equality with the replaced implementations
# ------------------------------------------------------------------------------------------------
def _compress_case(ratio: int, dtype: torch.dtype, keep_none: bool = False) -> list[Any]:
    hd, pages = 16, 7
    coff = 4 if ratio == 4 else 2
    b = 12
    buf = torch.randn(pages, ratio, coff * hd, dtype=torch.float32)
    kv_in = torch.randn(b, coff * hd).to(dtype)
    ape = torch.randn(8 if ratio == 4 else 128, hd).to(dtype)
    out = _random_bytes(b, hd, dtype=dtype)
    if ratio == 4:
        # seq lens at window boundaries: 4 (first window, no overlap half), 8, 0, 1, 5, 3, multiples of 4.
        seq = torch.tensor([4, 8, 0, 1, 5, 3, 12, 16, 7, 100, 9, 256])
        if keep_none:
            seq = seq | 1
    else:
        seq = torch.randint(1, 1000, (b,))
    write = torch.randperm(pages * ratio)[:b]  # distinct slots (the state scatter is the same call in both)
    if ratio == 128:
        # rows that fill the last slot of a page (127 mod 128) compress; also -1 (a wrapped slot) does not
        write[:6] = torch.tensor([127, 255, 3 * 128 + 127, 128, -1, 6 * 128 + 127])
        if keep_none:
            write[[0, 1, 2, 5]] = torch.tensor([5, 6, 7, 8])
    rp0 = torch.randint(-3, pages + 3, (b,))  # out-of-range pages are clamped by both
    rp1 = torch.randint(-3, pages + 3, (b,))
    return [buf, kv_in, out, ape, _decode_plan_bytes(seq, write, rp0, rp1)]


@pytest.mark.parametrize("keep_none", [False, True])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("ratio", [4, 128])
def test_flash_compress_decode_equal(ratio: int, dtype: torch.dtype, keep_none: bool) -> None:
    new, old = ((X.flash_compress4_decode, _old_flash_compress4_decode) if ratio == 4
                else (X.flash_compress128_decode, _old_flash_compress128_decode))
    args = _compress_case(ratio, dtype, keep_none)
    _run_both(new, old, args, written=[0, 2])
    # The test can fail: the output rows that compress do change.
    out = args[2].clone()
    new(args[0].clone(), args[1], out, args[3], args[4])
    assert _same_bits(out, args[2]) == keep_none


def _store_case(hd: int, ratio: int, use_fp4: bool, keep_none: bool) -> list[Any]:
    page_size, n_pages, b = 16, 5, 10
    if hd == 512:
        page_bytes = XO._v4_page_bytes(page_size)
    else:
        page_bytes = (XO.INDEXER_FP4_BYTES if use_fp4 else XO.INDEXER_FP8_BYTES) * page_size
    kv = torch.randn(b, hd).to(torch.bfloat16)
    # seq lens: multiples of the ratio compress (0 included: its rope row wraps like Python indexing)
    seq = torch.tensor([ratio, 2 * ratio, ratio + 1, 3, 0, 5 * ratio, 7, 9 * ratio, 1, ratio - 1])
    if keep_none:
        seq = torch.tensor([1, 2, 3, ratio + 1, ratio - 1, 2 * ratio + 1, 5, 6, 7, 9])
    keep = seq % ratio == 0
    kv[~keep] = _random_bytes(int((~keep).sum()), hd, dtype=torch.bfloat16)  # garbage rows (uninitialized out)
    slots = torch.randperm(n_pages * page_size - 1)[:b]
    out_loc = torch.where(keep, slots, torch.tensor([-7, 10**9, -1, 3, 2**40, -5, 0, 1, 2, 4])[:b])
    out_loc[4] = -1  # a compressing row at loc -1: Python's wrap-around puts it in the last slot, in both
    # (the last slot is kept out of `slots`, so no other row writes it)
    plan = _decode_plan_bytes(seq, torch.randint(-5, 5, (b,)), torch.randint(-5, 5, (b,)), torch.randint(-5, 5, (b,)))
    cache = torch.randint(0, 256, (n_pages, page_bytes), dtype=torch.uint8)
    w = (torch.randn(hd) * 0.3 + 1).float()
    return [kv, plan, w, 1e-6, _freqs(1100), out_loc, cache, True, ratio, page_size, use_fp4]


@pytest.mark.parametrize("keep_none", [False, True])
@pytest.mark.parametrize(("hd", "ratio", "use_fp4"), [(512, 4, False), (512, 128, False), (128, 4, False),
                                                      (128, 4, True)])
def test_compress_norm_rope_store_decode_equal(hd: int, ratio: int, use_fp4: bool, keep_none: bool) -> None:
    args = _store_case(hd, ratio, use_fp4, keep_none)
    _run_both(X.compress_norm_rope_store, _old_compress_norm_rope_store_decode, args, written=[6])
    cache = args[6].clone()
    X.compress_norm_rope_store(*args[:6], cache, *args[7:])
    assert _same_bits(cache, args[6]) == keep_none  # a compressing row does write


@pytest.mark.parametrize("all_negative", [False, True])
def test_fused_k_norm_rope_flashmla_equal(all_negative: bool) -> None:
    page_size, n_pages, b = 16, 4, 9
    kv = torch.randn(b, 300 + 512).to(torch.bfloat16)[:, 300:]  # strided rows, as SGLang's qkv slice
    pos = torch.randint(0, 1000, (b,))
    pos[2] = -3  # a negative position wraps (Python indexing), in both
    out_loc = torch.randperm(n_pages * page_size)[:b].to(torch.int32)
    out_loc[[0, 4, 5]] = torch.tensor([-1, -100, -2], dtype=torch.int32)  # skipped rows, first row included
    if all_negative:
        out_loc = -out_loc.abs() - 1
    cache = torch.randint(0, 256, (n_pages, XO._v4_page_bytes(page_size)), dtype=torch.uint8)
    args = [kv, (torch.randn(512) * 0.3 + 1).to(torch.bfloat16), _freqs(1000), pos, out_loc, cache, 1e-6, page_size]
    _run_both(X.fused_k_norm_rope_flashmla, _old_fused_k_norm_rope_flashmla, args, written=[5])


def test_fused_q_indexer_rope_hadamard_quant_equal() -> None:
    b, h = 5, 8
    q = torch.randn(b, h, 128).to(torch.bfloat16)
    args = [q, _random_bytes(b, h, 128, dtype=torch.float8_e4m3fn), torch.randn(b, h).to(torch.bfloat16),
            _random_bytes(b, h, 1, dtype=torch.float32), 0.0883883461356163, _freqs(600),
            torch.randint(0, 600, (b,))]
    _run_both(X.fused_q_indexer_rope_hadamard_quant, _old_fused_q_indexer_rope_hadamard_quant, args,
              written=[1, 3])


def _topk_scores(b: int, width: int) -> torch.Tensor:
    s = torch.randn(b, width)
    s[:, ::7] = 0.5  # ties
    s[1, :] = 1.0  # a row of equal scores
    s[2, 3] = float("-inf")
    s[3, ::5] = -0.0
    return s


@pytest.mark.parametrize("with_raw", [False, True])
def test_topk_transform_equal(with_raw: bool) -> None:
    b, k, width, page_size = 8, 16, 100, 8
    # seq lens: 0, 1, k (all taken in order), k + 1 (smallest selecting row), width, past width, negative
    sl = torch.tensor([0, 1, k, k + 1, width, width + 30, -4, 57], dtype=torch.int32)
    page_table = torch.randint(0, 50, (b, 13), dtype=torch.int32)
    out = torch.randint(-9, 9, (b, k), dtype=torch.int32)
    raw = torch.randint(-9, 9, (b, k), dtype=torch.int32) if with_raw else None
    args = [_topk_scores(b, width), sl, page_table, out, page_size, raw]
    _run_both(X.topk_transform, _old_topk_transform, args, written=[3, 5] if with_raw else [3])
    # Also through the registered op SGLang calls (torch.ops.sgl_kernel.topk_transform).
    a = [x.clone() if isinstance(x, torch.Tensor) else x for x in args]
    torch.ops.sgl_kernel.topk_transform(*a)
    ref = [x.clone() if isinstance(x, torch.Tensor) else x for x in args]
    _old_topk_transform(*ref)
    assert _same_bits(a[3], ref[3])


@pytest.mark.parametrize("ties", [False, True])
@pytest.mark.parametrize("with_starts", [False, True])
def test_topk_transform_ragged_equal(with_starts: bool, ties: bool) -> None:
    """Bit-identical on distinct scores. With tied scores torch.topk orders (and, at the k-th value,
    picks) equal keys differently for different row widths -- the old code selected over the widest
    selecting window, the new one over the whole row -- so there the picks are compared as the
    multiset of scores chosen per row (upstream leaves the order and the tie choice unspecified)."""
    n, k, width = 9, 16, 120
    sl = torch.tensor([0, 1, k, k + 1, 40, 100, -3, 90, 17], dtype=torch.int32)
    starts = torch.tensor([0, 5, 30, 103, 80, 20, 7, 30, 0], dtype=torch.int32) if with_starts else None
    if starts is None:
        sl[5] = width  # a window that ends exactly at the row's end
    else:
        assert bool(((starts + sl.clamp(min=0)) <= width).all())  # windows inside their rows (the contract)
        sl[7] = width - 30  # ends exactly at the row's end
    scores = _topk_scores(n, width) if ties else torch.randn(n, width)
    off = torch.randint(0, 1000, (n,), dtype=torch.int32)
    args = [scores, sl, torch.randint(-9, 9, (n, k), dtype=torch.int32), off, starts]
    if not ties:
        _run_both(X.topk_transform_ragged, _old_topk_transform_ragged, args, written=[2])
        return
    new, old = args[2].clone(), args[2].clone()
    X.topk_transform_ragged(scores, sl, new, off, starts)
    _old_topk_transform_ragged(scores, sl, old, off, starts)
    base = (starts if starts is not None else torch.zeros_like(off)).long() - off.long()

    def picked(out: torch.Tensor, r: int) -> torch.Tensor:
        cols = out[r][out[r] >= 0].long() + base[r]
        return scores[r, cols].sort().values

    for r in range(n):
        assert torch.equal((new[r] >= 0), (old[r] >= 0)), f"row {r}: -1 padding differs"
        assert torch.equal(picked(new, r), picked(old, r)), f"row {r}: picked scores differ"
        assert new[r][new[r] >= 0].unique().numel() == int((new[r] >= 0).sum()), f"row {r}: repeated pick"


# Requests (seq_len, extend_len): chunked prefill and speculative-verify-like short extends, windows
# and pages crossed, a request that starts at 0.
_PAIRS = [(37, 37), (70, 9), (9, 1), (300, 129), (256, 256), (132, 4), (8, 4)]


def _prefill_ctx(ratio: int, ring: int, identity: bool = False) -> tuple[torch.Tensor, ...]:
    """(req_pool_indices, req_to_token, full_to_swa, seq_lens, extend_lens, swa_page_size): permuted
    tables, or with `identity` request r's token p at SWA slot 512 r + p, which gives every write
    event its own state slot (ratio 4: 64 pages of 4 slots; ratio 128: 8 pages of 128)."""
    b, sps = len(_PAIRS), 128
    if identity:
        r2t = torch.arange(8 * 512, dtype=torch.int32).reshape(8, 512)
        f2s = torch.arange(8 * 512)
    else:
        r2t = torch.randperm(8 * 512).reshape(8, 512).to(torch.int32)
        f2s = torch.randperm(8 * 512 + 7)[: 8 * 512]
    seq = torch.tensor([s for s, _ in _PAIRS])
    ext = torch.tensor([e for _, e in _PAIRS])
    return torch.randperm(8)[:b], r2t, f2s, seq, ext, sps


def _invalid_padded(plan: torch.Tensor, rows: int, invalid: bytes) -> torch.Tensor:
    pad = torch.tensor(list(invalid) * (rows - plan.shape[0]), dtype=torch.uint8).view(-1, plan.shape[1])
    return torch.cat([plan, pad])


@pytest.mark.parametrize(("ratio", "ring"), [(4, 8), (4, 16), (128, 128)])
def test_padded_prefill_planner_equal(ratio: int, ring: int) -> None:
    """The padded plan (built in fixed shapes) = the compacted host plan + invalid rows, byte for byte."""
    rid, r2t, f2s, seq, ext, sps = _prefill_ctx(ratio, ring)
    n = int(ext.sum())
    host_c, host_w = X.plan_compress_prefill(rid, r2t, f2s, seq, ext, torch.empty(0), n, ratio, sps, ring, False)
    pad_c, pad_w = X.plan_compress_prefill(rid, r2t, f2s, seq, ext, torch.empty(0), n, ratio, sps, ring, True)
    assert host_c.shape[0] < n and host_w.shape[0] < n  # there is padding to check
    assert torch.equal(pad_c, _invalid_padded(host_c, n, b"\xff" * 4 + b"\x00" * 4 + b"\xff" * 8))
    assert torch.equal(pad_w, _invalid_padded(host_w, n, b"\xff" * 8))
    leg_c, leg_w = X.plan_compress_prefill_legacy(rid, seq, ext, torch.empty(0), n, ratio, False)
    lpad_c, lpad_w = X.plan_compress_prefill_legacy(rid, seq, ext, torch.empty(0), n, ratio, True)
    assert torch.equal(lpad_c, _invalid_padded(leg_c, n, b"\xff" * 4 + b"\x00" * 4 + b"\xff" * 8))
    assert torch.equal(lpad_w, _invalid_padded(leg_w, n, b"\xff" * 8))


def _prefill_compress_case(ratio: int, dtype: torch.dtype, none_valid: bool) -> list[Any]:
    hd, pages = 16, 64 if ratio == 4 else 8
    coff = 4 if ratio == 4 else 2
    ring = 8 if ratio == 4 else 128
    rid, r2t, f2s, seq, ext, sps = _prefill_ctx(ratio, ring, identity=True)
    n = int(ext.sum())
    plan_c, plan_w = X.plan_compress_prefill(rid, r2t, f2s, seq, ext, torch.empty(0), n, ratio, sps, ring, True)
    w_valid, _, w_loc = XO._write_plan(plan_w)
    # Distinct slots per write (with duplicates the winner would depend on scatter order, in both).
    assert w_loc[w_valid].unique().numel() == int(w_valid.sum()) and int(w_loc[w_valid].max()) < pages * ratio
    if none_valid:
        plan_c = torch.tensor(list(b"\xff" * 4 + b"\x00" * 4 + b"\xff" * 8) * n, dtype=torch.uint8).view(n, 16)
        plan_w = torch.tensor(list(b"\xff" * 8) * n, dtype=torch.uint8).view(n, 8)
    buf = torch.randn(pages, ratio, coff * hd, dtype=torch.float32)
    return [buf, torch.randn(n, coff * hd).to(dtype), _random_bytes(n, hd, dtype=dtype),
            torch.randn(8 if ratio == 4 else 128, hd).to(dtype), plan_c, plan_w]


@pytest.mark.parametrize("budget", ["masked", "compacted"])
@pytest.mark.parametrize("none_valid", [False, True])
@pytest.mark.parametrize("ratio", [4, 128])
def test_flash_compress_prefill_equal(ratio: int, none_valid: bool, budget: str,
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """Padded plans (invalid rows) as target verify builds them; both the masked (fixed-shape) path
    and the compacting path taken for plans above _MASKED_WINDOW_BYTES."""
    if budget == "compacted":
        monkeypatch.setattr(XO, "_MASKED_WINDOW_BYTES", 0)
    new, old = ((X.flash_compress4_prefill, _old_flash_compress4_prefill) if ratio == 4
                else (X.flash_compress128_prefill, _old_flash_compress128_prefill))
    args = _prefill_compress_case(ratio, torch.bfloat16, none_valid)
    _run_both(new, old, args, written=[0, 2])


@pytest.mark.parametrize(("hd", "use_fp4"), [(512, False), (128, False), (128, True)])
def test_compress_norm_rope_store_prefill_equal(hd: int, use_fp4: bool) -> None:
    page_size, n_pages, ratio = 16, 30, 4
    page_bytes = XO._v4_page_bytes(page_size) if hd == 512 else \
        (XO.INDEXER_FP4_BYTES if use_fp4 else XO.INDEXER_FP8_BYTES) * page_size
    rid, r2t, f2s, seq, ext, sps = _prefill_ctx(ratio, 8)
    n = int(ext.sum())
    plan_c, _ = X.plan_compress_prefill(rid, r2t, f2s, seq, ext, torch.empty(0), n, ratio, sps, 8, True)
    valid = XO._compress_plan(plan_c)[0]
    kv = torch.randn(n, hd).to(torch.bfloat16)
    kv[~valid] = _random_bytes(int((~valid).sum()), hd, dtype=torch.bfloat16)  # padding rows: garbage
    out_loc = torch.randperm(n_pages * page_size)[:n]  # indexed by ragged id
    cache = torch.randint(0, 256, (n_pages, page_bytes), dtype=torch.uint8)
    args = [kv, plan_c, (torch.randn(hd) * 0.3 + 1).float(), 1e-6, _freqs(600), out_loc, cache, False, ratio,
            page_size, use_fp4]
    _run_both(X.compress_norm_rope_store, _old_compress_norm_rope_store_prefill, args, written=[6])


# ------------------------------------------------------------------------------------------------
# 2. Capturability proxy
# ------------------------------------------------------------------------------------------------
def _decode_planner_args(ratio: int) -> list[Any]:
    b = 6
    return [torch.randperm(8)[:b], torch.randint(0, 4096, (8, 512), dtype=torch.int32),
            torch.randint(0, 2048, (4096,), dtype=torch.int64), torch.randint(1, 400, (b,)), ratio, 256,
            8 if ratio == 4 else 128]


def _mhc_args() -> dict[str, list[Any]]:
    t, hc, h = 3, 4, 64
    mix = (2 + hc) * hc
    common = [torch.randn(mix, hc * h), torch.randn(3), torch.randn(mix), 1e-6, 1e-6, 1e-6, 2.0, 3]
    return {
        "hc_split_sinkhorn": [torch.randn(1, t, mix), torch.randn(3), torch.randn(mix), hc, 3, 1e-6],
        "mhc_pre": [torch.randn(t, hc, h).to(torch.bfloat16), *common],
        "hc_post": [torch.randn(t, h).to(torch.bfloat16), torch.randn(t, hc, h).to(torch.bfloat16),
                    torch.rand(t, hc), torch.rand(t, hc, hc)],
        "mhc_fused_post_pre": [torch.randn(t, h).to(torch.bfloat16), torch.randn(t, hc, h).to(torch.bfloat16),
                               torch.rand(t, hc, 1), torch.rand(t, hc, hc), *common],
        "fused_hc_head": [torch.randn(t, hc, h).to(torch.bfloat16), torch.randn(hc, hc * h), torch.randn(1),
                          torch.randn(hc), 1e-6, 1e-6],
    }


def _graph_safe_calls() -> dict[str, tuple[Callable[..., Any], list[Any]]]:
    """Every function SGLang's DeepSeek-V4 decode forward calls from these shims, with CPU example args."""
    calls: dict[str, tuple[Callable[..., Any], list[Any]]] = {
        "plan_compress_decode[4]": (X.plan_compress_decode, _decode_planner_args(4)),
        "plan_compress_decode[128]": (X.plan_compress_decode, _decode_planner_args(128)),
        "plan_compress_decode_legacy": (X.plan_compress_decode_legacy,
                                        [torch.arange(5), torch.randint(1, 300, (5,)), 4]),
        "flash_compress4_decode": (X.flash_compress4_decode, _compress_case(4, torch.bfloat16)),
        "flash_compress128_decode": (X.flash_compress128_decode, _compress_case(128, torch.bfloat16)),
        "compress_norm_rope_store[v4]": (X.compress_norm_rope_store, _store_case(512, 4, False, False)),
        "compress_norm_rope_store[fp8]": (X.compress_norm_rope_store, _store_case(128, 4, False, False)),
        "compress_norm_rope_store[fp4]": (X.compress_norm_rope_store, _store_case(128, 4, True, False)),
        "fused_k_norm_rope_flashmla": (X.fused_k_norm_rope_flashmla, [
            torch.randn(4, 512).to(torch.bfloat16), torch.randn(512).to(torch.bfloat16), _freqs(64),
            torch.arange(4), torch.tensor([3, -1, 9, 2]), torch.zeros(2, XO._v4_page_bytes(16), dtype=torch.uint8),
            1e-6, 16]),
        "fused_q_norm_rope": (X.fused_q_norm_rope, [torch.randn(3, 4, 512).to(torch.bfloat16),
                                                    torch.empty(3, 4, 512, dtype=torch.bfloat16), _freqs(64),
                                                    torch.arange(3), 1e-6]),
        "fused_q_indexer_rope_hadamard_quant": (X.fused_q_indexer_rope_hadamard_quant, [
            torch.randn(3, 4, 128).to(torch.bfloat16), torch.empty(3, 4, 128, dtype=torch.float8_e4m3fn),
            torch.randn(3, 4), torch.empty(3, 4, 1), 0.5, _freqs(64), torch.arange(3)]),
        "topk_transform": (X.topk_transform, [torch.randn(4, 40), torch.tensor([3, 20, 40, 0]),
                                              torch.randint(0, 9, (4, 5), dtype=torch.int32),
                                              torch.empty(4, 8, dtype=torch.int32), 8,
                                              torch.empty(4, 8, dtype=torch.int32)]),
        "torch.ops.sgl_kernel.topk_transform": (torch.ops.sgl_kernel.topk_transform, [
            torch.randn(4, 40), torch.tensor([3, 20, 40, 0]), torch.randint(0, 9, (4, 5), dtype=torch.int32),
            torch.empty(4, 8, dtype=torch.int32), 8, None]),
        "torch.ops.sgl_kernel.topk_transform_paged": (torch.ops.sgl_kernel.topk_transform_paged, [
            torch.randn(4, 40), torch.tensor([3, 20, 40, 0]), torch.randint(0, 9, (4, 5), dtype=torch.int32),
            torch.empty(4, 8, dtype=torch.int32), 8, torch.empty(0, dtype=torch.int32)]),
        "torch.ops.sgl_kernel.topk_transform_ragged": (torch.ops.sgl_kernel.topk_transform_ragged, [
            torch.randn(4, 40), torch.tensor([3, 20, 30, 0]), torch.empty(4, 8, dtype=torch.int32),
            torch.arange(4), torch.tensor([0, 5, 10, 0])]),
        # SGLang's dsv4.topk functions (kernels_triton.indexer; torch path here, Triton on CUDA: see
        # test_topk_triton_wrapper_is_capturable)
        "indexer.topk_transform_paged": (IX.topk_transform_paged, [
            torch.randn(4, 40), torch.tensor([3, 20, 40, 0]), torch.randint(0, 9, (4, 5), dtype=torch.int32),
            torch.empty(4, 8, dtype=torch.int32), 8, torch.empty(4, 8, dtype=torch.int32)]),
        "indexer.topk_transform_paged_v2[raw]": (IX.topk_transform_paged_v2, [
            torch.randn(4, 40), torch.tensor([3, 20, 40, 0]), None, torch.empty(4, 8, dtype=torch.int32), 8,
            torch.empty(5, 2, dtype=torch.int32)]),
        "indexer.topk_transform_ragged_v2": (
            lambda s, sl, off, out, st: IX.topk_transform_ragged_v2(s, sl, out_offsets=off, out_indices=out,
                                                                    row_starts=st),
            [torch.randn(4, 40), torch.tensor([3, 20, 30, 0]), torch.arange(4), torch.empty(4, 8, dtype=torch.int32),
             torch.tensor([0, 5, 10, 0])]),
        "fused_store_cache_v4": (X.fused_store_cache_v4, [torch.randn(3, 512), torch.zeros(
            2, XO._v4_page_bytes(16), dtype=torch.uint8), torch.tensor([1, 5, 20]), 16]),
        "fused_store_cache_indexer": (X.fused_store_cache_indexer, [torch.randn(3, 128), torch.zeros(
            2, XO.INDEXER_FP8_BYTES * 16, dtype=torch.uint8), torch.tensor([1, 5, 20]), 16]),
        "deep_gemm.get_paged_mqa_logits_metadata": (deep_gemm.get_paged_mqa_logits_metadata, [
            torch.tensor([[5], [300], [0], [64]], dtype=torch.int32), 64, 8]),
        "deep_gemm.fp8_paged_mqa_logits[torch]": (deep_gemm.fp8_paged_mqa_logits, [
            torch.randn(2, 1, 4, 128).to(torch.float8_e4m3fn), torch.zeros(3, 64, 1, 132, dtype=torch.uint8),
            torch.randn(2, 4), torch.tensor([[70], [5]], dtype=torch.int32),
            torch.tensor([[0, 2], [1, 0]], dtype=torch.int32), torch.empty(9, 2, dtype=torch.int32), 128]),
    }
    calls["deep_gemm.fp8_fp4_paged_mqa_logits[torch,fp4]"] = (deep_gemm.fp8_fp4_paged_mqa_logits, [
        (torch.randint(-128, 127, (2, 1, 4, 64), dtype=torch.int8), torch.randint(0, 2**30, (2, 1, 4), dtype=torch.int32)),
        torch.randint(0, 255, (3, 64, 1, 68), dtype=torch.uint8), torch.randn(2, 4),
        torch.tensor([[70], [5]], dtype=torch.int32), torch.tensor([[0, 2], [1, 0]], dtype=torch.int32),
        torch.empty(9, 2, dtype=torch.int32), 128])
    rid, r2t, f2s, seq, ext, sps = _prefill_ctx(4, 16)
    n = int(ext.sum())
    calls["plan_compress_prefill[padded,4]"] = (X.plan_compress_prefill, [
        rid, r2t, f2s, seq, ext, torch.empty(0, dtype=torch.uint8), n, 4, sps, 16, True])
    calls["plan_compress_prefill[padded,128]"] = (X.plan_compress_prefill, [
        rid, r2t, f2s, seq, ext, torch.empty(0, dtype=torch.uint8), n, 128, sps, 128, True])
    calls["plan_compress_prefill_legacy[padded]"] = (X.plan_compress_prefill_legacy, [
        rid, seq, ext, torch.empty(0, dtype=torch.uint8), n, 4, True])
    calls["flash_compress4_prefill"] = (X.flash_compress4_prefill, _prefill_compress_case(4, torch.bfloat16, False))
    calls["flash_compress128_prefill"] = (X.flash_compress128_prefill,
                                          _prefill_compress_case(128, torch.bfloat16, False))
    plan_c = X.plan_compress_prefill(rid, r2t, f2s, seq, ext, torch.empty(0), n, 4, sps, 16, True)[0]
    calls["compress_norm_rope_store[prefill plan]"] = (X.compress_norm_rope_store, [
        torch.randn(n, 512).to(torch.bfloat16), plan_c, torch.randn(512), 1e-6, _freqs(600),
        torch.randperm(30 * 16)[:n], torch.zeros(30, XO._v4_page_bytes(16), dtype=torch.uint8), False, 4, 16])
    for name, args in _mhc_args().items():
        calls[name] = (getattr(X, name), args)
    return calls


@pytest.mark.parametrize("name", sorted(_graph_safe_calls()))
def test_decode_function_is_capturable(name: str) -> None:
    fn, args = _graph_safe_calls()[name]
    fn(*[a.clone() if isinstance(a, torch.Tensor) else a for a in args])  # the example is a valid call
    _run_on_meta(fn, *args)


class _NoLaunch:
    """Stands in for a Triton kernel: `kernel[grid](...)` does nothing (meta tensors have no pointers)."""

    def __getitem__(self, grid: Any) -> Callable[..., None]:
        return lambda *a, **k: None


def test_e2m1_values_match_the_table() -> None:
    """The indexer's FP4 dequantization computes e2m1 values on the device instead of copying the table there."""
    from kernels_triton.formats import E2M1_VALUES
    from kernels_triton.formats.codecs import e2m1_decode

    got = e2m1_decode(torch.arange(16))
    assert _same_bits(got, torch.tensor(E2M1_VALUES, dtype=torch.float32))  # -0.0 included
    assert _run_on_meta(e2m1_decode, torch.arange(16)).device.type == "meta"


def test_indexer_triton_wrapper_is_capturable(monkeypatch: pytest.MonkeyPatch) -> None:
    """The CUDA path of deep_gemm.fp8_paged_mqa_logits: the host code around the Triton launch."""
    monkeypatch.setattr(IX, "_mqa_logits_kernel", _NoLaunch())
    out = _run_on_meta(IX.paged_mqa_logits_triton, torch.randn(2, 1, 4, 128).to(torch.float8_e4m3fn),
                       torch.zeros(3, 64, 1, 132, dtype=torch.uint8), torch.randn(2, 4),
                       torch.tensor([[70], [5]], dtype=torch.int32), torch.tensor([[0, 2], [1, 0]], dtype=torch.int64),
                       128)
    assert out.shape == (2, 128) and out.device.type == "meta"


@pytest.mark.parametrize("mode", ["paged", "raw", "ragged", "strided_out"])
def test_topk_triton_wrapper_is_capturable(mode: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The CUDA path of every top-k transform (dsv4_xpu's ops and kernels_triton.indexer's functions):
    the host code around the one kernel launch reads shapes only."""
    grids = []

    class _Recorded(_NoLaunch):
        def __getitem__(self, grid: Any) -> Callable[..., None]:
            grids.append(grid)
            return super().__getitem__(grid)

    monkeypatch.setattr(IX, "_topk_transform_kernel", _Recorded())
    out = torch.empty(3, 16, dtype=torch.int32)
    kw: dict[str, Any] = {}
    if mode == "paged":
        kw = {"page_table": torch.zeros(3, 5, dtype=torch.int32), "page_size": 64,
              "out_raw": torch.empty(3, 16, dtype=torch.int64), "neg_inf_pad": True}
    elif mode == "ragged":
        kw = {"offsets": torch.arange(3), "row_starts": torch.tensor([0, 0, 10])}
    elif mode == "strided_out":  # written through a contiguous buffer, then copied back
        out = torch.empty(16, 3, dtype=torch.int32).t()
    _run_on_meta(IX.topk_transform_triton, torch.randn(3, 300), torch.tensor([5, 300, 40], dtype=torch.int32),
                 out, **kw)
    assert len(grids) == 1 and grids[0] == (3,)


_OLD = {
    "flash_compress4_decode": (_old_flash_compress4_decode, "flash_compress4_decode"),
    "flash_compress128_decode": (_old_flash_compress128_decode, "flash_compress128_decode"),
    "compress_norm_rope_store": (_old_compress_norm_rope_store_decode, "compress_norm_rope_store[v4]"),
    "fused_k_norm_rope_flashmla": (_old_fused_k_norm_rope_flashmla, "fused_k_norm_rope_flashmla"),
    "fused_q_indexer_rope_hadamard_quant": (_old_fused_q_indexer_rope_hadamard_quant,
                                            "fused_q_indexer_rope_hadamard_quant"),
    "topk_transform": (_old_topk_transform, "topk_transform"),
    "topk_transform_ragged": (_old_topk_transform_ragged, "torch.ops.sgl_kernel.topk_transform_ragged"),
    "flash_compress4_prefill": (_old_flash_compress4_prefill, "flash_compress4_prefill"),
    "flash_compress128_prefill": (_old_flash_compress128_prefill, "flash_compress128_prefill"),
    "compress_norm_rope_store_prefill": (_old_compress_norm_rope_store_prefill,
                                         "compress_norm_rope_store[prefill plan]"),
}


@pytest.mark.parametrize("name", sorted(_OLD))
def test_proxy_catches_the_old_implementations(name: str) -> None:
    old, example = _OLD[name]
    _, args = _graph_safe_calls()[example]
    # (the equality tests run the same old code on CPU: it is a valid call there)
    with pytest.raises(RuntimeError, match="graph proxy"):  # nonzero, .item() or torch.tensor(device=...)
        _run_on_meta(old, *args)


def test_proxy_catches_host_to_device_copies() -> None:
    with pytest.raises(RuntimeError, match="graph proxy"):
        _run_on_meta(lambda x: x + torch.tensor(1.0, device=x.device), torch.ones(2))
    with pytest.raises(RuntimeError, match="graph proxy"):
        _run_on_meta(lambda x: x + torch.ones(2).to(x.device), torch.ones(2))
    with pytest.raises(RuntimeError, match="graph proxy"):
        _run_on_meta(lambda x: x.copy_(torch.ones(2)), torch.ones(2))


def test_unpadded_prefill_planner_is_not_capturable() -> None:
    """The unpadded prefill plan has a data-dependent row count, so it is built on the host (and the
    padded path used the same host code before): the proxy rejects it. SGLang asks for it only in
    eager prefill (seq_lens on the host, use_cuda_graph False)."""
    rid, r2t, f2s, seq, ext, sps = _prefill_ctx(4, 8)
    n = int(ext.sum())
    with pytest.raises((RuntimeError, NotImplementedError), match="graph proxy|meta"):
        with _graph_capture_proxy():  # host lengths, device tables: the tables are copied to the host
            X.plan_compress_prefill(_meta(rid), _meta(r2t), _meta(f2s), seq, ext, torch.empty(0), n, 4, sps, 8, False)
