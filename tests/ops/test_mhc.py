"""mHC kernels (kernels_triton.mhc) vs transformers' eager DeepseekV4HyperConnection and float64 math.

transformers 5.23's `DeepseekV4HyperConnection` (independent of SGLang) computes (post, comb,
collapsed) from the hc streams: it is the oracle for `mhc_pre` / `hc_split_sinkhorn`; `mhc_post` and
the fused RMSNorm are checked against float64 math written here. Outputs from random inputs (never
zeros); NaN fails every comparison.
"""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch

from kernels_triton import mhc
from tests.helpers import run_python

HC, ITERS, EPS, RMS_EPS = 4, 20, 1e-6, 1e-20  # V4.1-Flash: hc_mult 4, 20 iterations, rms_norm_eps 1e-20


def make(t: int, h: int, seed: int, device: str = "cpu") -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    n = (2 + HC) * HC
    d = {
        "residual": (torch.randn(t, HC, h, generator=g) * 2).to(torch.bfloat16),
        "fn": torch.randn(n, HC * h, generator=g) * (0.5 / (HC * h) ** 0.5),
        "scale": torch.rand(3, generator=g) + 0.5,
        "base": torch.randn(n, generator=g) * 0.5,
        "x": torch.randn(t, h, generator=g).to(torch.bfloat16),
        "norm_w": (torch.rand(h, generator=g) + 0.5),
    }
    return {k: v.to(device) for k, v in d.items()}


def hf_hyper_connection(d: dict[str, torch.Tensor], iters: int = ITERS
                        ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """transformers' eager mHC on the same parameters: (post [T,hc], comb [T,hc,hc], collapsed)."""
    from transformers.models.deepseek_v4.modeling_deepseek_v4 import DeepseekV4HyperConnection

    h = d["residual"].shape[-1]
    cfg = SimpleNamespace(hc_mult=HC, hc_sinkhorn_iters=iters, hc_eps=EPS, rms_norm_eps=RMS_EPS, hidden_size=h)
    mod = DeepseekV4HyperConnection(cfg).to(d["fn"].device)
    with torch.no_grad():
        mod.fn.copy_(d["fn"])
        mod.base.copy_(d["base"])
        mod.scale.copy_(d["scale"])
        post, comb, collapsed = mod(d["residual"].unsqueeze(0))
    return post[0], comb[0], collapsed[0]


def post_f64(d: dict[str, torch.Tensor], post: torch.Tensor, comb: torch.Tensor) -> torch.Tensor:
    r = d["residual"].double()
    return post.double().reshape(*post.shape[:2], 1) * d["x"].double().unsqueeze(1) + torch.einsum(
        "tij,tih->tjh", comb.double(), r)


def check_pre(out: tuple[torch.Tensor, ...], d: dict[str, torch.Tensor]) -> None:
    post, comb, y = out
    hp, hcomb, hy = hf_hyper_connection(d)
    assert post.shape == (*hp.shape, 1) and comb.shape == hcomb.shape and y.dtype == torch.bfloat16
    torch.testing.assert_close(post.squeeze(-1).float(), hp.float(), rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(comb.float(), hcomb.float(), rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(y.float(), hy.float(), rtol=1e-2, atol=2e-2)  # bf16 output, as upstream


# ------------------------------------------------------------------------------------ CPU: torch path
@pytest.mark.parametrize("t", [1, 5])
def test_mhc_pre_reference_vs_transformers(t: int) -> None:
    d = make(t, 64, seed=t)
    out = mhc.mhc_pre_reference(d["residual"], d["fn"], d["scale"], d["base"], RMS_EPS, EPS, EPS, 2.0, ITERS)
    check_pre(out, d)


def test_split_sinkhorn_reference_vs_transformers() -> None:
    d = make(6, 64, seed=9)
    x = d["residual"].float().flatten(1)
    mixes = (x @ d["fn"].t()) * torch.rsqrt(x.square().mean(-1, keepdim=True) + RMS_EPS)
    pre, post, comb = mhc.hc_split_sinkhorn_reference(mixes.view(2, 3, -1), d["scale"], d["base"], HC, ITERS, EPS)
    hp, hcomb, hy = hf_hyper_connection(d)
    torch.testing.assert_close(post.reshape(6, HC), hp, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(comb.reshape(6, HC, HC), hcomb, rtol=1e-4, atol=1e-5)
    collapsed = (pre.reshape(6, HC, 1) * d["residual"].float()).sum(1)
    torch.testing.assert_close(collapsed, hy.float(), rtol=1e-2, atol=2e-2)
    # doubly stochastic after 20 Sinkhorn iterations
    torch.testing.assert_close(comb.sum(-1), torch.ones(2, 3, HC), atol=1e-3, rtol=0)


def test_mhc_pre_norm_reference_vs_float64() -> None:
    d = make(3, 64, seed=4)
    post, comb, y = mhc.mhc_pre_reference(d["residual"], d["fn"], d["scale"], d["base"], RMS_EPS, EPS, EPS,
                                          2.0, ITERS, norm_weight=d["norm_w"], norm_eps=1e-6)
    _, _, hy = hf_hyper_connection(d)
    _, _, y_raw = mhc.mhc_pre_reference(d["residual"], d["fn"], d["scale"], d["base"], RMS_EPS, EPS, EPS, 2.0, ITERS)
    yd = y_raw.double()
    ref = yd * torch.rsqrt(yd.square().mean(-1, keepdim=True) + 1e-6) * d["norm_w"].bfloat16().double()
    torch.testing.assert_close(y.double(), ref, rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(y_raw.float(), hy.float(), rtol=1e-2, atol=2e-2)


def test_mhc_post_reference_vs_float64() -> None:
    d = make(4, 96, seed=5)
    g = torch.Generator().manual_seed(3)
    post = torch.rand(4, HC, 1, generator=g) * 2
    comb = torch.rand(4, HC, HC, generator=g)
    out = mhc.mhc_post_reference(d["x"], d["residual"], post, comb)
    assert out.dtype == torch.bfloat16 and out.shape == (4, HC, 96)
    # bf16 output of values up to ~10: half an ulp is up to 0.03
    torch.testing.assert_close(out.double(), post_f64(d, post, comb), rtol=1e-2, atol=5e-2)


# ------------------------------------------------------------- CPU: Triton kernels under the interpreter
_INTERP_CODE = r"""
import json, torch
from kernels_triton import mhc
from tests.ops.test_mhc import make, HC, ITERS, EPS, RMS_EPS
d = make(3, 64, seed=11)
out = {}
x = d["residual"].float().flatten(1)
mixes = ((x @ d["fn"].t()) * torch.rsqrt(x.square().mean(-1, keepdim=True) + RMS_EPS)).view(3, 1, -1)
out["split"] = [t.tolist() for t in mhc.hc_split_sinkhorn(mixes, d["scale"], d["base"], HC, ITERS, EPS)]
out["split3"] = [t.tolist() for t in mhc.hc_split_sinkhorn(mixes, d["scale"], d["base"], HC, 3, EPS)]
out["pre"] = [t.float().tolist() for t in mhc.mhc_pre(d["residual"], d["fn"], d["scale"], d["base"], RMS_EPS,
                                                       EPS, EPS, 2.0, ITERS)]
out["pre_norm"] = [t.float().tolist() for t in mhc.mhc_pre(d["residual"], d["fn"], d["scale"], d["base"],
                                                            RMS_EPS, EPS, EPS, 2.0, ITERS,
                                                            norm_weight=d["norm_w"], norm_eps=1e-6)]
post = torch.rand(3, HC, 1, generator=torch.Generator().manual_seed(1)) * 2
comb = torch.rand(3, HC, HC, generator=torch.Generator().manual_seed(2))
out["post"] = [mhc.mhc_post(d["x"], d["residual"], post, comb).float().tolist(), post.tolist(), comb.tolist()]
print("JSON" + json.dumps(out))
"""


@pytest.fixture(scope="module")
def interp() -> dict:
    proc = run_python(_INTERP_CODE, env={"TRITON_INTERPRET": "1", "WINPORT_TRITON_ON_CPU": "1"}, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(next(x for x in proc.stdout.splitlines() if x.startswith("JSON"))[4:])


def test_triton_split_sinkhorn(interp: dict) -> None:
    d = make(3, 64, seed=11)
    hp, hcomb, _ = hf_hyper_connection(d)
    _, post, comb = (torch.tensor(x) for x in interp["split"])
    torch.testing.assert_close(post.reshape(3, HC), hp, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(comb.reshape(3, HC, HC), hcomb, rtol=1e-4, atol=1e-5)
    # 3 iterations: far from converged, so an off-by-one iteration count shows
    _, hcomb3, _ = hf_hyper_connection(d, iters=3)
    torch.testing.assert_close(torch.tensor(interp["split3"][2]).reshape(3, HC, HC), hcomb3, rtol=1e-4, atol=1e-5)


def test_triton_mhc_pre(interp: dict) -> None:
    d = make(3, 64, seed=11)
    post, comb, y = (torch.tensor(x) for x in interp["pre"])
    check_pre((post, comb, y.to(torch.bfloat16)), d)
    ref = mhc.mhc_pre_reference(d["residual"], d["fn"], d["scale"], d["base"], RMS_EPS, EPS, EPS, 2.0, ITERS,
                                norm_weight=d["norm_w"], norm_eps=1e-6)
    torch.testing.assert_close(torch.tensor(interp["pre_norm"][2]), ref[2].float(), rtol=1e-2, atol=2e-2)


def test_triton_mhc_post(interp: dict) -> None:
    d = make(3, 64, seed=11)
    out, post, comb = (torch.tensor(x) for x in interp["post"])
    torch.testing.assert_close(out.double(), post_f64(d, post, comb), rtol=1e-2, atol=5e-2)


# --------------------------------------------------------------------------- GPU: V4.1-Flash sizes
@pytest.mark.gpu
@pytest.mark.parametrize("t", [1, 7, 2048])
def test_gpu_mhc_v41(t: int) -> None:
    d = make(t, 5120, seed=t, device="cuda")
    out = mhc.mhc_pre(d["residual"], d["fn"], d["scale"], d["base"], RMS_EPS, EPS, EPS, 2.0, ITERS)
    check_pre(out, d)
    post, comb, _ = out
    res = mhc.mhc_post(d["x"], d["residual"], post, comb)
    torch.testing.assert_close(res.double(), post_f64(d, post, comb), rtol=1e-2, atol=5e-2)
    ref = mhc.mhc_pre_reference(d["residual"], d["fn"], d["scale"], d["base"], RMS_EPS, EPS, EPS, 2.0, ITERS,
                                norm_weight=d["norm_w"], norm_eps=1e-6)
    y = mhc.mhc_pre(d["residual"], d["fn"], d["scale"], d["base"], RMS_EPS, EPS, EPS, 2.0, ITERS,
                    norm_weight=d["norm_w"], norm_eps=1e-6)[2]
    torch.testing.assert_close(y.float(), ref[2].float(), rtol=2e-2, atol=3e-2)
