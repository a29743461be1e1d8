"""Kernels that must fail to compile: they show test_triton_compile.py can fail.

_loop_shape_canary is the pattern that passed every CPU test and failed on the H200: a loop-carried
variable whose shape changes inside the loop. The interpreter (numpy broadcasting) runs it; Triton's
code generator rejects it. Not part of kernels_triton, so the inventory never lists it.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _loop_shape_canary(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    acc = tl.zeros([1], dtype=tl.float32)  # [1] before the loop ...
    for i in range(0, n, BLOCK):
        acc = acc + tl.load(x_ptr + i + offs, mask=i + offs < n, other=0.0)  # ... [BLOCK] after
    tl.store(out_ptr + offs, acc)


@triton.jit
def _loop_shape_fixed(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    acc = tl.zeros([BLOCK], dtype=tl.float32)  # the same kernel with the carried shape fixed
    for i in range(0, n, BLOCK):
        acc = acc + tl.load(x_ptr + i + offs, mask=i + offs < n, other=0.0)
    tl.store(out_ptr + offs, acc)


@triton.jit
def _arg_kinds(p_bf16, p_i32, p_u8, p_fp8, p_off, one, n16, n17, big, f, flag, none_arg, C: tl.constexpr):
    """Never launched: its parameters exercise the recorder's two specializers (one of each kind)."""
    pass
