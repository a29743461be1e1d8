"""ggml_dequantize vs gguf-py's numpy dequantizer (upstream test_gguf.py: atol 1e-2 rtol 4e-2) and
the GGUF matmuls vs dequantize-then-matmul."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, quants
from sgl_kernel.quantization import (
    ggml_dequantize,
    ggml_moe_a8,
    ggml_moe_a8_vec,
    ggml_mul_mat_a8,
    ggml_mul_mat_vec_a8,
)

TYPES = ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q6_K", "MXFP4"]
_D = {"Q8_0": [0], "Q4_0": [0], "Q5_0": [0], "Q4_1": [0, 2], "Q5_1": [0, 2], "Q4_K": [0, 2], "Q6_K": [208]}


def _random_blocks(name: str, rows: int, cols: int) -> np.ndarray:
    """Random GGML blocks with sane fp16 scale fields (random bytes there could be inf/NaN)."""
    qt = GGMLQuantizationType[name]
    bs, ts = GGML_QUANT_SIZES[qt]
    rng = np.random.default_rng(1)
    raw = rng.integers(0, 256, size=(rows * cols // bs, ts), dtype=np.uint8)
    for off in _D.get(name, []):
        raw[:, off:off + 2] = (rng.random((raw.shape[0], 1)) * 0.02 + 0.001).astype(np.float16).view(np.uint8)
    if name == "MXFP4":
        raw[:, 0] = rng.integers(118, 130, size=raw.shape[0])
    return raw.reshape(rows, -1)


@pytest.mark.parametrize("name", TYPES)
def test_ggml_dequantize(name: str) -> None:
    raw = _random_blocks(name, 4, 512)
    ref = quants.dequantize(raw, GGMLQuantizationType[name])
    out = ggml_dequantize(torch.from_numpy(raw), int(GGMLQuantizationType[name]), 4, 512, torch.float32)
    assert out.shape == (4, 512) and not torch.isnan(out).any()
    torch.testing.assert_close(out, torch.from_numpy(ref).float(), atol=1e-2, rtol=4e-2)


def test_unsupported_type_is_loud() -> None:
    with pytest.raises(NotImplementedError):
        ggml_dequantize(torch.zeros(1, 110, dtype=torch.uint8), 10, 1, 256, torch.float32)


@pytest.mark.parametrize("name", ["Q8_0", "Q4_K"])
def test_ggml_matmuls(name: str) -> None:
    qt = int(GGMLQuantizationType[name])
    raw = torch.from_numpy(_random_blocks(name, 16, 256))
    w = ggml_dequantize(raw, qt, 16, 256, torch.float32)
    x = torch.randn(3, 256)
    for fn in (ggml_mul_mat_vec_a8, ggml_mul_mat_a8):
        torch.testing.assert_close(fn(raw, x, qt, 16), x @ w.T, atol=1e-2, rtol=4e-2)
    experts = torch.stack([raw, raw.flip(0)])  # 2 experts
    we = [w, w.flip(0)]
    ids = torch.tensor([[0, 1], [1, 1], [0, 0]], dtype=torch.int32)
    ref = torch.stack([x[t] @ we[int(ids[t, k])].T for t in range(3) for k in range(2)])
    torch.testing.assert_close(ggml_moe_a8_vec(x, experts, ids, 2, qt, 16, 3), ref, atol=1e-2, rtol=4e-2)
    # block-sorted layout with blocks of 4 slots: expert 0 slots {0, 4, 5}, expert 1 slots {1, 2, 3}
    sorted_ids = torch.tensor([0, 4, 5, 6, 1, 2, 3, 6], dtype=torch.int32)
    out = ggml_moe_a8(x, experts, sorted_ids, torch.tensor([0, 1], dtype=torch.int32),
                      torch.tensor([8], dtype=torch.int32), qt, 16, 2, 3)
    torch.testing.assert_close(out, ref, atol=1e-2, rtol=4e-2)


@pytest.mark.gpu
@pytest.mark.parametrize("name", TYPES)
def test_ggml_gpu(name: str) -> None:
    """On CUDA tensors, at a V4.1 dense shape (2304 x 5120): ggml_dequantize against gguf-py's numpy
    dequantizer, and the vector and batched GGUF matmuls against dequantize-then-matmul."""
    qt = int(GGMLQuantizationType[name])
    raw = _random_blocks(name, 2304, 5120)
    ref = torch.from_numpy(quants.dequantize(raw, GGMLQuantizationType[name])).float()
    w_raw = torch.from_numpy(raw).cuda()
    w = ggml_dequantize(w_raw, qt, 2304, 5120, torch.float32)
    assert w.is_cuda and not torch.isnan(w).any()
    torch.testing.assert_close(w.cpu(), ref, atol=1e-2, rtol=4e-2)
    x = torch.randn(4, 5120, device="cuda")
    want = x.double() @ ref.cuda().double().T
    for fn in (ggml_mul_mat_vec_a8, ggml_mul_mat_a8):
        got = fn(w_raw, x, qt, 2304)
        assert got.is_cuda and not torch.isnan(got).any()
        rel = ((got.double() - want).norm() / want.norm()).item()
        assert rel < 1e-2, f"{fn.__name__} {name}: relative error {rel:.2e}"
    # the MoE forms: two experts (the weight and its rows reversed), three tokens, two slots each
    experts = torch.stack([w_raw, w_raw.flip(0)])
    we = [ref.cuda().double(), ref.cuda().double().flip(0)]
    x3 = x[:3]
    ids = torch.tensor([[0, 1], [1, 1], [0, 0]], dtype=torch.int32, device="cuda")
    want = torch.stack([x3[t].double() @ we[int(ids[t, j])].T for t in range(3) for j in range(2)])
    sorted_ids = torch.tensor([0, 4, 5, 6, 1, 2, 3, 6], dtype=torch.int32, device="cuda")
    outs = {"ggml_moe_a8_vec": ggml_moe_a8_vec(x3, experts, ids, 2, qt, 2304, 3),
            "ggml_moe_a8": ggml_moe_a8(x3, experts, sorted_ids, torch.tensor([0, 1], dtype=torch.int32, device="cuda"),
                                       torch.tensor([8], dtype=torch.int32, device="cuda"), qt, 2304, 2, 3)}
    for fname, got in outs.items():
        assert got.is_cuda and not torch.isnan(got).any()
        rel = ((got.double() - want).norm() / want.norm()).item()
        assert rel < 1e-2, f"{fname} {name}: relative error {rel:.2e}"
