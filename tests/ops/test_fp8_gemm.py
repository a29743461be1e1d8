"""FP8 block-scaled GEMM / GEMV / einsum (kernels_triton.fp8_gemm, fp8_einsum, shims.deep_gemm.gemm).

Oracle: float64 matmul of the dequantized inputs, computed here from the definition. Tolerance as
sgl-kernel's fp8 blockwise GEMM test (rtol 0.02, atol 1) plus a relative Frobenius error bound
(8e-3: bf16 output rounding and the DEQUANT mode's bf16 operands give up to ~5e-3; a 1% scale
error fails), since atol 1 alone would accept a kernel that is wrong on small outputs. Outputs are poisoned
with NaN first and NaN never compares equal.
"""

from __future__ import annotations

import json

import pytest
import torch

from kernels_triton.fp8_gemm import fp8_block_gemm, fp8_block_gemm_reference, unpack_ue8m0_scales
from tests.helpers import run_python

FP8 = torch.float8_e4m3fn
V41_SHAPES = [(25600, 6144), (16384, 1280), (5120, 4096), (4096, 1280), (5120, 1152), (2304, 5120),
              (1792, 5120)]


def make_inputs(m: int, n: int, k: int, bn: int, bk: int, *, seed: int, device: str = "cpu",
                batch: tuple[int, ...] = ()) -> tuple[torch.Tensor, ...]:
    """Random FP8 operands and positive float32 block scales (never zeros)."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    a = (torch.randn(*batch, m, k, generator=g) * 64).clamp(-448, 448).to(FP8)
    b = (torch.randn(*batch, n, k, generator=g) * 64).clamp(-448, 448).to(FP8)
    sa = torch.rand(*batch, m, -(-k // bk), generator=g) * 2e-3 + 1e-4
    sb = torch.rand(*batch, -(-n // bn), -(-k // bk), generator=g) * 2e-3 + 1e-4
    return tuple(t.to(device) for t in (a, sa, b, sb))


def oracle(a: torch.Tensor, sa: torch.Tensor, b: torch.Tensor, sb: torch.Tensor, bn: int, bk: int) -> torch.Tensor:
    """float64 from the definition: out[m, n] = sum_k a[m,k] sa[m,k//bk] b[n,k] sb[n//bn,k//bk]."""
    k = a.shape[-1]
    n = b.shape[-2]
    kidx = torch.arange(k, device=a.device) // bk
    nidx = torch.arange(n, device=a.device) // bn
    ad = a.double() * sa.double()[..., kidx]
    bd = b.double() * sb.double()[..., nidx, :][..., kidx]
    return ad @ bd.transpose(-1, -2)


def assert_gemm_close(out: torch.Tensor, ref: torch.Tensor) -> None:
    assert not torch.isnan(out).any(), "NaN in output"
    torch.testing.assert_close(out.double(), ref, rtol=0.02, atol=1.0)
    rel = ((out.double() - ref).norm() / ref.norm()).item()
    assert rel < 8e-3, f"relative error {rel:.3e}"


# ------------------------------------------------------------------------------------ CPU: torch path
@pytest.mark.parametrize("bn,bk", [(128, 128), (32, 32)])
@pytest.mark.parametrize("m", [1, 2, 4, 16, 37])
def test_reference_matches_float64(m: int, bn: int, bk: int) -> None:
    n, k = 96 + bn // 2, 4 * bk + bk // 2  # ragged last blocks on N and K
    a, sa, b, sb = make_inputs(m, n, k, bn, bk, seed=m * 1000 + bk)
    out = torch.full((m, n), float("nan"), dtype=torch.bfloat16)
    res = fp8_block_gemm_reference(a, sa, b, sb, (bn, bk), torch.bfloat16, out=out)
    assert res is out
    assert_gemm_close(out, oracle(a, sa, b, sb, bn, bk))


def test_reference_column_major_scales_and_accumulate() -> None:
    """Activation scales in DeepGEMM's MN-major layout (stride 1 along M) and the `c` input."""
    a, sa, b, sb = make_inputs(8, 64, 256, 32, 32, seed=7)
    sa_cm = sa.t().contiguous().t()
    c = torch.randn(8, 64)
    out = fp8_block_gemm_reference(a, sa_cm, b, sb, (32, 32), torch.float32, c=c)
    assert_gemm_close(out, oracle(a, sa, b, sb, 32, 32) + c.double())


def test_ue8m0_unpack() -> None:
    e = torch.randint(100, 150, (5, 8), dtype=torch.int32)
    packed = (e[:, 0::4] | (e[:, 1::4] << 8) | (e[:, 2::4] << 16) | (e[:, 3::4] << 24)).to(torch.int32)
    got = unpack_ue8m0_scales(packed.t().contiguous().t(), 7)  # MN-major strides, ragged group count
    torch.testing.assert_close(got, torch.exp2(e[:, :7].double() - 127).float(), rtol=0, atol=0)


def test_shim_fp8_gemm_nt_float_and_ue8m0(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WINPORT_TRITON_ON_CPU", "1")  # the shim's Triton path, interpreted
    import deep_gemm  # the shim (winport.shimloader maps the name)

    from shims.deep_gemm import gemm as shim

    assert deep_gemm.fp8_gemm_nt is shim.fp8_gemm_nt
    a, sa, b, sb = make_inputs(3, 64, 512, 128, 128, seed=11)
    d = torch.full((3, 64), float("nan"), dtype=torch.bfloat16)
    shim.fp8_gemm_nt((a, sa), (b, sb), d, recipe=(1, 128, 128))
    assert_gemm_close(d, oracle(a, sa, b, sb, 128, 128))
    # Power-of-two scales, packed as UE8M0 int32 (SM100/SM120 format), per-row weight scales.
    ea = torch.randint(118, 124, (3, 4), dtype=torch.int32)
    eb = torch.randint(118, 124, (64, 4), dtype=torch.int32)

    def pack(e: torch.Tensor) -> torch.Tensor:
        return (e[:, 0] | (e[:, 1] << 8) | (e[:, 2] << 16) | (e[:, 3] << 24)).unsqueeze(1).to(torch.int32)

    d.fill_(float("nan"))
    shim.fp8_gemm_nt((a, pack(ea)), (b, pack(eb)), d, recipe=(1, 1, 128))
    assert_gemm_close(d, oracle(a, torch.exp2(ea.float() - 127), b, torch.exp2(eb.float() - 127), 1, 128))


def test_shim_fp8_einsum_and_transform() -> None:
    from shims.deep_gemm import gemm as shim

    t, g, r, d = 5, 4, 256, 256  # o [T, G, D=r] x wo_a [G, R=d, D=r]
    a, sa, _, _ = make_inputs(g, 1, r, 128, 128, seed=3, batch=(t,))
    _, _, w, sw = make_inputs(1, d, r, 128, 128, seed=4, batch=(g,))
    sw_t = shim.transform_sf_into_required_layout(sw, mn=d, k=r, recipe=(1, 128, 128), num_groups=g)
    out = torch.full((t, g, d), float("nan"), dtype=torch.bfloat16)
    shim.fp8_einsum("bhr,hdr->bhd", (a, sa), (w, sw_t), out, recipe=(1, 128, 128))
    ref = torch.einsum("bhr,hdr->bhd", a.double() * sa.double().repeat_interleave(128, -1),
                       w.double() * sw.double().repeat_interleave(128, -2).repeat_interleave(128, -1))
    assert_gemm_close(out, ref)
    with pytest.raises(NotImplementedError):
        shim.fp8_einsum("bhd,hdr->bhr", (a, sa), (w, sw_t), out)


# ------------------------------------------------------------- CPU: Triton kernel under the interpreter
_INTERP_CODE = r"""
import json, torch
FP8 = torch.float8_e4m3fn
from kernels_triton.fp8_gemm import fp8_block_gemm, GemmConfig, GemvConfig
from kernels_triton.fp8_einsum import fp8_einsum_bhr_hdr
from tests.ops.test_fp8_gemm import make_inputs, oracle
res = {}
cases = [  # (name, m, n, k, bn, bk, config)
    ("fp8dot_128", 5, 72, 384, 128, 128, GemmConfig(16, 32, 128, 1, 4, 2, False, 1)),
    ("fp8dot_splitk_128", 2, 64, 640, 128, 128, GemmConfig(16, 32, 128, 3, 4, 2, False, 1)),
    ("dequant_32", 3, 80, 224, 32, 32, GemmConfig(16, 32, 64, 1, 4, 2, True, 1)),
    ("dequant_splitk_32", 1, 64, 512, 32, 32, GemmConfig(16, 32, 64, 4, 4, 2, True, 1)),
    ("fp8dot_32_prefill", 40, 48, 160, 32, 32, GemmConfig(32, 32, 32, 1, 4, 2, False, 2)),
    ("default_cfg_32", 16, 64, 256, 32, 32, None),
    ("dequant_matmul_32", 256, 48, 96, 32, 32, None),  # prefill path: Triton dequant + torch.matmul
    # M = 1 GEMV kernel (no tl.dot): ragged N and K tails, split-K with the last-CTA epilogue
    ("gemv_32", 1, 72, 1248, 32, 32, GemvConfig(16, 256, 1, 4, 1)),
    ("gemv_split_32", 1, 40, 1056, 32, 32, GemvConfig(8, 128, 3, 4, 1)),
    ("gemv_split_128", 1, 80, 640, 128, 128, GemvConfig(32, 128, 2, 4, 1)),
    ("gemv_default_32", 1, 64, 544, 32, 32, None),
    # a K tail that is not a multiple of the 16-byte chunk, 8-wide scale groups (VEC = 8: chunks
    # must not straddle a group), and a grid with fewer N tiles than SMs (the default splits K)
    ("gemv_ragged_k_split_32", 1, 40, 1060, 32, 32, GemvConfig(8, 256, 2, 4, 1)),
    ("gemv_vec8", 1, 24, 200, 8, 8, GemvConfig(8, 64, 1, 4, 1)),
    ("gemv_default_few_tiles_32", 1, 16, 2000, 32, 32, None),
    # narrow tiles as GEMV_TUNED has: 4 and 2 rows, one K step wider than the row (masked)
    ("gemv_bn4_one_step_32", 1, 44, 1060, 32, 32, GemvConfig(4, 2048, 1, 4, 1)),
    ("gemv_bn2_one_step_32", 1, 22, 1184, 32, 32, GemvConfig(2, 2048, 1, 4, 1)),
    # 2..8 activation rows (one accumulator per row): 2 rows, 3 with split-K, 5 with 128-wide groups,
    # 7 with split-K and 4-row tiles, all 8, and the default configs (M = 2, 3; M = 4 takes tl.dot)
    ("gemv_m2_32", 2, 72, 1248, 32, 32, GemvConfig(8, 256, 1, 4, 1)),
    ("gemv_m3_split_32", 3, 40, 1060, 32, 32, GemvConfig(8, 128, 3, 4, 1)),
    ("gemv_m5_split_128", 5, 80, 640, 128, 128, GemvConfig(16, 128, 2, 4, 1)),
    ("gemv_m7_split_32", 7, 44, 1060, 32, 32, GemvConfig(4, 256, 3, 4, 1)),
    ("gemv_m8_32", 8, 48, 544, 32, 32, GemvConfig(8, 256, 1, 4, 1)),
    ("gemv_default_m2_32", 2, 64, 4160, 32, 32, None),
    ("gemv_default_m3_32", 3, 44, 2100, 32, 32, None),
    ("gemv_default_m4_32", 4, 40, 1100, 32, 32, None),
    # x loaded as one [1, BLOCK_K] row (GemvConfig.x_row): 1 row, 5 rows with split-K and a K tail
    ("gemv_xrow_m1_32", 1, 40, 1060, 32, 32, GemvConfig(4, 512, 1, 4, 1, None, True)),
    ("gemv_xrow_m5_split_32", 5, 44, 1060, 32, 32, GemvConfig(4, 256, 3, 4, 1, None, True)),
]
for i, (name, m, n, k, bn, bk, cfg) in enumerate(cases):
    a, sa, b, sb = make_inputs(m, n, k, bn, bk, seed=100 + i)
    out = torch.full((m, n), float("nan"), dtype=torch.bfloat16)
    fp8_block_gemm(a, sa, b, sb, (bn, bk), out=out, config=cfg)
    ref = oracle(a, sa, b, sb, bn, bk)
    res[name] = [out.double().tolist(), ref.tolist()]
# accumulate input + strided (column-major) activation scales
a, sa, b, sb = make_inputs(4, 64, 256, 32, 32, seed=9)
c = torch.randn(4, 64)
out = torch.full((4, 64), float("nan"), dtype=torch.float32)
fp8_block_gemm(a, sa.t().contiguous().t(), b, sb, (32, 32), torch.float32, out=out, c=c,
               config=GemmConfig(16, 32, 64, 2, 4, 2, True, 1))
res["accum_colmajor"] = [out.double().tolist(), (oracle(a, sa, b, sb, 32, 32) + c.double()).tolist()]
a, sa, b, sb = make_inputs(1, 48, 320, 32, 32, seed=10)
c = torch.randn(1, 48)
out = torch.full((1, 48), float("nan"), dtype=torch.float32)
fp8_block_gemm(a, sa.t().contiguous().t(), b, sb, (32, 32), torch.float32, out=out, c=c,
               config=GemvConfig(16, 64, 2, 4, 1))
res["gemv_accum_colmajor"] = [out.double().tolist(), (oracle(a, sa, b, sb, 32, 32) + c.double()).tolist()]
a, sa, b, sb = make_inputs(3, 48, 320, 32, 32, seed=11)
c = torch.randn(3, 48)
out = torch.full((3, 48), float("nan"), dtype=torch.float32)
fp8_block_gemm(a, sa.t().contiguous().t(), b, sb, (32, 32), torch.float32, out=out, c=c,
               config=GemvConfig(8, 64, 2, 4, 1))
res["gemv_m3_accum_colmajor"] = [out.double().tolist(), (oracle(a, sa, b, sb, 32, 32) + c.double()).tolist()]
# bf16 dequant of the prefill path: per-group scale broadcast (pow-2 group) and per-element
# gather (other groups) must both equal fp32 dequant rounded to bf16 exactly
from kernels_triton.fp8_gemm import dequant_bf16
deq = []
for r, k, gr, gk in ((40, 300, 32, 32), (33, 700, 1, 128), (20, 400, 8, 96)):
    x = (torch.randn(r, k, generator=torch.Generator().manual_seed(r)) * 64).clamp(-448, 448).to(FP8)
    sc = torch.rand(-(-r // gr), -(-k // gk)) + 0.01
    y = dequant_bf16(x, sc, gr, gk)
    want = (x.float() * sc.repeat_interleave(gr, 0)[:r].repeat_interleave(gk, 1)[:, :k]).bfloat16()
    deq.append(bool(torch.equal(y, want)) and not bool(y.isnan().any()))
res["dequant_exact"] = deq
# batched einsum bhr,hdr->bhd with strided views
t, g, r, d = 3, 2, 256, 64
a, sa, _, _ = make_inputs(g, 1, r, 128, 128, seed=21, batch=(t,))
_, _, w, sw = make_inputs(1, d, r, 128, 128, seed=22, batch=(g,))
out = torch.full((t, g, d), float("nan"), dtype=torch.bfloat16)
fp8_einsum_bhr_hdr(a, sa, w, sw, (128, 128), out=out)
ref = oracle(a.transpose(0, 1), sa.transpose(0, 1), w, sw, 128, 128).transpose(0, 1)
res["einsum"] = [out.double().tolist(), ref.tolist()]
print("JSON" + json.dumps(res))
"""


@pytest.fixture(scope="module")
def interp_results() -> dict:
    proc = run_python(_INTERP_CODE, env={"TRITON_INTERPRET": "1", "WINPORT_TRITON_ON_CPU": "1"}, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(x for x in proc.stdout.splitlines() if x.startswith("JSON"))
    return json.loads(line[4:])


@pytest.mark.parametrize("name", ["fp8dot_128", "fp8dot_splitk_128", "dequant_32", "dequant_splitk_32",
                                  "fp8dot_32_prefill", "default_cfg_32", "dequant_matmul_32",
                                  "accum_colmajor", "einsum", "gemv_32", "gemv_split_32", "gemv_split_128",
                                  "gemv_default_32", "gemv_accum_colmajor", "gemv_ragged_k_split_32",
                                  "gemv_vec8", "gemv_default_few_tiles_32", "gemv_bn4_one_step_32",
                                  "gemv_bn2_one_step_32", "gemv_m2_32", "gemv_m3_split_32",
                                  "gemv_m5_split_128", "gemv_m7_split_32", "gemv_m8_32", "gemv_default_m2_32",
                                  "gemv_default_m3_32", "gemv_default_m4_32", "gemv_xrow_m1_32",
                                  "gemv_xrow_m5_split_32",
                                  "gemv_m3_accum_colmajor"])
def test_triton_interpreter(interp_results: dict, name: str) -> None:
    out, ref = (torch.tensor(x, dtype=torch.float64) for x in interp_results[name])
    assert_gemm_close(out, ref)


def test_default_gemv_dispatch() -> None:
    """The defaults: GEMV_TUNED's entry for the V4.1-Flash shapes (None: the tl.dot path), for other
    shapes the GEMV kernel at M = 1..3 with the general tiles, never for weight scale rows narrower
    than 8."""
    from kernels_triton.fp8_gemm import GEMV_TUNED, GemvConfig, default_gemv_config

    cpu = torch.device("cpu")
    assert len(GEMV_TUNED) == 7 and all(set(per_m) >= {1, 2, 3, 4} for per_m in GEMV_TUNED.values())
    for (n, k), per_m in GEMV_TUNED.items():
        for m in range(1, 9):
            cfg = default_gemv_config(n, k, 32, cpu, m=m)
            tuned = per_m.get(m)
            assert cfg == tuned, (n, k, m)  # one split: every tuned grid has >= 4 (CPU "SMs") N tiles
            if tuned is not None:
                assert tuned.x_row and tuned.pdl and 32 % tuned.block_n == 0
                assert default_gemv_config(n, k, 8, cpu, m=m) == tuned  # tuned tiles fit 8-row scale blocks
            assert default_gemv_config(n, k, 1, cpu, m=m) is None  # per-row weight scales: tl.dot
    assert default_gemv_config(25600, 6144, 32, cpu, m=5) is None  # measured: tl.dot as fast
    assert default_gemv_config(4096, 1280, 32, cpu, m=6) is not None
    assert default_gemv_config(4096, 1280, 32, cpu, m=7) is None
    # untuned shapes: M = 1 8-row tiles (x as one row with 2048-wide K steps), M = 2, 3 4 x 2048 tiles
    assert default_gemv_config(3000, 6000, 32, cpu) == GemvConfig(8, 2048, 1, 4, 1, None, True)
    assert default_gemv_config(3000, 4000, 32, cpu) == GemvConfig(8, 512, 1, 8, 1)
    assert default_gemv_config(3000, 4000, 32, cpu, m=3) == GemvConfig(4, 2048, 1, 4, 1, None, True)
    assert default_gemv_config(3000, 1000, 32, cpu, m=2) == GemvConfig(4, 1024, 1, 4, 1, None, True)  # K < 2048
    assert default_gemv_config(3000, 4000, 32, cpu, m=4) is None
    assert default_gemv_config(3000, 4000, 12, cpu) is None  # scale rows not a multiple of 8
    # L2 prefetch: only where the tiles cover N exactly (no row past the weight), never interpreted
    from kernels_triton.fp8_gemm import _l2_prefetch_steps

    cfg = GemvConfig(8, 2048, 1, 4, 1, True, True, 2)
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv("TRITON_INTERPRET", raising=False)
        assert _l2_prefetch_steps(cfg, 1792) == 2
        assert _l2_prefetch_steps(cfg, 1796) == 0
        mp.setenv("TRITON_INTERPRET", "1")
        assert _l2_prefetch_steps(cfg, 1792) == 0
    # few N tiles: K is split so the SMs have work: min(K steps, 2 x SMs / tiles), 4 "SMs" off CUDA
    assert default_gemv_config(8, 4096, 32, cpu).split_k == 8  # 1 tile, 8 steps of 512
    assert default_gemv_config(16, 6144, 32, cpu).split_k == 3  # 2 tiles, 3 steps of 2048


def test_triton_interpreter_dequant_bf16_exact(interp_results: dict) -> None:
    """Prefill dequant (pow-2 group broadcast and per-element gather) equals fp32 dequant -> bf16."""
    assert interp_results["dequant_exact"] == [True, True, True]


# --------------------------------------------------------------------------- GPU: V4.1-Flash sizes
@pytest.mark.gpu
@pytest.mark.parametrize("n,k", V41_SHAPES)
@pytest.mark.parametrize("m", [1, 2, 3, 4, 5, 6, 7, 8, 16])
def test_gpu_gemv_v41(m: int, n: int, k: int) -> None:
    """The default dispatch at every V4.1-Flash dense shape and M: each GEMV_TUNED entry (M = 1..6)
    and the tl.dot path where the table has none (M >= 7, and some M = 5, 6)."""
    a, sa, b, sb = make_inputs(m, n, k, 32, 32, seed=n + m, device="cuda")
    out = torch.full((m, n), float("nan"), dtype=torch.bfloat16, device="cuda")
    fp8_block_gemm(a, sa, b, sb, (32, 32), out=out)
    ref = oracle(a, sa, b, sb, 32, 32)
    assert_gemm_close(out, ref)
    fp8_block_gemm(a, sa, b, sb, (32, 32), out=out)  # counters reset: a second call is right too
    assert_gemm_close(out, ref)


@pytest.mark.gpu
@pytest.mark.parametrize("n,k", [(5120, 1152), (2304, 5120)])
@pytest.mark.parametrize("m", [1, 3, 8])
def test_gpu_gemv_configs(m: int, n: int, k: int) -> None:
    """Every GEMV variant the benchmark sweeps (tile, warps, split) is right at real sizes."""
    from kernels_triton.fp8_gemm import GemvConfig

    a, sa, b, sb = make_inputs(m, n, k, 32, 32, seed=n + k + m, device="cuda")
    ref = oracle(a, sa, b, sb, 32, 32)
    out = torch.empty((m, n), dtype=torch.bfloat16, device="cuda")
    m1_tiles = ((8, 256), (8, 512), (8, 1024), (8, 2048), (16, 512), (16, 1024), (32, 512), (4, 1024), (4, 2048),
                (4, 4096), (2, 8192))
    # M = 1: each tile with 4 and 8 warps; more rows: the tiles of gemm.py's --rows-sweep; both: x as one
    # row (x_row) on tiles with warps along K (rows in-thread) and along N (a layout change)
    configs = [(bn_, bk_, w, False) for bn_, bk_ in m1_tiles for w in (4, 8)] if m == 1 else [
        (8, 512, 4, False), (8, 1024, 4, False), (8, 1024, 8, False), (8, 2048, 4, False), (8, 2048, 8, False),
        (4, 1024, 4, False), (4, 2048, 4, False), (4, 4096, 4, False), (2, 4096, 4, False), (2, 8192, 4, False),
        (16, 512, 8, False), (16, 1024, 8, False)]
    configs += [(4, 2048, 4, True), (8, 2048, 4, True), (2, 4096, 4, True), (8, 512, 4, True)]
    for bn_, bk_, w, x_row in configs:
        for split in (1, 3):
            out.fill_(float("nan"))
            fp8_block_gemm(a, sa, b, sb, (32, 32), out=out, config=GemvConfig(bn_, bk_, split, w, 1, None, x_row))
            assert_gemm_close(out, ref)
    # L2 prefetch distances (a hint the interpreter cannot run, so only here): with and without PDL,
    # with split-K, a distance past the end of a split, and a K tail (K = 1152 with 512-wide steps)
    for bn_, bk_, w, dist in ((8, 512, 8, 1), (8, 512, 8, 4), (4, 1024, 8, 2), (2, 4096, 4, 8), (8, 2048, 4, 1)):
        for split, pdl in ((1, True), (1, False), (3, True)):
            out.fill_(float("nan"))
            fp8_block_gemm(a, sa, b, sb, (32, 32), out=out,
                           config=GemvConfig(bn_, bk_, split, w, 1, pdl, l2_prefetch=dist))
            assert_gemm_close(out, ref)


@pytest.mark.gpu
@pytest.mark.parametrize("graph", [False, True], ids=["eager", "graph"])
@pytest.mark.parametrize("m", [1, 3])
def test_gpu_gemv_chain_waits_for_its_input(m: int, graph: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """A chain of M-row GEMVs (the GEMV kernel by default at M = 1 and 3), each fed by the previous
    one's output (quantized by torch kernels in between), then two GEMVs writing one buffer back to
    back: with PDL a GEMV starts streaming its weight while its predecessor runs, so a missing or
    misplaced wait would read a stale input or let the earlier write land last. Eager and in a CUDA
    graph (where SGLang's decode runs)."""
    from kernels_triton.fp8_gemm import gemv_pdl

    monkeypatch.setenv("WINPORT_FP8_GEMV_PDL", "force")  # PDL on every shape of the chain, where supported
    dims = [5120, 4096, 1280, 5120, 1152, 6144, 5120]
    ws = [make_inputs(m, n, k, 32, 32, seed=40 + i, device="cuda")[2:]
          for i, (k, n) in enumerate(zip(dims, dims[1:], strict=False))]
    other = make_inputs(m, dims[1], dims[0], 32, 32, seed=99, device="cuda")[2:]  # same shape as ws[0]
    x0 = (torch.randn(m, dims[0], device="cuda") * 64).clamp(-448, 448).to(FP8)
    s0 = torch.rand(m, dims[0] // 32, device="cuda") * 2e-3 + 1e-4
    outs = [torch.empty(m, n, dtype=torch.bfloat16, device="cuda") for n in dims[1:]]
    twice = torch.empty(m, dims[1], dtype=torch.bfloat16, device="cuda")

    def quant(y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        g = y.float().view(m, -1, 32)
        sc = g.abs().amax(-1).clamp_min(1e-4) / 448.0
        return (g / sc[..., None]).view(m, -1).to(FP8), sc

    def chain() -> None:
        x, sc = x0, s0
        for (b, sb), o in zip(ws, outs, strict=True):
            fp8_block_gemm(x, sc, b, sb, (32, 32), out=o)
            x, sc = quant(o)
        fp8_block_gemm(x0, s0, ws[0][0], ws[0][1], (32, 32), out=twice)
        fp8_block_gemm(x0, s0, other[0], other[1], (32, 32), out=twice)  # this value must stay

    def poison() -> None:
        for o in (*outs, twice):
            o.fill_(float("nan"))

    if graph:
        chain()  # compile outside the capture
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            chain()
        poison()
        g.replay()
    else:
        poison()
        chain()
    torch.cuda.synchronize()
    x, sc = x0, s0
    for (b, sb), o in zip(ws, outs, strict=True):
        assert_gemm_close(o, oracle(x, sc, b, sb, 32, 32))
        x, sc = quant(o)  # the next input is quantized from what the kernel wrote, as in the chain
    assert_gemm_close(twice, oracle(x0, s0, other[0], other[1], 32, 32))
    print("PDL on for", [(k, n) for k, n in zip(dims, dims[1:], strict=False)
                         if gemv_pdl(torch.device("cuda"), k, -(-n // 8))])


@pytest.mark.gpu
def test_gpu_dequant_bf16_exact() -> None:
    """The prefill weight dequant at a V4.1 size equals fp32 dequant rounded to bf16, bit for bit."""
    from kernels_triton.fp8_gemm import dequant_bf16

    _, _, b, sb = make_inputs(1, 2304, 5120, 32, 32, seed=3, device="cuda")
    want = (b.float() * sb.repeat_interleave(32, 0).repeat_interleave(32, 1)).bfloat16()
    assert torch.equal(dequant_bf16(b, sb, 32, 32), want)


@pytest.mark.gpu
@pytest.mark.parametrize("bn,bk", [(32, 32), (128, 128)])
@pytest.mark.parametrize("m", [1, 16, 300, 2048])
def test_gpu_gemm_blocks(m: int, bn: int, bk: int) -> None:
    n, k = 2304, 5120
    a, sa, b, sb = make_inputs(m, n, k, bn, bk, seed=m + bk, device="cuda")
    out = torch.full((m, n), float("nan"), dtype=torch.bfloat16, device="cuda")
    fp8_block_gemm(a, sa, b, sb, (bn, bk), out=out)
    assert_gemm_close(out, oracle(a, sa, b, sb, bn, bk))


@pytest.mark.gpu
def test_gpu_shim_einsum_v4_wo_a() -> None:
    from shims.deep_gemm import gemm as shim

    t, g, r, d = 7, 8, 4096, 1024  # V4-Flash wo_a: 8 groups, o_lora 1024, group input 4096
    a, sa, _, _ = make_inputs(g, 1, r, 128, 128, seed=5, batch=(t,), device="cuda")
    _, _, w, sw = make_inputs(1, d, r, 128, 128, seed=6, batch=(g,), device="cuda")
    out = torch.full((t, g, d), float("nan"), dtype=torch.bfloat16, device="cuda")
    shim.fp8_einsum("bhr,hdr->bhd", (a, sa), (w, sw), out, recipe=(1, 128, 128))
    ref = oracle(a.transpose(0, 1), sa.transpose(0, 1), w, sw, 128, 128).transpose(0, 1)
    assert_gemm_close(out, ref)
