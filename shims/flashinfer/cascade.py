"""Shim for `flashinfer.cascade`: merge_state (base-2 LSE, FlashInfer's convention)."""

from __future__ import annotations

import torch

from kernels_triton import merge_state as km
from kernels_triton._dispatch import use_triton
from shims._missing import missing_getattr


def merge_state(v_a: torch.Tensor, s_a: torch.Tensor, v_b: torch.Tensor,
                s_b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Replaces flashinfer.cascade.merge_state: v [N, H, D], s [N, H] fp32 log2-sum-exp -> (v, s)."""
    v = torch.empty_like(v_a)
    s = torch.empty(s_a.shape, dtype=torch.float32, device=s_a.device)
    if use_triton(v_a):
        km.merge_state_triton(v_a, s_a.float(), v_b, s_b.float(), v, s, base2=True)
        return v, s
    return km.merge_state_ref(v_a, s_a, v_b, s_b, base2=True)


__getattr__ = missing_getattr("flashinfer.cascade", "flashinfer-python")
