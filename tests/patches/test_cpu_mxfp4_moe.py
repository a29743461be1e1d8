"""winport.patches.cpu_mxfp4_moe: MXFP4 experts on CPU as W4A16 (the quantized demo's CPU serving path),
against a float64 MoE on the demo quantizer's blocks."""

from __future__ import annotations

import pytest
import torch

from winport.demo import quantize as qz


def _moe_reference(x: torch.Tensor, experts: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]],
                   weights: torch.Tensor, ids: torch.Tensor, limit: float | None) -> torch.Tensor:
    """float64, one token and one expert at a time, DeepSeek's clamped SwiGLU."""
    out = torch.zeros(x.shape[0], experts[0][2].shape[0], dtype=torch.float64)
    for t in range(x.shape[0]):
        for k in range(ids.shape[1]):
            e = int(ids[t, k])
            if e < 0:
                continue
            w1, w3, w2 = (m.double() for m in experts[e])
            g, u = w1 @ x[t].double(), w3 @ x[t].double()
            if limit is not None:
                g, u = g.clamp(max=limit), u.clamp(-limit, limit)
            out[t] += float(weights[t, k]) * (w2 @ (torch.nn.functional.silu(g) * u))
    return out


@pytest.mark.parametrize("limit", [None, 1.0])
def test_cpu_mxfp4_moe_equals_float64(gen: torch.Generator, limit: float | None) -> None:
    from winport.patches.cpu_mxfp4_moe import mxfp4_moe

    n_exp, hidden, inter, tokens = 4, 64, 32, 6
    experts, w13, w13s, w2, w2s = [], [], [], [], []
    for _ in range(n_exp):
        mats = [torch.randn(inter, hidden, generator=gen) / 4, torch.randn(inter, hidden, generator=gen) / 4,
                torch.randn(hidden, inter, generator=gen) / 4]
        packed = [qz.quantize_mxfp4(m) for m in mats]
        experts.append(tuple(qz.dequantize_mxfp4(*p) for p in packed))
        w13.append(torch.cat([packed[0][0], packed[1][0]]))
        w13s.append(torch.cat([packed[0][1], packed[1][1]]).float())
        w2.append(packed[2][0])
        w2s.append(packed[2][1].float())
    x = torch.randn(tokens, hidden, generator=gen).bfloat16()
    ids = torch.stack([torch.randperm(n_exp, generator=gen)[:2] for _ in range(tokens)])
    ids[0, 1] = -1  # an empty slot
    weights = torch.rand(tokens, 2, generator=gen)
    got = mxfp4_moe(x, torch.stack(w13), torch.stack(w13s), torch.stack(w2), torch.stack(w2s), weights, ids, limit)
    ref = _moe_reference(x, experts, weights, ids, limit)
    # bf16 intermediates (gate/up, activation, output): a few 2^-9 relative steps; scaled to the output
    err = (got.double() - ref).abs().max() / ref.abs().max()
    assert err < 0.02, err
    if limit is not None:  # the clamp does something at this scale: without it the answer differs
        unclamped = _moe_reference(x, experts, weights, ids, None)
        assert (unclamped - ref).abs().max() / ref.abs().max() > 0.05
