"""Streamed prefill (winport/hybrid/prefill_stream.py): the CPU experts computed on the GPU group by group.

The claim under test is exactness: streaming the routed experts in groups of G through two buffers
gives bit for bit what kernels_triton.mxfp4_moe gives with every expert resident (same tiles), for
group sizes that divide the routed experts evenly, unevenly, one at a time and all at once, with
ids of -1 (experts served by the GPU slots) mixed in. That kernel is itself checked against float64
in test_mxfp4_moe.py; here a float64 reference of the same pairs guards against a streamed result
that matches a wrong one-shot result. Outputs start poisoned (NaN). The hybrid layer's use of the
streamer (threshold, CPU experts only, GPU slots added) is checked through HybridMoE with a fake kt.
"""

from __future__ import annotations

import pytest
import torch

from kernels_triton import mxfp4_moe as mm
from tests.ops._helpers import HAS_CUDA
from tests.ops.test_mxfp4_moe import make_experts, routing
from winport.hybrid.prefill_stream import ExpertStreamer, HostExperts

DEV = "cuda" if HAS_CUDA else "cpu"
E, H, I, K = 10, 64, 64, 3  # noqa: E741 - I is the intermediate size, as in the kernel's docstring
LIMIT = 4.0


def _layer(gen: torch.Generator) -> tuple[HostExperts, tuple[torch.Tensor, ...]]:
    w = make_experts(E, H, I, gen=gen)
    host = HostExperts(*(t.pin_memory() if HAS_CUDA else t for t in w))
    return host, tuple(t.to(DEV) for t in w)


def _inputs(t: int, masked: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    ids, tw = routing(t, E, K)
    ids[torch.rand(ids.shape) < masked] = -1  # served by GPU slots: not the streamer's
    x = torch.randn(t, H).to(torch.bfloat16)
    return x.to(DEV), ids.to(DEV), tw.to(DEV)


@pytest.mark.parametrize("group", [1, 3, 4, E])
def test_streamed_equals_resident_bit_for_bit(group: int) -> None:
    gen = torch.Generator().manual_seed(group)
    host, dev_w = _layer(gen)
    x, ids, tw = _inputs(9, masked=0.3)
    streamer = ExpertStreamer(host, DEV, group=group, threshold=1, swiglu_limit=LIMIT)
    got = streamer.forward(x, ids, tw)
    want = mm.mxfp4_moe(x, *dev_w, ids, tw, LIMIT, 1.0, config=streamer.config(ids.numel()),
                        out=torch.full_like(x, float("nan")))
    assert not torch.isnan(got).any()
    assert torch.equal(got, want)
    ref = mm.mxfp4_moe_ref(x.cpu(), *(t.cpu() for t in dev_w), ids.cpu(), tw.cpu(), LIMIT, 1.0)
    rel = float((got.cpu().double() - ref).norm() / ref.norm())
    assert rel < 2 ** -6, rel  # bf16 roundings at act, slot output and sum (test_mxfp4_moe's bound is tighter)


def test_streamer_only_touches_routed_experts_and_reuses_buffers() -> None:
    gen = torch.Generator().manual_seed(7)
    host, dev_w = _layer(gen)
    x, ids, tw = _inputs(6, masked=0.0)
    ids[ids == 2] = -1  # expert 2 routed nowhere: poison it on the host, the result must not change
    host.w13[2].fill_(0x77)
    host.w13_scale[2].fill_(255)  # E8M0 255 = NaN: any read of expert 2 shows up as NaN
    streamer = ExpertStreamer(host, DEV, group=2, threshold=1, swiglu_limit=LIMIT)
    got = streamer.forward(x, ids, tw)
    assert not torch.isnan(got).any()
    want = mm.mxfp4_moe(x, *dev_w, ids, tw, LIMIT, 1.0, config=streamer.config(ids.numel()))
    assert torch.equal(got, want)
    assert streamer.staging_bytes() == 2 * 2 * host.expert_bytes()
    # A second chunk through the same buffers gives its own answer (no state carried over).
    x2, ids2, tw2 = _inputs(5, masked=0.2)
    got2 = streamer.forward(x2, ids2, tw2)
    want2 = mm.mxfp4_moe(x2, *dev_w, ids2, tw2, LIMIT, 1.0, config=streamer.config(ids2.numel()))
    assert torch.equal(got2, want2)


def test_all_ids_served_elsewhere_gives_zeros() -> None:
    host, _ = _layer(torch.Generator().manual_seed(3))
    x, ids, tw = _inputs(4, masked=1.0)
    got = ExpertStreamer(host, DEV, group=4, threshold=1).forward(x, ids, tw)
    assert torch.equal(got, torch.zeros_like(got))


def test_threshold_and_host_layout_checks() -> None:
    host, _ = _layer(torch.Generator().manual_seed(4))
    s = ExpertStreamer(host, DEV, group=4, threshold=8)
    assert not s.wants(torch.empty(7, H))
    assert s.wants(torch.empty(8, H))
    with pytest.raises(ValueError, match="w2_scale"):
        HostExperts(host.w13, host.w13_scale, host.w2, host.w2_scale[:, :, :1])
    with pytest.raises(ValueError, match="group"):
        ExpertStreamer(host, DEV, group=0)


class _FakeKT:
    """kt-kernel's side of HybridMoE, recording whether it was asked for anything."""

    def __init__(self, mask: torch.Tensor) -> None:
        self.mask, self.calls = mask, 0

    def fits(self, x: torch.Tensor) -> bool:
        return True

    def submit(self, *a: object) -> None:
        self.calls += 1

    def sync(self, x: torch.Tensor) -> torch.Tensor:
        return torch.zeros_like(x)


def test_hybrid_layer_streams_cpu_experts_above_threshold() -> None:
    from winport.hybrid.layer import HybridMoE
    from winport.hybrid.slots import SlotMap

    gen = torch.Generator().manual_seed(11)
    host, dev_w = _layer(gen)
    mask = torch.zeros(E, dtype=torch.bool)
    slots = SlotMap(mask, 3, torch.device(DEV))  # experts 0..2 resident on the GPU side
    kt = _FakeKT(mask)
    hybrid = HybridMoE(kt, slots, None)  # type: ignore[arg-type] - the fake has what forward uses
    hybrid.streamer = ExpertStreamer(host, DEV, group=3, threshold=6, swiglu_limit=LIMIT)
    resident = [t[:3] for t in dev_w]
    x, ids, tw = _inputs(6, masked=0.0)
    want = mm.mxfp4_moe(x, *dev_w, ids, tw, LIMIT, 1.0, config=mm.pick_config(ids.numel(), E))

    def gpu_side(xx: torch.Tensor, slot_ids: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return mm.mxfp4_moe(xx, *resident, slot_ids, w, LIMIT, 1.0, config=mm.pick_config(ids.numel(), E))

    got = hybrid.forward(x, ids.clone(), tw, 1.0, gpu_side)
    assert kt.calls == 0  # streamed: kt-kernel untouched
    # Resident and streamed pairs are summed as two bf16 partials (as CPU + GPU are): within one
    # bf16 rounding of the one-launch result per partial.
    assert not torch.isnan(got).any()
    err = (got.float() - want.float()).abs()
    assert float(err.max()) <= 2 ** -7 * float(want.float().abs().max()), float(err.max())
    short = hybrid.forward(x[:5], ids[:5].clone(), tw[:5], 1.0, gpu_side)  # below the threshold: kt-kernel
    assert kt.calls == 1 and short.shape == (5, H)


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU: the copy stream and its events")
def test_streamed_on_cuda_streams_bit_for_bit() -> None:
    """Three chunks enqueued back to back (no sync between them) through the two shared buffers on
    the copy stream: a copy overwriting a buffer its last reader has not finished would change bits."""
    e, h, i = 24, 512, 256
    gen = torch.Generator().manual_seed(5)
    w = make_experts(e, h, i, gen=gen)
    host = HostExperts(*(t.pin_memory() for t in w))
    dev_w = [t.cuda() for t in w]
    streamer = ExpertStreamer(host, "cuda", group=5, threshold=1, swiglu_limit=LIMIT)
    chunks = []
    for t in (300, 77, 512):
        ids, tw = routing(t, e, 6, device="cuda")
        ids[torch.rand(ids.shape, device="cuda") < 0.2] = -1
        chunks.append((torch.randn(t, h, device="cuda").to(torch.bfloat16), ids, tw))
    got = [streamer.forward(*c) for c in chunks]
    torch.cuda.synchronize()
    for (x, ids, tw), g in zip(chunks, got, strict=True):
        want = mm.mxfp4_moe(x, *dev_w, ids, tw, LIMIT, 1.0, config=streamer.config(ids.numel()))
        assert not torch.isnan(g).any()
        assert torch.equal(g, want)
