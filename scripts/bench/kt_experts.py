"""Benchmark: kt-kernel's CPU MXFP4 experts at DeepSeek-V4.1-Flash shapes against a DRAM read probe.

One layer of `--experts` random MXFP4 experts (hidden 5120, intermediate 2304: 18.8 MB each, the
real size) is loaded into kt-kernel through winport.hybrid.KTExperts (the server's own path:
weights handed over from memory), then routed top-6 at random for each batch size. Per thread
count (each in a fresh process: kt-kernel builds one thread pool per process) it prints:
- the read probe: torch int64 sum over `--probe-gib` GiB with the same thread count (DRAM read
  bandwidth this process can get), best of 5;
- per batch: median ms per forward, distinct experts read, GB/s of their MXFP4 bytes (packed codes
  + E8M0 scales), GB/s per thread, and the ratio to the probe.
The experts total must exceed the last-level cache (the H200 host has 300 MB of L3): 96 experts =
1.8 GB by default. Random routing is the worst case for the CPU (every expert distinct).

Usage: python scripts/bench/kt_experts.py [--threads 1,15] [--batches 1,2,4,8] [--experts 96]
       [--iters 30] [--probe-gib 2] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

HIDDEN, INTER, TOP_K = 5120, 2304, 6
# Packed codes (half a byte a weight) + one E8M0 byte per 32 weights, for w1, w3 and w2.
EXPERT_BYTES = 3 * HIDDEN * INTER // 2 + 3 * HIDDEN * INTER // 32
MARK = "kt_experts.json: "


def read_probe(gib: float, threads: int) -> float:
    """GB/s of a torch int64 sum over `gib` GiB with `threads` threads (best of 5)."""
    import torch

    torch.set_num_threads(threads)
    buf = torch.ones(int(gib * (1 << 30)) // 8, dtype=torch.int64)
    buf.sum()
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        buf.sum()
        best = min(best, time.perf_counter() - t0)
    return buf.numel() * 8 / best / 1e9


def child(threads: int, batches: list[int], n_experts: int, iters: int, probe_gib: float) -> list[dict]:
    """Run in a fresh process: the probe, then kt-kernel at each batch size."""
    import torch

    from winport.hybrid.kt_experts import KTExperts
    from winport.hybrid.settings import KTSettings

    probe = read_probe(probe_gib, threads)
    settings = KTSettings(cpu_threads=threads, threadpool_count=1, chunk=max(batches))
    kt = KTExperts(0, n_experts, TOP_K, HIDDEN, INTER, settings, swiglu_limit=10.0)
    g = torch.Generator().manual_seed(0)
    for e in range(n_experts):
        for proj, (n, k) in (("w1", (INTER, HIDDEN)), ("w3", (INTER, HIDDEN)), ("w2", (HIDDEN, INTER))):
            kt.stage(e, proj, "weight", torch.randint(0, 256, (n, k // 2), generator=g, dtype=torch.uint8))
            # Exponents 118..122: weights of magnitude ~2^-9..2^-5 x 6, activations stay finite.
            kt.stage(e, proj, "scale", torch.randint(118, 123, (n, k // 32), generator=g, dtype=torch.uint8))
    assert kt.loaded, kt.missing()[:4]
    rows = []
    for b in batches:
        x = torch.randn(b, HIDDEN, generator=g).to(torch.bfloat16)
        times, distinct = [], []
        for it in range(iters + 5):
            ids = torch.stack([torch.randperm(n_experts, generator=g)[:TOP_K] for _ in range(b)])
            w = torch.rand(b, TOP_K, generator=g)
            t0 = time.perf_counter()
            y = kt.forward(x, ids, w)
            dt = time.perf_counter() - t0
            if not torch.isfinite(y).all() or not y.abs().sum() > 0:
                raise SystemExit(f"batch {b}: kt-kernel returned {'non-finite' if not torch.isfinite(y).all() else 'zeros'}")
            if it >= 5:
                times.append(dt)
                distinct.append(len(set(ids.flatten().tolist())))
        times.sort()
        med = times[len(times) // 2]
        d = sum(distinct) / len(distinct)
        gbs = d * EXPERT_BYTES / med / 1e9
        rows.append({"threads": threads, "batch": b, "ms": med * 1e3, "distinct": d, "gbs": gbs,
                     "gbs_per_thread": gbs / threads, "probe_gbs": probe, "of_probe": gbs / probe,
                     "variant": kt.variant, "backend": kt.backend})
    return rows


def main() -> None:
    """Parse arguments, run one child process per thread count, print the table."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", default=None, help="comma list (default: 1 and physical cores - 1)")
    ap.add_argument("--batches", default="1,2,4,8")
    ap.add_argument("--experts", type=int, default=96)
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--probe-gib", type=float, default=2.0)
    ap.add_argument("--json", default=None)
    ap.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    batches = [int(b) for b in a.batches.split(",")]
    if a.child is not None:
        # kt-kernel prints to stdout too: the result line carries a marker.
        print(MARK + json.dumps(child(a.child, batches, a.experts, a.iters, a.probe_gib)), flush=True)
        return
    from winport.hybrid.settings import default_cpu_threads

    threads = [int(t) for t in a.threads.split(",")] if a.threads else sorted({1, default_cpu_threads()})
    env = dict(os.environ, KT_FORCE_SYNC_SUBMIT="1")
    rows: list[dict] = []
    for t in threads:
        r = subprocess.run([sys.executable, __file__, "--child", str(t), "--batches", a.batches,
                            "--experts", str(a.experts), "--iters", str(a.iters), "--probe-gib", str(a.probe_gib)],
                           capture_output=True, text=True, env=env)
        if r.returncode != 0:
            print(r.stdout[-3000:], r.stderr[-3000:], file=sys.stderr)
            raise SystemExit(f"threads={t}: child failed with {r.returncode}")
        rows += json.loads(next(ln for ln in r.stdout.splitlines() if ln.startswith(MARK))[len(MARK):])
    print(f"kt-kernel MXFP4 experts, hidden {HIDDEN}, intermediate {INTER}, top-{TOP_K}, {a.experts} experts "
          f"({a.experts * EXPERT_BYTES / 1e9:.2f} GB), random routing; variant {rows[0]['variant']}, "
          f"backend {rows[0]['backend']}")
    print("| threads | batch | ms | distinct experts | GB/s | GB/s per thread | read probe GB/s | of probe |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['threads']} | {r['batch']} | {r['ms']:.2f} | {r['distinct']:.1f} | {r['gbs']:.1f} | "
              f"{r['gbs_per_thread']:.2f} | {r['probe_gbs']:.1f} | {100 * r['of_probe']:.0f}% |")
    if a.json:
        with open(a.json, "w", encoding="utf-8") as fh:
            json.dump(rows, fh, indent=1)


if __name__ == "__main__":
    main()
