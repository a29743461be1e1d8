"""winport.patches.cuda_fp4_dequant_block_shape: FP4 experts dequantized to FP8 get the [128, 128] block shape.

The CUDA path itself needs a GPU (the live V4.1 tests on the H200 use it); here, on the CPU: SGLang's
own `cast_e2m1fn_to_e4m3fn` on winport's MXFP4 experts gives FP8 whose [128, 128]-block reading is
exactly the MXFP4 values (a float64 comparison) and which a [32, 32] reading (the V4.1 checkpoint's
dense block size, what the method kept before the patch) cannot even index; and the hook's decisions.
"""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest
import torch

from winport.demo import quantize as qz
from winport.patches.cuda_fp4_dequant_block_shape import after_process

SEED = int(time.time() * 1e6) % (2**31)


def _fp8_experts(gen: torch.Generator, n_exp: int = 2, n: int = 256, k: int = 128) -> tuple:
    from sglang.srt.layers.quantization.fp8 import cast_e2m1fn_to_e4m3fn

    ws, ss, refs = [], [], []
    for _ in range(n_exp):
        packed, scale = qz.quantize_mxfp4(torch.randn(n, k, generator=gen) * 0.1)
        refs.append(qz.dequantize_mxfp4(packed, scale).double())
        w, s = cast_e2m1fn_to_e4m3fn(packed, scale.float())
        ws.append(w)
        ss.append(s.float())
    return torch.stack(ws), torch.stack(ss), refs


def test_dequantized_experts_are_in_128_blocks() -> None:
    print(f"seed {SEED}")
    w, s, refs = _fp8_experts(torch.Generator().manual_seed(SEED))
    for e, ref in enumerate(refs):
        got = qz.dequantize_fp8_block(w[e], s[e], (128, 128)).double()
        assert torch.equal(got, ref), f"expert {e}: max err {(got - ref).abs().max().item():.3g}"
        with pytest.raises(ValueError, match="does not fit"):
            qz.dequantize_fp8_block(w[e], s[e], (32, 32))


def _method(block: list[int], dequant: bool = True, still_fp4: bool = False) -> SimpleNamespace:
    return SimpleNamespace(dequant_fp4_to_fp8=dequant, is_fp4_expert=still_fp4, weight_block_size=list(block),
                           quant_config=SimpleNamespace(is_fp4_experts=True))


def test_hook_sets_the_block_of_the_dequantized_scales() -> None:
    w, s, _ = _fp8_experts(torch.Generator().manual_seed(SEED))
    layer = SimpleNamespace(w13_weight=w, w13_weight_scale_inv=s, w2_weight=w, w2_weight_scale_inv=s, prefix="m")
    method = _method([32, 32])
    assert after_process(None, method, layer) is None and method.weight_block_size == [128, 128]
    for untouched in (_method([32, 32], dequant=False), _method([32, 32], still_fp4=True)):
        after_process(None, untouched, layer)
        assert untouched.weight_block_size == [32, 32]
    bad = SimpleNamespace(**{**vars(layer), "w2_weight_scale_inv": torch.ones(2, 8, 4)})
    with pytest.raises(RuntimeError, match="not the \\[128, 128\\]-block grid"):
        after_process(None, _method([32, 32]), bad)
