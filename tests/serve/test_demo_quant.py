"""The demo checkpoint's FP8 block and MXFP4 quantizers (winport.demo.quantize) against references.

- FP8: a float64 reference that searches every finite e4m3 value for the nearest (ties to the even
  code) after dividing by a scale computed in float64 (2^ceil(log2(amax/448)) per block).
- MXFP4: gguf-py's numpy quantizer (same OCP scale rule, its own nearest search) on the same
  blocks, after reordering our DeepSeek nibble layout (2j, 2j+1) into GGUF's (j, j+16).
- Dequantization: transformers' own FP8/FP4 dequantizer (integrations.finegrained_fp8), which is
  what reads DeepSeek-V4 checkpoints there.
Inputs are fresh random tensors each run (seeded per run from the clock, printed on failure).
"""

from __future__ import annotations

import math
import time

import numpy as np
import pytest
import torch

from winport.demo import quantize as qz

SEED = int(time.time() * 1e6) % (2**31)


@pytest.fixture
def gen() -> torch.Generator:
    print(f"seed {SEED}")
    return torch.Generator().manual_seed(SEED)


def _e4m3_table() -> tuple[np.ndarray, np.ndarray]:
    """Every finite e4m3 value (float64) and its byte, ascending by value."""
    codes = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    vals = codes.view(torch.float8_e4m3fn).to(torch.float64).numpy()
    keep = np.isfinite(vals) & ~(codes.numpy() == 0x80)  # drop NaN and negative zero
    order = np.argsort(vals[keep], kind="stable")
    return vals[keep][order], codes.numpy()[keep][order]


def _fp8_reference(w: np.ndarray, block: tuple[int, int]) -> tuple[np.ndarray, np.ndarray]:
    """float64: per-block scales and the nearest e4m3 byte of each element (ties to the even byte)."""
    vals, bytes_ = _e4m3_table()
    bn, bk = block
    n, k = w.shape
    scales = np.zeros((-(-n // bn), -(-k // bk)))
    out = np.zeros(w.shape, dtype=np.uint8)
    for i in range(scales.shape[0]):
        for j in range(scales.shape[1]):
            tile = w[i * bn:(i + 1) * bn, j * bk:(j + 1) * bk].astype(np.float64)
            amax = np.abs(tile).max()
            s = 2.0 ** math.ceil(math.log2(amax / 448.0)) if amax > 0 else 1.0
            scales[i, j] = s
            x = tile / s
            dist = np.abs(x[..., None] - vals)
            best = dist.min(-1, keepdims=True)
            cand = dist == best
            # among equally near codes prefer the even byte (even mantissa), as IEEE round-to-even
            even = cand & (bytes_ % 2 == 0)
            pick = np.where(even.any(-1, keepdims=True), even, cand).argmax(-1)
            out[i * bn:(i + 1) * bn, j * bk:(j + 1) * bk] = bytes_[pick]
    return scales, out


@pytest.mark.parametrize(("shape", "block"), [((256, 384), (128, 128)), ((96, 80), (32, 32)), ((130, 70), (128, 128))])
def test_fp8_block_matches_float64_reference(gen: torch.Generator, shape: tuple[int, int],
                                             block: tuple[int, int]) -> None:
    w = torch.randn(shape, generator=gen) * torch.exp(torch.randn(shape, generator=gen))  # wide dynamic range
    w[:5, :5] = 0.0
    # one block whose amax sits just under 448: any other threshold (or a saturating cast) shows here
    w[: block[0], : block[1]] *= 420.0 / w[: block[0], : block[1]].abs().max()
    q, s = qz.quantize_fp8_block(w, block)
    ref_s, ref_q = _fp8_reference(w.numpy(), block)
    assert q.dtype == torch.float8_e4m3fn and s.dtype == torch.float8_e8m0fnu
    assert np.array_equal(s.to(torch.float64).numpy(), ref_s)
    got = q.view(torch.uint8).numpy()
    # 0x00 and 0x80 are both zero; the reference never picks -0
    got = np.where(got == 0x80, 0, got)
    assert np.array_equal(got, ref_q), f"{(got != ref_q).sum()} of {got.size} FP8 codes differ"
    d = qz.dequantize_fp8_block(q, s, block)
    bs = s.float().repeat_interleave(block[0], 0)[:shape[0]].repeat_interleave(block[1], 1)[:, :shape[1]]
    normal = w.abs() >= bs * 2**-6  # e4m3 normals start at 2^-6; below that the step is absolute
    rel = ((d - w).abs() / w.abs().clamp(min=1e-30))[normal]
    assert float(rel.max()) <= 2**-4  # 3 mantissa bits: half a step is 2^-4 relative


def test_fp8_all_zero_block_and_bad_input() -> None:
    q, s = qz.quantize_fp8_block(torch.zeros(128, 128))
    assert float(s.float()) == 1.0 and not q.float().any()
    w = torch.ones(4, 4)
    w[1, 2] = float("nan")
    with pytest.raises(ValueError, match="layers.0.attn.wq_a.weight: weight has NaN"):
        qz.quantize_fp8_block(w, name="layers.0.attn.wq_a.weight")
    with pytest.raises(ValueError, match="expected a 2-D weight"):
        qz.quantize_fp8_block(torch.ones(4))


def _ours_in_gguf_layout(packed: torch.Tensor, scale: torch.Tensor) -> np.ndarray:
    """Our [N, K/2] (2j, 2j+1) nibbles + e8m0 -> GGUF MXFP4 blocks [N*K/32, 17] (j, j+16 nibbles)."""
    u = packed.view(torch.uint8)
    codes = torch.stack([u & 0xF, u >> 4], -1).view(u.shape[0], -1, 32)  # codes in column order
    gg = codes[..., :16] | (codes[..., 16:] << 4)
    return torch.cat([scale.view(torch.uint8)[..., None], gg], -1).reshape(-1, 17).numpy()


@pytest.mark.parametrize("bf16_inputs", [False, True])
def test_mxfp4_matches_gguf_py(gen: torch.Generator, bf16_inputs: bool) -> None:
    import gguf

    w = torch.randn(64, 512, generator=gen) * torch.exp(torch.randn(64, 16, 1, generator=gen)).repeat(1, 1, 32).view(64, 512)
    if bf16_inputs:  # bf16 values land exactly on E2M1 midpoints now and then: ties
        w = w.bfloat16().float()
    packed, scale = qz.quantize_mxfp4(w)
    ours = _ours_in_gguf_layout(packed, scale)
    theirs = gguf.quants.quantize(w.numpy(), gguf.GGMLQuantizationType.MXFP4).reshape(-1, 17)
    assert np.array_equal(ours[:, 0], theirs[:, 0]), "E8M0 scale bytes differ from gguf-py"
    ours_c = np.stack([ours[:, 1:] & 0xF, ours[:, 1:] >> 4], 1).reshape(-1, 32)
    theirs_c = np.stack([theirs[:, 1:] & 0xF, theirs[:, 1:] >> 4], 1).reshape(-1, 32)
    differ = ours_c != theirs_c
    # gguf-py breaks exact ties toward the smaller magnitude (first index of argmin); we break them
    # to the even code. Every difference must be such a tie, and nothing else may differ.
    x = w.numpy().reshape(-1, 32)  # same block order as the gguf rows
    s = 2.0 ** (ours[:, 0].astype(np.float64) - 127)
    m = np.abs(x) / s[:, None]
    at_tie = np.isin(m, qz._E2M1_MIDPOINTS)
    assert not (differ & ~at_tie).any(), "codes differ from gguf-py away from an exact tie"
    assert ((ours_c[differ] & 7) % 2 == 0).all()
    if not bf16_inputs:
        assert not differ.any()
    else:
        print(f"{int(differ.sum())} exact ties of {differ.size} values")
    back = gguf.quants.dequantize(ours.reshape(64, -1), gguf.GGMLQuantizationType.MXFP4)
    assert np.array_equal(back, qz.dequantize_mxfp4(packed, scale).numpy())


def test_mxfp4_rounding_rules() -> None:
    # One block, scale 1 (amax 6 -> floor(log2 6) - 2 = 0): ties go to the even code, above 6 clamps.
    vals = [0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -0.75, 6.0, 0.1, -0.1, 5.9, -2.6, 0.0] + [0.0] * 18
    packed, scale = qz.quantize_mxfp4(torch.tensor([vals]))
    assert float(scale.float()) == 1.0
    got = qz.dequantize_mxfp4(packed, scale)[0, :14].tolist()
    assert got == [0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0, -1.0, 6.0, 0.0, 0.0, 6.0, -3.0, 0.0]
    # 7.5 with amax 7.5: scale 1, clamps to 6; the low nibble holds column 0, the high column 1
    packed, scale = qz.quantize_mxfp4(torch.tensor([[7.5, -0.5] + [0.0] * 30]))
    assert packed.view(torch.uint8)[0, 0] == (7 | (9 << 4))
    with pytest.raises(ValueError, match="w: MXFP4 needs the input dim divisible by 32"):
        qz.quantize_mxfp4(torch.ones(2, 48), name="w")


def test_dequantizers_agree_with_transformers(gen: torch.Generator) -> None:
    from transformers.integrations.finegrained_fp8 import Fp8Dequantize

    deq = Fp8Dequantize(None)
    w = torch.randn(256, 256, generator=gen)
    q, s = qz.quantize_fp8_block(w, (128, 128))
    assert torch.equal(deq._dequantize_one(q, s, output_dtype=torch.float32), qz.dequantize_fp8_block(q, s))
    packed, scale = qz.quantize_mxfp4(w)
    assert torch.equal(deq._dequantize_one(packed, scale, output_dtype=torch.float32),
                       qz.dequantize_mxfp4(packed, scale))


def test_state_dict_formats_and_round_trip() -> None:
    from winport.demo.config import demo_config
    from winport.demo.weights import demo_state_dict

    base = demo_state_dict(demo_config("v4"))
    quant = qz.quantize_state_dict(base)
    fp8 = {n for n, t in quant.items() if t.dtype == torch.float8_e4m3fn}
    fp4 = {n for n, t in quant.items() if t.dtype == torch.int8}
    assert "layers.1.attn.wq_b.weight" in fp8 and "layers.1.attn.indexer.wq_b.weight" in fp8
    assert "layers.0.ffn.shared_experts.w2.weight" in fp8
    assert "layers.1.attn.compressor.wkv.weight" not in fp8 and "layers.1.attn.indexer.weights_proj.weight" not in fp8
    assert quant["embed.weight"].dtype == torch.bfloat16 and quant["layers.0.ffn.gate.weight"].dtype == torch.bfloat16
    assert len(fp4) == 4 * 8 * 3
    for n in fp8 | fp4:
        assert quant[n[: -len("weight")] + "scale"].dtype == torch.float8_e8m0fnu
    assert quant["layers.2.ffn.experts.7.w2.scale"].shape == (256, 128 // 32)
    plain = qz.dequantize_state_dict(quant)
    assert set(plain) == set(base)
    # the bf16 form is exact: quantizing it again represents the same values (a block whose largest
    # code rounded down to a power of two may get half the scale and doubled codes)
    again = qz.dequantize_state_dict(qz.quantize_state_dict(plain))
    for n, t in plain.items():
        assert torch.equal(t, again[n]), n
    assert plain["layers.1.attn.wq_b.weight"].dtype == torch.bfloat16
    assert torch.equal(plain["layers.1.attn.wq_b.weight"].float(),
                       qz.dequantize_fp8_block(quant["layers.1.attn.wq_b.weight"], quant["layers.1.attn.wq_b.scale"]))
    with pytest.raises(ValueError, match="layers.0.attn.wq_a.weight: FP8 weight without its .scale"):
        qz.dequantize_state_dict({"layers.0.attn.wq_a.weight": quant["layers.0.attn.wq_a.weight"]})
