"""winport.patches.cpu_fp8_block_linear: block-FP8 linears on CPU as W8A16 (the quantized demo's CPU
serving path), against float64 on the demo quantizer's blocks."""

from __future__ import annotations

import pytest
import torch

from winport.demo import quantize as qz


def test_cpu_block_fp8_linear_equals_float64(gen: torch.Generator) -> None:
    from winport.patches.cpu_fp8_block_linear import block_fp8_linear_w8a16, dequantize_block_fp8

    w = torch.randn(384, 256, generator=gen) / 16
    q, s = qz.quantize_fp8_block(w, (128, 128))
    x = torch.randn(5, 256, generator=gen).bfloat16()
    scale32 = s.float()  # SGLang holds the ue8m0 scales as fp32 parameters
    assert torch.equal(dequantize_block_fp8(q, scale32, [128, 128]).float(), qz.dequantize_fp8_block(q, s))
    got = block_fp8_linear_w8a16(x, q, [128, 128], scale32)
    ref = x.double() @ qz.dequantize_fp8_block(q, s).double().T
    # bf16 output: half an ulp (2^-9 relative) plus fp32 accumulation noise; a wrong block scale or
    # a transposed block is off by far more than that
    bound = 2**-8 * (x.double().abs() @ qz.dequantize_fp8_block(q, s).double().abs().T) + 1e-6
    assert got.dtype == torch.bfloat16 and got.shape == (5, 384)
    assert ((got.double() - ref).abs() <= bound).all()
    cached = block_fp8_linear_w8a16(x, q, [128, 128], scale32, weight_bf16=dequantize_block_fp8(q, scale32, [128, 128]))
    assert torch.equal(cached, got)
    with pytest.raises(NotImplementedError, match="pre-quantized"):
        block_fp8_linear_w8a16(x, q, [128, 128], scale32, input_scale=torch.ones(1))


def test_cpu_fp8_layer_preparation(gen: torch.Generator) -> None:
    """What the load hook leaves on a layer: the FP8 parameter untouched, its bf16 value, the linear."""
    import types

    from winport.patches.cpu_fp8_block_linear import block_fp8_linear_w8a16, prepare_layer

    q, s = qz.quantize_fp8_block(torch.randn(256, 128, generator=gen), (128, 128))
    layer = types.SimpleNamespace(weight=torch.nn.Parameter(q.clone(), requires_grad=False),
                                  weight_scale_inv=torch.nn.Parameter(s.float(), requires_grad=False))
    method = types.SimpleNamespace(weight_block_size=[128, 128], use_mxfp8=False, convert_mxfp8_to_block=False,
                                   w8a8_block_fp8_linear=None)
    prepare_layer(method, layer)
    assert method.w8a8_block_fp8_linear is block_fp8_linear_w8a16
    assert torch.equal(layer.weight.view(torch.uint8), q.view(torch.uint8))
    assert torch.equal(layer._block_fp8_bf16_weight.float(), qz.dequantize_fp8_block(q, s))
    method.use_mxfp8 = True
    with pytest.raises(NotImplementedError, match="MXFP8"):
        prepare_layer(method, layer)
