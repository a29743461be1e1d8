"""Shim for `sgl_kernel.quantization`: the GGUF (ggml) dequantize and matmul entry points."""

from __future__ import annotations

import torch

from kernels_triton import ggml
from shims._missing import missing_getattr


def ggml_dequantize(W: torch.Tensor, quant_type: int, m: int, n: int,
                    dtype: torch.dtype | None = None) -> torch.Tensor:
    """Replaces sgl_kernel.quantization.ggml_dequantize: uint8 GGML blocks -> [m, n] (default fp16)."""
    return ggml.dequantize(W, int(quant_type), int(m), int(n), dtype)


def ggml_mul_mat_vec_a8(W: torch.Tensor, X: torch.Tensor, quant_type: int, row: int) -> torch.Tensor:
    """Replaces sgl_kernel.quantization.ggml_mul_mat_vec_a8: X [T, K] @ dequant(W [row, bytes]).T."""
    return ggml.mul_mat(W, X, int(quant_type), int(row))


def ggml_mul_mat_a8(W: torch.Tensor, X: torch.Tensor, quant_type: int, row: int) -> torch.Tensor:
    """Replaces sgl_kernel.quantization.ggml_mul_mat_a8 (same product, batched-token kernel upstream)."""
    return ggml.mul_mat(W, X, int(quant_type), int(row))


def ggml_moe_a8(X: torch.Tensor, W: torch.Tensor, sorted_token_ids: torch.Tensor, expert_ids: torch.Tensor,
                num_tokens_post_padded: torch.Tensor, type: int, row: int, top_k: int, tokens: int) -> torch.Tensor:
    """Replaces sgl_kernel.quantization.ggml_moe_a8 -> [tokens * top_k, row]."""
    return ggml.moe_a8(X, W, sorted_token_ids, expert_ids, num_tokens_post_padded, int(type), int(row), int(top_k),
                       int(tokens))


def ggml_moe_a8_vec(X: torch.Tensor, W: torch.Tensor, topk_ids: torch.Tensor, top_k: int, type: int, row: int,
                    tokens: int) -> torch.Tensor:
    """Replaces sgl_kernel.quantization.ggml_moe_a8_vec -> [tokens * top_k, row]."""
    return ggml.moe_a8_vec(X, W, topk_ids, int(top_k), int(type), int(row), int(tokens))


__getattr__ = missing_getattr("sgl_kernel.quantization", "sglang-kernel (sgl_kernel)")
