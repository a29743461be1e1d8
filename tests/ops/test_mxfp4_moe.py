"""MXFP4 fused MoE (kernels_triton/mxfp4_moe.py) against float64 references.

References: ``mxfp4_moe_ref`` (dequantize each routed expert, matmul in float64; with
``round_like_kernel`` it also rounds to bf16 where the kernel stores bf16), and, as independent
checks, winport.patches.cpu_mxfp4_moe.mxfp4_moe (the CPU serving path's torch W4A16 MoE, written
separately, with bf16 rounding at different points) on weights quantized by winport.demo.quantize,
and GGUF MXFP4 experts quantized by gguf-py, repacked by winport.gguf.mxfp4_repack (what the GGUF
loader writes) and compared with a MoE on gguf-py's own dequantized weights.

Tolerance (``error_bound``): an elementwise first-order bound, computed from the float64
intermediates of the exact result, on every rounding the implementation makes:
- fp32 accumulation of n products: |err| <= n 2^-24 sum|a||b| (classic gamma_n bound);
- each bf16 rounding (nearest-even): 2^-8 of the value (unit roundoff of an 8-bit significand);
- silu in fp32: 8 fp32 ulps of its value (exp + divide), and SiLU's slope is at most 1.0998, so a
  gate error dg moves silu(g) by <= 1.1 dg; the clamp is 1-Lipschitz;
- errors propagate through the down projection as |da| @ |W2|^T, through the router weight and
  routed_scaling_factor linearly, and the final bf16 rounding adds 2^-8 of the output.
The kernel rounds to bf16 at act, at the weighted slot output and at the final sum; the CPU
reference additionally at gate/up and at silu. The bound is multiplied by 1.05 for second-order
terms (products of two first-order errors, each < 2^-7 relative). It is a worst-case bound, so it
grows like sqrt(I) 2^-8 of the output (sum |a||w| against |sum a w|): a few % at I = 64, more
at I = 2304. Tests require its median to stay under 2^-3 of |out|, so errors of the size of the
output (a wrong nibble order, scale or row) cannot pass it. The precise check is the other one:
against the rounding-faithful reference the interpreted kernel must agree bit for bit on >= 99% of
outputs (the interpreter reproduces each rounding point; only fp32-vs-float64 accumulation can
flip a rounding, about 1e-4 per value), and on the GPU within 2^-8 relative Frobenius norm.
"""

from __future__ import annotations

import math

import pytest
import torch

from kernels_triton import mxfp4_moe as mm
from kernels_triton.mxfp4_moe_gemv import GemvMoeConfig
from tests.ops._helpers import HAS_CUDA, poisoned

U = 2.0 ** -8  # bf16 unit roundoff (8 significant bits)
F32 = 2.0 ** -24  # fp32 unit roundoff


def make_experts(e: int, h: int, i: int, lo: int = 118, hi: int = 126, device: str = "cpu",
                 gen: torch.Generator | None = None) -> tuple[torch.Tensor, ...]:
    """Random packed codes (every nibble value) and E8M0 scales in [lo, hi)."""
    def rb(*s: int) -> torch.Tensor:
        return torch.randint(0, 256, s, dtype=torch.uint8, generator=gen, device=device)

    def rs(*s: int) -> torch.Tensor:
        return torch.randint(lo, hi, s, dtype=torch.uint8, generator=gen, device=device)

    return rb(e, 2 * i, h // 2), rs(e, 2 * i, h // 32), rb(e, h, i // 2), rs(e, h, i // 32)


def routing(t: int, e: int, k: int, device: str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """Distinct experts per token (top-k of random scores) and positive router weights."""
    ids = torch.argsort(torch.rand(t, e, device=device), dim=1)[:, :k].to(torch.int32)
    w = torch.rand(t, k, device=device) + 0.1
    return ids, w / w.sum(1, keepdim=True)


def error_bound(x: torch.Tensor, w13: torch.Tensor, s13: torch.Tensor, w2: torch.Tensor, s2: torch.Tensor,
                ids: torch.Tensor, tw: torch.Tensor, limit: float | None, scale: float,
                round_gate_up: bool = False, dtype: torch.dtype = torch.float64) -> tuple[torch.Tensor, torch.Tensor]:
    """(exact output, elementwise error bound) in `dtype` (module docstring: how the bound is built).

    round_gate_up: the implementation also rounds gate/up and silu(g) to bf16 (the CPU reference).
    """
    t, h = x.shape
    i = w13.shape[1] // 2
    xf = x.to(dtype)
    exact = torch.zeros(t, h, dtype=dtype, device=x.device)
    dsum = torch.zeros_like(exact)
    absy = torch.zeros_like(exact)
    for e in torch.unique(ids).tolist():
        if e < 0 or e >= w13.shape[0]:
            continue
        tok, slot = torch.nonzero(ids == e, as_tuple=True)
        w1 = mm.dequantize_mxfp4_ref(w13[e], s13[e], dtype)
        wd = mm.dequantize_mxfp4_ref(w2[e], s2[e], dtype)
        xs = xf[tok]
        gu = xs @ w1.T
        dgu = h * F32 * (xs.abs() @ w1.abs().T)
        if round_gate_up:
            dgu = dgu + U * (gu.abs() + dgu)
        g, u = gu[:, :i], gu[:, i:]
        dg, du = dgu[:, :i], dgu[:, i:]
        if limit:
            g = g.clamp(max=limit)
            u = u.clamp(-limit, limit)
        s = torch.nn.functional.silu(g)
        ds = 1.1 * dg + 8 * F32 * s.abs()
        if round_gate_up:
            ds = ds + U * (s.abs() + ds)
        a = s * u
        da = ds * u.abs() + s.abs() * du + 2 * F32 * a.abs()
        da = da + U * (a.abs() + da)
        z = a @ wd.T
        dz = (da @ wd.abs().T) + i * F32 * ((a.abs() + da) @ wd.abs().T)
        twk = tw[tok, slot, None].to(dtype)
        y = z * twk
        dy = dz * twk.abs() + F32 * (y.abs() + dz * twk.abs())
        dy = dy + U * (y.abs() + dy)
        exact.index_add_(0, tok, y)
        dsum.index_add_(0, tok, dy)
        absy.index_add_(0, tok, y.abs() + dy)
    k = ids.shape[1]
    dsum = dsum + k * F32 * absy
    out = exact * scale
    dout = abs(scale) * dsum
    dout = dout + U * (out.abs() + dout)
    return out, 1.05 * dout


def check(out: torch.Tensor, exact: torch.Tensor, bound: torch.Tensor, what: str,
          loosest: float | None = 2.0 ** -3) -> None:
    """No NaN, every element within its bound, and (unless None) the bound's median under `loosest` of |out|."""
    assert not torch.isnan(out.float()).any(), f"{what}: NaN in output"
    err = (out.to(exact.dtype) - exact).abs()
    bad = err > bound
    assert not bad.any(), (f"{what}: {int(bad.sum())} of {bad.numel()} elements over the bound; worst "
                           f"err {float(err[bad].max()):.3e} where bound {float(bound[bad].min()):.3e}")
    nz = exact.abs() > 0
    if loosest is not None and nz.any():
        rel = (bound[nz] / exact.abs()[nz]).median()
        assert rel < loosest, f"{what}: the bound is too loose to test anything (median {float(rel):.3e})"


def run_both(x: torch.Tensor, experts: tuple[torch.Tensor, ...], ids: torch.Tensor, tw: torch.Tensor,
             limit: float | None = 10.0, scale: float = 1.0,
             config: mm.MoeConfig | GemvMoeConfig | None = None,
             faithful_share: float = 0.99, what: str = "kernel vs float64") -> torch.Tensor:
    """Kernel output into a NaN-poisoned buffer, checked against the bound and the faithful reference.

    `config` picks the path: an mm.MoeConfig the tl.dot kernels, a GemvMoeConfig the decode GEMV.
    """
    w13, s13, w2, s2 = experts
    out = poisoned(x.shape[0], x.shape[1], dtype=torch.bfloat16, device=str(x.device))
    got = mm.mxfp4_moe(x, w13, s13, w2, s2, ids, tw, swiglu_limit=limit, routed_scaling_factor=scale,
                       config=config, out=out)
    assert got.data_ptr() == out.data_ptr()
    exact, bound = error_bound(x, w13, s13, w2, s2, ids, tw, limit, scale)
    check(out, exact, bound, what)
    faithful = mm.mxfp4_moe_ref(x, w13, s13, w2, s2, ids, tw, limit, scale, round_like_kernel=True)
    same = (out.double() == faithful).float().mean()
    assert same >= faithful_share, f"only {float(same):.4f} of outputs equal the rounding-faithful reference"
    return out


@pytest.fixture(autouse=True)
def _tl_dot_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """These tests cover the tl.dot kernels at every T: the decode GEMV that mxfp4_moe() picks for small
    batches has its own tests (test_mxfp4_moe_gemv.py), so the GEMV threshold is set to 0 here."""
    from kernels_triton import mxfp4_moe_gemv

    monkeypatch.setattr(mxfp4_moe_gemv, "GEMV_MAX_SLOTS", 0)


CASES = [  # T, E, k, H, I
    (1, 4, 2, 64, 32),  # decode, one token
    (5, 8, 6, 128, 64),  # top-6
    (33, 16, 6, 96, 96),  # H, I not multiples of BLOCK_K (masked K tail), 96 = 3 scale groups
    (17, 3, 1, 160, 64),  # top-1, few experts
]


@pytest.mark.parametrize("t,e,k,h,i", CASES)
@pytest.mark.parametrize("limit,scale", [(10.0, 1.5), (None, 1.0)])
def test_mxfp4_moe_matches_reference(t: int, e: int, k: int, h: int, i: int, limit: float | None,
                                     scale: float) -> None:
    x = torch.randn(t, h).bfloat16()
    ids, tw = routing(t, e, k)
    run_both(x, make_experts(e, h, i), ids, tw, limit, scale)


@pytest.mark.parametrize("rows", sorted(mm.CONFIGS))
def test_mxfp4_moe_each_shipped_config(rows: int) -> None:
    """Every tile config the launcher can pick (so the compile check covers their constexprs)."""
    cfg = mm.CONFIGS[rows]
    x = torch.randn(40, 256).bfloat16()
    ids, tw = routing(40, 3, 2)
    run_both(x, make_experts(3, 256, 128), ids, tw, 10.0, 1.0, config=cfg)
    assert mm.pick_config(40 * 2, 3) == mm.CONFIGS[64] and mm.pick_config(6, 384) == mm.CONFIGS[16]
    assert mm.pick_config(8 * 6, 384) == mm.CONFIGS[16]  # decode, batch 8
    assert mm.pick_config(2048 * 6, 384) == mm.CONFIGS[64]  # prefill: the tile the H200 sweep picked


def test_mxfp4_moe_all_tokens_one_expert() -> None:
    x = torch.randn(37, 64).bfloat16()
    ids = torch.full((37, 1), 2, dtype=torch.int32)
    run_both(x, make_experts(4, 64, 64), ids, torch.rand(37, 1), 10.0, 1.0)


def test_mxfp4_moe_invalid_ids_contribute_zero() -> None:
    """-1 (no expert / CPU expert under KT) and out-of-range ids add nothing; a token with no expert gets zeros."""
    t, e, k, h, i = 9, 5, 3, 64, 64
    x = torch.randn(t, h).bfloat16()
    ids, tw = routing(t, e, k)
    ids[0] = -1
    ids[3, 1] = -1
    ids[5, 0] = -1
    ids[7, 2] = e  # out of range (an EP rank's foreign expert): skipped like -1
    experts = make_experts(e, h, i)
    out = run_both(x, experts, ids, tw)
    assert (out[0] == 0).all()
    # The masked slots are dropped, not computed with some expert: routing them to expert 0 with
    # router weight 0 gives the same output.
    valid = (ids >= 0) & (ids < e)
    keep = mm.mxfp4_moe_ref(x, *experts, torch.where(valid, ids, 0), tw * valid, 10.0, round_like_kernel=True)
    assert torch.equal(out.double(), keep)


def test_mxfp4_moe_zero_tokens() -> None:
    w13, s13, w2, s2 = make_experts(2, 64, 32)
    out = mm.mxfp4_moe(torch.empty(0, 64, dtype=torch.bfloat16), w13, s13, w2, s2,
                       torch.empty(0, 2, dtype=torch.int32), torch.empty(0, 2))
    assert out.shape == (0, 64)


def _flushes_denormals() -> bool:
    """Whether this thread's CPU flushes fp32 subnormals (FTZ/DAZ)."""
    tiny = torch.tensor([2.0 ** -140], dtype=torch.float32)
    return bool((tiny * 1.0).item() == 0.0)


def test_mxfp4_moe_scale_edge_zero() -> None:
    """E8M0 0 is 2^-127 (an fp32 subnormal), not 0: activations near 2^119 make it visible.

    Importing SGLang's engine in the same process turns on FTZ/DAZ (some library it loads is built
    that way: seen in the CI run, where this test follows the serve tests' imports), and the
    interpreter then flushes 2^-127 to 0. The test is about the kernel's decoding, so it runs with
    subnormals kept and restores the mode it found.
    """
    flushed = _flushes_denormals()
    if flushed:
        assert torch.set_flush_denormal(False)
    try:
        w13, s13, w2, s2 = make_experts(2, 64, 32)
        s13.zero_()
        x = (torch.randn(6, 64) * 2.0 ** 119).bfloat16()
        ids, tw = routing(6, 2, 2)
        out = run_both(x, (w13, s13, w2, s2), ids, tw, None, 1.0)
        assert out.abs().max() > 0
    finally:
        if flushed:
            torch.set_flush_denormal(True)


def test_mxfp4_moe_scale_edge_254() -> None:
    """E8M0 254 is 2^127: codes up to 1.5 stay finite in bf16, activations near 2^-120 keep the sums finite.

    The activations stay normal bf16 numbers: Triton's interpreter converts bf16 subnormals to
    fp32 zero (seen with a one-line load kernel, Triton 3.8), so they cannot be tested here.
    """
    w13, s13, w2, s2 = make_experts(2, 64, 32)
    s13.fill_(254)
    w13 &= 0xBB  # clear bit 2 of each nibble: codes 0-3 and 8-11, |value| <= 1.5
    sign = torch.randint(0, 2, (6, 64)) * 2 - 1
    x = (sign * (1 + torch.rand(6, 64)) * 2.0 ** -120).bfloat16()
    ids, tw = routing(6, 2, 2)
    out = run_both(x, (w13, s13, w2, s2), ids, tw, 10.0, 1.0)
    assert torch.isfinite(out).all() and out.abs().max() > 0


def assert_scale_255_is_nan(config: mm.MoeConfig | GemvMoeConfig | None = None) -> None:
    """E8M0 255 is NaN: tokens routed to that expert get NaN (not a silently finite value), others not."""
    w13, s13, w2, s2 = make_experts(3, 64, 32)
    s13[1] = 255
    x = torch.randn(4, 64).bfloat16()
    ids = torch.tensor([[0], [1], [2], [1]], dtype=torch.int32)
    out = mm.mxfp4_moe(x, w13, s13, w2, s2, ids, torch.ones(4, 1), config=config)
    assert torch.isnan(out[[1, 3]]).all() and not torch.isnan(out[[0, 2]]).any()


def test_mxfp4_moe_scale_255_is_nan() -> None:
    """E8M0 255 is NaN on the tl.dot path."""
    assert_scale_255_is_nan()


def test_mxfp4_moe_scale_dtypes_agree() -> None:
    """float8_e8m0fnu views and float32 scale values (SGLang's CUDA parameter dtype) give identical bits."""
    t, e, k, h, i = 7, 4, 2, 128, 64
    x = torch.randn(t, h).bfloat16()
    ids, tw = routing(t, e, k)
    w13, s13, w2, s2 = make_experts(e, h, i)
    base = mm.mxfp4_moe(x, w13, s13, w2, s2, ids, tw, 10.0)
    e8 = mm.mxfp4_moe(x, w13.view(torch.int8), s13.view(torch.float8_e8m0fnu), w2.view(torch.int8),
                      s2.view(torch.float8_e8m0fnu), ids, tw, 10.0)
    f32 = mm.mxfp4_moe(x, w13, torch.exp2(s13.float() - 127), w2, torch.exp2(s2.float() - 127), ids, tw, 10.0)
    assert not torch.isnan(base).any()
    assert torch.equal(base, e8) and torch.equal(base, f32)


def test_mxfp4_moe_swiglu_clamp_is_applied() -> None:
    """A limit that clips: the output follows the clamped reference and differs from the unclamped one."""
    t, e, k, h, i = 8, 3, 2, 64, 64
    x = torch.randn(t, h).bfloat16()
    ids, tw = routing(t, e, k)
    experts = make_experts(e, h, i, lo=124, hi=127)
    out = run_both(x, experts, ids, tw, 0.5, 1.0)
    free = mm.mxfp4_moe_ref(x, *experts, ids, tw, None)
    assert (out.double() - free).abs().max() > 0.1 * free.abs().max()


def test_reference_dequant_matches_demo_and_gguf() -> None:
    """The torch reference's dequantizer agrees with the demo checkpoint's and with gguf-py's MXFP4."""
    from winport.demo.quantize import dequantize_mxfp4, quantize_mxfp4

    w = torch.randn(48, 128) * 0.05
    q, s = quantize_mxfp4(w, "w")
    ours = mm.dequantize_mxfp4_ref(q, s, torch.float32)
    assert torch.equal(ours, dequantize_mxfp4(q, s))
    gguf_quants = pytest.importorskip("gguf.quants")
    import gguf
    import numpy as np

    # GGUF block: E8M0 byte, then 16 bytes with element j in the low and j+16 in the high nibble.
    u = q.view(torch.uint8).view(48, 4, 16).numpy()
    cols = np.stack([u & 15, u >> 4], -1).reshape(48, 4, 32)  # codes in column order
    codes = cols[..., :16] | (cols[..., 16:] << 4)
    blocks = np.concatenate([s.view(torch.uint8).view(48, 4, 1).numpy(), codes], -1).reshape(48, -1)
    ref = gguf_quants.dequantize(blocks, gguf.GGMLQuantizationType.MXFP4)
    assert np.array_equal(ref.astype(np.float32), ours.numpy())


def test_mxfp4_moe_vs_cpu_serving_reference() -> None:
    """Independent check: winport's CPU MXFP4 MoE (different bf16 rounding points) on quantized Gaussians."""
    from winport.demo.quantize import quantize_mxfp4
    from winport.patches.cpu_mxfp4_moe import mxfp4_moe as cpu_moe

    t, e, k, h, i = 12, 6, 3, 128, 64
    packs = [quantize_mxfp4(torch.randn(n, kk) * 0.1, "w") for _ in range(e) for n, kk in ((2 * i, h), (h, i))]
    w13 = torch.stack([p[0] for p in packs[0::2]])
    s13 = torch.stack([p[1] for p in packs[0::2]])
    w2 = torch.stack([p[0] for p in packs[1::2]])
    s2 = torch.stack([p[1] for p in packs[1::2]])
    x = (torch.randn(t, h) * 2).bfloat16()
    ids, tw = routing(t, e, k)
    ours = mm.mxfp4_moe(x, w13, s13, w2, s2, ids, tw, 10.0)
    theirs = cpu_moe(x, w13, s13.float(), w2, s2.float(), tw, ids, 10.0)
    exact, b_ours = error_bound(x, w13, s13, w2, s2, ids, tw, 10.0, 1.0)
    _, b_cpu = error_bound(x, w13, s13, w2, s2, ids, tw, 10.0, 1.0, round_gate_up=True)
    check(ours, exact, b_ours, "kernel vs float64")
    # Its bf16 gate/up and silu roundings are amplified by |up| and SiLU's slope in the worst case:
    # the bound is looser (median ~20% of |out| here) but still fails on a gate/up swap or a wrong
    # nibble order, which is what this independent check is for.
    check(theirs, exact, b_cpu, "cpu_mxfp4_moe vs float64", loosest=0.5)
    err = (ours.double() - theirs.double()).abs()
    assert (err <= b_ours + b_cpu).all()


def test_mxfp4_moe_on_gguf_experts() -> None:
    """GGUF MXFP4 experts (quantized by gguf-py) through winport's GGUF repack feed the kernel as they
    are; the reference MoE uses gguf-py's own dequantization (independent of this module's)."""
    gguf = pytest.importorskip("gguf")
    import numpy as np

    from winport.gguf.mxfp4_repack import gguf_mxfp4_to_kt

    t, e, k, h, i = 10, 4, 2, 128, 64
    mx = gguf.GGMLQuantizationType.MXFP4
    w13, s13, w2, s2, dense13, dense2 = [], [], [], [], [], []
    for _ in range(e):
        mats = {}
        for name, (n, kk) in (("gate", (i, h)), ("up", (i, h)), ("down", (h, i))):
            raw = gguf.quants.quantize((np.random.default_rng(len(w13) * 3 + len(mats)).standard_normal((n, kk))
                                        * 0.1).astype(np.float32), mx)
            mats[name] = (gguf_mxfp4_to_kt(raw, n, kk), gguf.quants.dequantize(raw, mx).astype(np.float64))
        w13.append(np.concatenate([mats["gate"][0][0], mats["up"][0][0]]))  # gate rows, then up rows
        s13.append(np.concatenate([mats["gate"][0][1], mats["up"][0][1]]))
        w2.append(mats["down"][0][0])
        s2.append(mats["down"][0][1])
        dense13.append(np.concatenate([mats["gate"][1], mats["up"][1]]))
        dense2.append(mats["down"][1])
    experts = [torch.from_numpy(np.stack(a)) for a in (w13, s13, w2, s2)]
    x = torch.randn(t, h).bfloat16()
    ids, tw = routing(t, e, k)
    out = mm.mxfp4_moe(x, *experts, ids, tw, 10.0)
    # Reference with the kernel's bf16 rounding points, on gguf-py's dequantized weights.
    ref = torch.zeros(t, h, dtype=torch.float64)
    for tok in range(t):
        for slot in range(k):
            ex = int(ids[tok, slot])
            gu = x[tok].double() @ torch.from_numpy(dense13[ex]).T
            g, u = gu[:i].clamp(max=10.0), gu[i:].clamp(-10.0, 10.0)
            a = (torch.nn.functional.silu(g) * u).bfloat16().double()
            ref[tok] += ((a @ torch.from_numpy(dense2[ex]).T) * float(tw[tok, slot])).bfloat16().double()
    ref = ref.bfloat16().double()
    assert not torch.isnan(out).any()
    same = (out.double() == ref).float().mean()
    assert same >= 0.99, f"only {float(same):.4f} of outputs equal the gguf-py-based reference"


@pytest.mark.parametrize("bad,msg", [
    ("hidden_fp32", "hidden must be bf16"),
    ("h_odd_group", "multiple of 32"),
    ("w2_shape", "w2 (3, 64, 8) should be"),
    ("scale_shape", "w13_scale"),
    ("scale_dtype", "w2_scale must be"),
    ("ids_rows", "topk_ids must be"),
])
def test_mxfp4_moe_bad_input(bad: str, msg: str) -> None:
    w13, s13, w2, s2 = make_experts(3, 64, 32)
    x = torch.randn(2, 64).bfloat16()
    ids, tw = routing(2, 3, 2)
    if bad == "hidden_fp32":
        x = x.float()
    elif bad == "h_odd_group":
        x = torch.randn(2, 48).bfloat16()
        w13 = w13[:, :, :24]
    elif bad == "w2_shape":
        w2 = w2[:, :, :8]
    elif bad == "scale_shape":
        s13 = s13[:, :, :1]
    elif bad == "scale_dtype":
        s2 = s2.to(torch.float16)
    elif bad == "ids_rows":
        ids = ids[:1]
    with pytest.raises(ValueError, match=msg.replace("(", r"\(").replace(")", r"\)")):
        mm.mxfp4_moe(x, w13, s13, w2, s2, ids, tw)


# ------------------------------------------------------------------ GPU, DeepSeek-V4.1-Flash sizes
V41 = dict(h=5120, i=2304, e=384, k=6)


@pytest.fixture(scope="module")
def v41_experts() -> tuple[torch.Tensor, ...]:
    """384 experts at V4.1-Flash size (7.2 GB of MXFP4 on the GPU); scales as in quantized weights."""
    gen = torch.Generator(device="cuda").manual_seed(1)
    return make_experts(V41["e"], V41["h"], V41["i"], 117, 124, device="cuda", gen=gen)


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
@pytest.mark.parametrize("t", [1, 2, 8, 16, 2048])
def test_mxfp4_moe_gpu_v41(t: int, v41_experts: tuple[torch.Tensor, ...]) -> None:
    """Decode (T=1..16) and prefill (T=2048) at V4.1-Flash sizes vs the float32-on-GPU bound.

    On the GPU the bound is computed in float32 (float64 matmuls at 2048 x 5120 x 4608 are slow):
    that "exact" result carries its own fp32 accumulation error, at most the fp32 terms already in
    the bound (5120 x 2^-24 = 3e-4 against the 2^-8 = 3.9e-3 bf16 terms, < 10% of it), hence the
    bound x 1.1. At these sizes, with uniformly random codes, the worst-case bound is no longer
    small against the output (its median was 1.67 x |out| in an interpreted CPU run at H=5120,
    I=2304, T=2, 8 experts, where the actual error was at most 1.2% of the bound and 99.99% of
    outputs equalled the rounding-faithful reference bit for bit): there it only rules out NaN and
    gross errors, and the Frobenius comparison with the rounding-faithful reference is the
    precision check. The rounding-faithful comparison is norm-wise: tensor-core accumulation order differs
    from the reference's, flipping a few roundings by one bf16 ulp (<= 2^-7 relative); even 25% of
    outputs off by one ulp gives a relative Frobenius error <= 2^-7 * sqrt(0.25) = 2^-8, while one
    wrong scale group out of I/32 = 72 already gives about 1/sqrt(72) = 0.12.
    """
    w13, s13, w2, s2 = v41_experts
    torch.manual_seed(t)
    x = torch.randn(t, V41["h"], device="cuda").bfloat16()
    ids, tw = routing(t, V41["e"], V41["k"], device="cuda")
    out = torch.full((t, V41["h"]), float("nan"), dtype=torch.bfloat16, device="cuda")
    mm.mxfp4_moe(x, w13, s13, w2, s2, ids, tw, swiglu_limit=10.0, routed_scaling_factor=1.5, out=out)
    torch.cuda.synchronize()
    exact, bound = error_bound(x, w13, s13, w2, s2, ids, tw, 10.0, 1.5, dtype=torch.float32)
    check(out, exact, bound * 1.1, f"T={t} kernel vs float32", loosest=None)
    faithful = mm.mxfp4_moe_ref(x, w13, s13, w2, s2, ids, tw, 10.0, 1.5, dtype=torch.float32,
                                round_like_kernel=True)
    rel = float((out.float() - faithful).norm() / faithful.norm())
    assert rel < 2.0 ** -8, f"T={t}: relative Frobenius error {rel:.3e} vs the rounding-faithful reference"
    f32 = mm.mxfp4_moe(x, w13, torch.exp2(s13.float() - 127), w2, torch.exp2(s2.float() - 127), ids, tw,
                       swiglu_limit=10.0, routed_scaling_factor=1.5)
    assert torch.equal(out, f32), "float32 scales (SGLang's CUDA dtype) must give the same bits"
    assert math.isfinite(rel)
