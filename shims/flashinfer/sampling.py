"""Shim for `flashinfer.sampling`: softmax, renorm and sampling entry points SGLang calls."""

from __future__ import annotations

import torch

from kernels_triton import sampling as ks
from kernels_triton._dispatch import use_triton
from shims._missing import missing_getattr
from shims.sgl_kernel._ops import (  # noqa: F401  (same semantics as FlashInfer's)
    min_p_sampling_from_probs,
    top_k_renorm_probs,
    top_k_top_p_sampling_from_probs,
    top_p_renorm_probs,
)


def softmax(logits: torch.Tensor, temperature: torch.Tensor | float | None = None,
            enable_pdl: bool | None = None) -> torch.Tensor:
    """Replaces flashinfer.sampling.softmax: fp32 softmax(logits / temperature) per row."""
    if use_triton(logits) and logits.dim() == 2 and logits.stride(1) == 1:
        out = torch.empty(logits.shape, dtype=torch.float32, device=logits.device)
        ks.softmax_triton(logits, temperature, out)
        return out
    return ks.softmax_ref(logits, temperature)


def sampling_from_probs(probs: torch.Tensor, indices: torch.Tensor | None = None, deterministic: bool = True,
                        generator: torch.Generator | None = None, check_nan: bool = False) -> torch.Tensor:
    """Replaces flashinfer.sampling.sampling_from_probs -> int32 token ids."""
    if indices is not None:
        probs = probs[indices.long()]
    if check_nan and torch.isnan(probs).any():
        raise ValueError("Input probs contains NaN.")
    return ks.sample_from(probs.float(), generator)


def sampling_from_logits(logits: torch.Tensor, indices: torch.Tensor | None = None, deterministic: bool = True,
                         generator: torch.Generator | None = None, check_nan: bool = False) -> torch.Tensor:
    """Replaces flashinfer.sampling.sampling_from_logits (softmax then sampling_from_probs)."""
    return sampling_from_probs(softmax(logits), indices, deterministic, generator, check_nan)


def top_k_top_p_sampling_from_logits(logits: torch.Tensor, top_k: torch.Tensor | int, top_p: torch.Tensor | float,
                                     indices: torch.Tensor | None = None, filter_apply_order: str = "top_k_first",
                                     deterministic: bool = True, generator: torch.Generator | None = None,
                                     check_nan: bool = False) -> torch.Tensor:
    """Replaces flashinfer.sampling.top_k_top_p_sampling_from_logits (same tokens as the probs
    entry point given the same generator state, as upstream's alignment tests require)."""
    return top_k_top_p_sampling_from_probs(softmax(logits), top_k, top_p, indices, filter_apply_order,
                                           deterministic, generator, check_nan)


__getattr__ = missing_getattr("flashinfer.sampling", "flashinfer-python")
