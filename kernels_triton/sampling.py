"""Sampling (sgl_kernel top_k_renorm_prob / top_p_renorm_prob, flashinfer.sampling softmax,
top_k/top_p/min_p renorm and sampling from probs or logits).

Filtering follows FlashInfer's semantics: top-k keeps every token whose probability is >= the k-th
largest (ties may keep more than k); top-p keeps the tokens whose ascending cumulative mass is
>= 1 - p; min-p keeps probs >= min_p * max prob; "joint" intersects the top-k and top-p masks of the
original distribution, "top_k_first" applies top-p to the top-k-renormalized distribution.
Sampling draws one uniform per row from the caller's torch.Generator and inverts the CDF of the
filtered distribution, so the same generator state gives the same tokens on the logits and the
probs entry points. FlashInfer's own RNG (Philox inside its kernel) is not reproducible here; tests
check support and distribution, as upstream's do.

Filtering and sampling are torch on every device (a sort + cumsum per row: a few launches on a
[batch, 129280] fp32 tensor, small next to the LM head that produced it). Softmax with a per-row
temperature has a Triton kernel (two streaming passes per row), used by DSpark's accept step.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _softmax_kernel(x_ptr, t_ptr, out_ptr, n_cols, x_stride, out_stride, temp_scalar,
                    HAS_T: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    if HAS_T:
        inv_t = 1.0 / tl.load(t_ptr + row).to(tl.float32)
    else:
        inv_t = 1.0 / temp_scalar
    m = tl.full([BLOCK], float("-inf"), tl.float32)
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for start in range(0, n_cols, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        x = tl.load(x_ptr + row * x_stride + cols, mask=cols < n_cols, other=float("-inf")).to(tl.float32)
        x = x * inv_t
        new_m = tl.maximum(m, x)
        new_m_safe = tl.where(new_m == float("-inf"), 0.0, new_m)
        acc = acc * tl.exp(m - new_m_safe) + tl.exp(x - new_m_safe)
        m = new_m
    row_m = tl.max(m, axis=0)
    row_sum = tl.sum(acc * tl.exp(m - row_m), axis=0)
    for start in range(0, n_cols, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        cm = cols < n_cols
        x = tl.load(x_ptr + row * x_stride + cols, mask=cm, other=float("-inf")).to(tl.float32) * inv_t
        tl.store(out_ptr + row * out_stride + cols, tl.exp(x - row_m) / row_sum, mask=cm)


def softmax_triton(logits: torch.Tensor, temperature: torch.Tensor | float | None, out: torch.Tensor) -> None:
    """fp32 softmax(logits / temperature) per row into out."""
    b, v = logits.shape
    if b == 0:
        return
    assert logits.stride(1) == 1 and out.stride(1) == 1
    has_t = isinstance(temperature, torch.Tensor)
    t_arg = temperature.float().contiguous() if has_t else logits
    scalar = float(temperature) if (temperature is not None and not has_t) else 1.0
    _softmax_kernel[(b,)](logits, t_arg, out, v, logits.stride(0), out.stride(0), scalar, HAS_T=has_t,
                          BLOCK=min(4096, triton.next_power_of_2(v)))


def softmax_ref(logits: torch.Tensor, temperature: torch.Tensor | float | None) -> torch.Tensor:
    """torch reference."""
    x = logits.float()
    if isinstance(temperature, torch.Tensor):
        x = x / temperature.float().view(-1, 1)
    elif temperature is not None:
        x = x / float(temperature)
    return torch.softmax(x, dim=-1)


def _per_row(val: torch.Tensor | float | int, b: int, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    if isinstance(val, torch.Tensor):
        return val.to(device=device, dtype=dtype).reshape(-1).expand(b) if val.numel() == 1 else \
            val.to(device=device, dtype=dtype).reshape(b)
    return torch.full((b,), val, device=device, dtype=dtype)


def top_k_mask(probs: torch.Tensor, top_k: torch.Tensor | int) -> torch.Tensor:
    """bool [B, V]: prob >= the k-th largest prob of its row (k <= 0 or k >= V keeps all)."""
    b, v = probs.shape
    k = _per_row(top_k, b, probs.device, torch.int64)
    keep_all = (k <= 0) | (k >= v)
    srt = probs.sort(dim=-1, descending=True).values
    pivot = srt.gather(1, (k.clamp(1, v) - 1).view(-1, 1))
    return (probs >= pivot) | keep_all.view(-1, 1)


def top_p_mask(probs: torch.Tensor, top_p: torch.Tensor | float) -> torch.Tensor:
    """bool [B, V]: ascending cumulative mass >= 1 - p."""
    b, _ = probs.shape
    p = _per_row(top_p, b, probs.device, torch.float32)
    srt, idx = probs.sort(dim=-1, descending=False)
    cdf = srt.cumsum(dim=-1)
    keep_sorted = cdf >= (1.0 - p).view(-1, 1)
    return torch.zeros_like(keep_sorted).scatter_(1, idx, keep_sorted)


def min_p_mask(probs: torch.Tensor, min_p: torch.Tensor | float) -> torch.Tensor:
    """bool [B, V]: prob >= min_p * row max."""
    b, _ = probs.shape
    p = _per_row(min_p, b, probs.device, torch.float32)
    return probs >= p.view(-1, 1) * probs.amax(dim=-1, keepdim=True)


def renorm(probs: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """Zero the dropped tokens and renormalize each row (fp32)."""
    q = torch.where(keep, probs.float(), torch.zeros((), device=probs.device))
    return q / q.sum(dim=-1, keepdim=True)


def sample_from(q: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """Inverse-CDF sampling of each row of a non-negative (unnormalized) distribution -> int32 ids."""
    b, v = q.shape
    if b == 0:
        return torch.empty(0, dtype=torch.int32, device=q.device)
    u = torch.rand(b, generator=generator, device=q.device, dtype=torch.float32)
    cdf = q.float().cumsum(dim=-1)
    target = (u * cdf[:, -1]).view(-1, 1)
    idx = torch.searchsorted(cdf.contiguous(), target.contiguous(), right=True).view(-1)
    return idx.clamp_(0, v - 1).to(torch.int32)


def filter_top_k_top_p(probs: torch.Tensor, top_k: torch.Tensor | int, top_p: torch.Tensor | float,
                       order: str) -> torch.Tensor:
    """Filtered, unnormalized fp32 distribution for top_k_top_p sampling."""
    probs = probs.float()
    if order == "top_k_first":
        rk = renorm(probs, top_k_mask(probs, top_k))
        return torch.where(top_p_mask(rk, top_p), rk, torch.zeros((), device=probs.device))
    if order == "joint":
        keep = top_k_mask(probs, top_k) & top_p_mask(probs, top_p)
        return torch.where(keep, probs, torch.zeros((), device=probs.device))
    raise ValueError(f"Invalid filter_apply_order: {order}")
