"""CPU time of the two V4.1 prefill steps winport moved from interpreted Triton to torch, in one run.

For one 600-token prefill of the v41 demo (the size tests/serve/test_v41_demo.py uses) it times,
per call: SGLang's `store_fp4_index_k_cache` (Triton quantize + store, run by Triton's interpreter
as on a CPU server) against winport's `sgl_kernel.store_fp4_index_k_cache`, and SGLang's
`mhc_combine` (interpreted Triton) against winport.patches.cpu_mhc_combine.combine_torch. Prints
the median of `--reps` calls and the ratio. Usage: python scripts/bench/v41_cpu_paths.py [--rows 600]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("TRITON_INTERPRET", "1")  # what `winport serve` sets on CPU

import torch  # noqa: E402


def _median_s(fn, reps: int) -> float:  # type: ignore[no-untyped-def]
    fn()
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def main() -> None:
    """Time both pairs and print a markdown table row per pair."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=600)
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    import sgl_kernel
    from sglang.kernels.ops.kvcache.dsv4_fp4_index_k_cache import store_fp4_index_k_cache
    from sglang.kernels.ops.layernorm.mhc import mhc_combine

    from winport.patches.cpu_mhc_combine import combine_torch

    n, page = args.rows, 64
    k = torch.randn(n, 128).to(torch.bfloat16)
    loc = torch.arange(n)
    cache = torch.zeros(-(-n // page), page * 68, dtype=torch.uint8)
    up = getattr(store_fp4_index_k_cache, "__wrapped__", store_fp4_index_k_cache)
    t_up = _median_s(lambda: up(k, cache, loc, page_size=page, rne=True), args.reps)
    t_w = _median_s(lambda: sgl_kernel.store_fp4_index_k_cache(k, cache, loc, page, True), args.reps)
    print(f"| index-K FP4 store | {n}x128 | {t_up * 1e3:.1f} | {t_w * 1e3:.2f} | {t_up / t_w:.0f}x |")
    x = torch.randn(n, 4 * 256).to(torch.bfloat16)
    pre = torch.rand(n, 4)
    upc = getattr(mhc_combine, "__wrapped__", mhc_combine)
    t_up = _median_s(lambda: upc(x, pre, 4, torch.bfloat16), args.reps)
    t_w = _median_s(lambda: combine_torch(x, pre, 4, torch.bfloat16), args.reps)
    print(f"| mHC combine | {n}x4x256 | {t_up * 1e3:.1f} | {t_w * 1e3:.2f} | {t_up / t_w:.0f}x |")


if __name__ == "__main__":
    main()
