"""Streamed prefill benchmark: a layer's MoE with its experts copied from pinned host memory in groups.

At V4.1-Flash expert sizes (hidden 5120, intermediate 2304, top-6; ``--experts`` experts held in
pinned host memory, every one of them routed), in one run on one GPU:
  1. pinned host -> device bandwidth: one 1 GiB copy (the PCIe roofline of the copies);
  2. copy only: the streamer's copies of every routed expert, no compute (its copy rate vs 1.);
  3. compute only: kernels_triton.mxfp4_moe with every expert already resident (same tiles);
  4. streamed: ExpertStreamer.forward, copies and compute overlapped through two group buffers.
Overlap = max(copy only, compute only) / streamed: 1.0 means the shorter of the two hides entirely
under the longer. Times are wall-clock per call with a device sync (the streamer's one host sync
for the expert list included), median of ``--reps``.
Usage: python3 scripts/bench/prefill_stream.py [--tokens 2048,8192] [--groups 8,16] [--experts 128]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from kernels_triton import mxfp4_moe as mm  # noqa: E402
from winport.hybrid.prefill_stream import ExpertStreamer, HostExperts  # noqa: E402

H, I, K = 5120, 2304, 6  # noqa: E741 - V4.1-Flash hidden, expert intermediate, top-k


def wall_ms(fn: Callable[[], object], reps: int) -> float:
    """Median wall-clock milliseconds of fn() followed by a device sync (after one warm-up call)."""
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1e3)
    return sorted(times)[len(times) // 2]


def main() -> None:
    """Print the four timings per (tokens, group) and the ratios."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", default="2048,8192")
    ap.add_argument("--groups", default="8,16")
    ap.add_argument("--experts", type=int, default=128)
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("prefill_stream.py needs a CUDA device")
    torch.manual_seed(0)
    e = args.experts
    print(f"device: {torch.cuda.get_device_name()}  experts {e} x {H}x{I}, top-{K}")
    # Random codes, scales in a narrow range around 1 so outputs stay finite.
    w13 = torch.randint(0, 256, (e, 2 * I, H // 2), dtype=torch.uint8)
    s13 = torch.randint(118, 124, (e, 2 * I, H // 32), dtype=torch.uint8)
    w2 = torch.randint(0, 256, (e, H, I // 2), dtype=torch.uint8)
    s2 = torch.randint(118, 124, (e, H, I // 32), dtype=torch.uint8)
    host = HostExperts(w13.pin_memory(), s13.pin_memory(), w2.pin_memory(), s2.pin_memory())
    resident = [t.cuda() for t in (w13, s13, w2, s2)]
    del w13, s13, w2, s2
    total_bytes = e * host.expert_bytes()
    h2d = pinned_h2d_gbs(args.reps)
    print(f"pinned H2D, one 1 GiB copy: {h2d:6.1f} GB/s; experts streamed per call: {total_bytes / 1e9:.2f} GB "
          f"({host.expert_bytes() / 1e6:.1f} MB each)")
    print(f"{'tokens':>7} {'group':>5} {'staging':>8} {'copy only':>10} {'GB/s':>6} {'%H2D':>5} "
          f"{'compute':>9} {'streamed':>9} {'overlap':>7} {'layer tok/s':>11}")
    for t in (int(v) for v in args.tokens.split(",")):
        for g in (int(v) for v in args.groups.split(",")):
            print(row(host, resident, t, g, h2d, args.reps), flush=True)


def pinned_h2d_gbs(reps: int) -> float:
    """GB/s of one 1 GiB copy from pinned host memory to the device."""
    big = torch.empty(1 << 30, dtype=torch.uint8).pin_memory()
    dst = torch.empty_like(big, device="cuda")
    return (1 << 30) / wall_ms(lambda: dst.copy_(big, non_blocking=True), reps) / 1e6


def row(host: HostExperts, resident: list[torch.Tensor], t: int, g: int, h2d: float, reps: int) -> str:
    """One table row: T tokens routed over every expert, streamed in groups of g."""
    e = host.num_experts
    x = torch.randn(t, H, device="cuda").to(torch.bfloat16)
    ids = torch.argsort(torch.rand(t, e, device="cuda"), dim=1)[:, :K].to(torch.int32)
    tw = torch.softmax(torch.randn(t, K, device="cuda"), -1)
    cfg = mm.pick_config(ids.numel(), e)
    comp = wall_ms(lambda: mm.mxfp4_moe(x, *resident, ids, tw, 10.0, 1.0, config=cfg), reps)
    st = ExpertStreamer(host, "cuda", group=g, threshold=1, swiglu_limit=10.0)
    groups = [list(range(a, min(e, a + g))) for a in range(0, e, g)]

    def copies() -> None:
        for n, grp in enumerate(groups):
            st.copy_group(n, grp).free.record(torch.cuda.current_stream())

    copy_ms = wall_ms(copies, reps)
    got = st.forward(x, ids, tw)
    want = mm.mxfp4_moe(x, *resident, ids, tw, 10.0, 1.0, config=cfg)
    if not torch.equal(got, want):
        raise SystemExit(f"T={t} group {g}: streamed output differs from the resident launch")
    stream_ms = wall_ms(lambda: st.forward(x, ids, tw), reps)
    gbs = e * host.expert_bytes() / copy_ms / 1e6
    return (f"{t:7d} {g:5d} {st.staging_bytes() / 2**20:6.0f}Mi {copy_ms:8.2f}ms {gbs:6.1f} "
            f"{100 * gbs / h2d:4.0f}% {comp:7.2f}ms {stream_ms:7.2f}ms {max(copy_ms, comp) / stream_ms:7.2f} "
            f"{t / stream_ms * 1e3:11.0f}")

if __name__ == "__main__":
    main()
