"""Launch the default MXFP4 MoE (the decode GEMV up to GEMV_MAX_SLOTS pairs) a few times at V4.1-Flash expert
sizes, for a profiler to attach to; it prints nothing and times nothing.

Usage (on a GPU machine with Nsight Compute; the first --warm launches compile):
    ncu -k regex:_mxfp4_gemv --launch-skip 4 --launch-count 2 --section SpeedOfLight \
        --section WarpStateStats --section Occupancy python3 scripts/bench/mxfp4_moe_ncu.py [--tokens 1]
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from kernels_triton import mxfp4_moe as mm  # noqa: E402


def main() -> None:
    """Build random experts and routing, then call mxfp4_moe --warm + 2 times."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, default=1)
    ap.add_argument("--warm", type=int, default=4, help="calls before the two a profiler should pick")
    ap.add_argument("--experts", type=int, default=384)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("no CUDA device")
    e, h, i, t, dev = args.experts, 5120, 2304, args.tokens, "cuda"
    torch.manual_seed(0)
    w13 = torch.randint(0, 256, (e, 2 * i, h // 2), dtype=torch.uint8, device=dev)
    s13 = torch.randint(117, 124, (e, 2 * i, h // 32), dtype=torch.uint8, device=dev)
    w2 = torch.randint(0, 256, (e, h, i // 2), dtype=torch.uint8, device=dev)
    s2 = torch.randint(117, 124, (e, h, i // 32), dtype=torch.uint8, device=dev)
    x = torch.randn(t, h, device=dev).bfloat16()
    ids = torch.argsort(torch.rand(t, e, device=dev), dim=1)[:, :6].to(torch.int32)
    tw = torch.softmax(torch.randn(t, 6, device=dev), -1)
    for _ in range(args.warm + 2):
        mm.mxfp4_moe(x, w13, s13, w2, s2, ids, tw, 10.0, 1.0)
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
