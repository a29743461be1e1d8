"""Benchmark: one hybrid MoE layer at DeepSeek-V4.1-Flash's shapes, split into GPU work, CPU work and the wait.

One layer of 384 random MXFP4 experts (hidden 5120, intermediate 2304, top-6; 18.8 MB each, 7.2 GB)
is loaded into kt-kernel through winport.hybrid.KTExperts (the server's path: weights handed over
from memory), and for each `--gpu` count g the first g experts are also resident on the GPU in
the Triton MXFP4 MoE (kernels_triton.mxfp4_moe, the 4-bit GPU path). Routing is random top-6 per
token, the worst case for both sides. Per g and batch, timed with CUDA events on one stream, the
median of `--iters` forwards:
- gpu: the GPU experts alone (router ids already remapped to slots);
- cpu: kt-kernel alone (submit + sync on the stream: host functions, the CPU work, the H2D copy);
- hybrid: HybridMoE.forward, what the server runs: CPU submitted first, GPU experts, then sync;
- wait = hybrid - gpu: what the GPU stream spends waiting for the CPU;
- overlap = hybrid / max(gpu, cpu): 1.0 when the two sides overlap perfectly (issue goal <= 1.1).
The CPU's expert rate (GB/s of the distinct CPU experts' MXFP4 bytes) is printed next to it.

With `--swaps N` (N > 0), each placement with GPU experts is also timed while hot-expert swaps are
in flight, the way the server makes them (winport.hybrid.swap_stream.CudaSwapStreams: a worker
thread writing on a side stream behind a decode-stream marker; SlotWeights.write: host experts
copied over and, in the CUDA default's block-FP8 slots, converted by SGLang's E2M1 -> E4M3 cast):
before each timed forward a new batch of N expert writes starts if the last one is done, into
spare slots the forward does not read. Rows per slot format (fp8 = the default, mxfp4 = the 4-bit
slots): hybrid ms with swaps in flight, its ratio to the same run's hybrid ms without, and the
swap batches' own rate. The 4-swap cap of one refresh (winport.hybrid.hot_swap) is the natural N.

Usage (CUDA machine): python scripts/bench/hybrid_layer.py [--gpu 0,71,192,384] [--batches 1,2,4,8]
       [--threads N] [--iters 30] [--swaps 4] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

HIDDEN, INTER, TOP_K, EXPERTS = 5120, 2304, 6, 384
EXPERT_BYTES = 3 * HIDDEN * INTER // 2 + 3 * HIDDEN * INTER // 32
RSF, LIMIT = 1.5, 10.0


def _draw(g, n: int, k: int):  # noqa: ANN001, ANN202
    import torch

    codes = torch.randint(0, 256, (n, k // 2), generator=g, dtype=torch.uint8)
    scale = torch.randint(119, 121, (n, k // 32), generator=g, dtype=torch.uint8)
    return codes, scale


def _measure(kt, moe, slots, gpu_side, x, ids, w, iters: int) -> dict:  # noqa: ANN001
    """One placement and batch: GPU alone, CPU alone, hybrid (module docstring)."""
    import torch
    from roofline import median_ms  # sibling module: scripts/bench is on sys.path when run as a script

    slot_ids = ids.clone()
    cpu_ids = slots.split_(slot_ids)
    n_gpu = slots.num_slots
    n_cpu = len({int(e) for e in ids.flatten().tolist()} - set(range(n_gpu)))
    out = moe.forward(x, ids.clone(), w, RSF)
    if not torch.isfinite(out).all() or not out.abs().sum() > 0:
        raise SystemExit(f"g={n_gpu} batch {x.shape[0]}: the hybrid layer returned non-finite values or zeros")

    def run_cpu() -> None:
        kt.submit(x, cpu_ids, w)
        kt.sync(x)

    gpu_ms = median_ms(lambda: gpu_side(x, slot_ids, w), iters) if gpu_side is not None else 0.0
    cpu_ms = median_ms(run_cpu, iters)
    hyb_ms = median_ms(lambda: moe.forward(x, ids.clone(), w, RSF), iters)
    return {"gpu_ms": gpu_ms, "cpu_ms": cpu_ms, "hybrid_ms": hyb_ms, "wait_ms": hyb_ms - gpu_ms,
            "overlap": hyb_ms / max(gpu_ms, cpu_ms, 1e-9), "cpu_experts_read": n_cpu,
            "cpu_gbs": n_cpu * EXPERT_BYTES / (cpu_ms * 1e-3) / 1e9, "backend": kt.backend}


def _measure_swaps(moe, x, ids, w, iters: int, host: tuple, n_swaps: int, fmt: str, base_ms: float) -> dict:  # noqa: ANN001
    """Hybrid forwards while batches of `n_swaps` expert writes run on the side stream (docstring)."""
    import torch
    from roofline import median_ms

    from winport.hybrid.hot_swap import ExpertWeights, SlotWeights
    from winport.hybrid.swap_stream import CudaSwapStreams

    w13, s13, w2, s2 = host
    dev = x.device
    if fmt == "fp8":
        slots = SlotWeights(torch.empty(n_swaps, 2 * INTER, HIDDEN, dtype=torch.float8_e4m3fn, device=dev),
                            torch.empty(n_swaps, 2 * INTER // 128, HIDDEN // 128, dtype=torch.float32, device=dev),
                            torch.empty(n_swaps, HIDDEN, INTER, dtype=torch.float8_e4m3fn, device=dev),
                            torch.empty(n_swaps, HIDDEN // 128, INTER // 128, dtype=torch.float32, device=dev))
    else:
        slots = SlotWeights(torch.empty(n_swaps, 2 * INTER, HIDDEN // 2, dtype=torch.int8, device=dev),
                            torch.empty(n_swaps, 2 * INTER, HIDDEN // 32, dtype=torch.float32, device=dev),
                            torch.empty(n_swaps, HIDDEN, INTER // 2, dtype=torch.int8, device=dev),
                            torch.empty(n_swaps, HIDDEN, INTER // 32, dtype=torch.float32, device=dev))
    # Pageable host memory, as the server's expert sources give (the GGUF's map, a checkpoint's tensors).
    experts = [ExpertWeights(w13[e, :INTER].view(torch.int8), s13[e, :INTER], w13[e, INTER:].view(torch.int8),
                             s13[e, INTER:], w2[e].view(torch.int8), s2[e]) for e in range(EXPERTS - n_swaps, EXPERTS)]
    streams = CudaSwapStreams(dev)
    done = {"batches": 0, "seconds": 0.0}

    def job() -> None:
        t0 = time.perf_counter()
        for k, ex in enumerate(experts):
            slots.write(k, ex)
        torch.cuda.current_stream(dev).synchronize()
        done["batches"] += 1
        done["seconds"] += time.perf_counter() - t0

    pending = [streams.start(streams.mark(), job)]
    pending[0].result()  # one batch untimed: first-call imports and allocations stay out of the figures
    done.update(batches=0, seconds=0.0)
    pending.clear()

    def step() -> None:
        if not pending or pending[-1].done():
            if pending:
                pending.pop().result()  # a failed write fails the benchmark
            pending.append(streams.start(streams.mark(), job))
        moe.forward(x, ids.clone(), w, RSF)

    ms = median_ms(step, iters)
    if pending:
        pending.pop().result()
    streams.worker.shutdown()
    per_batch = done["seconds"] / max(done["batches"], 1)
    return {"format": fmt, "swaps": n_swaps, "hybrid_swap_ms": ms, "slowdown": ms / max(base_ms, 1e-9),
            "swap_batches": done["batches"], "swap_batch_ms": per_batch * 1e3,
            "swap_gbs": n_swaps * slots.expert_bytes() / max(per_batch, 1e-9) / 1e9,
            "slot_expert_mb": slots.expert_bytes() / 1e6}


def main() -> None:
    """Load the layer, time each placement and batch, print the table (and --json)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpu", default="0,71,192,384")
    ap.add_argument("--batches", default="1,2,4,8")
    ap.add_argument("--threads", type=int, default=None, help="kt-kernel CPU threads (default: the server's, physical cores - 2 with CUDA)")
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--swaps", type=int, default=0, help="also time each placement with batches of N expert swaps in flight")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    # The swaps convert MXFP4 with SGLang's own helper; its import must see the switches the server
    # gives SGLang (DeepGEMM's JIT off), or it reaches for DeepGEMM modules no shim provides.
    from winport.platform.launch_policy import sglang_switches

    for k, v in sglang_switches("cuda").items():
        os.environ.setdefault(k, v)

    import torch

    from kernels_triton.mxfp4_moe import mxfp4_moe
    from winport.hybrid.kt_experts import KTExperts
    from winport.hybrid.layer import HybridMoE
    from winport.hybrid.settings import KTSettings, default_cpu_threads
    from winport.hybrid.slots import SlotMap

    if not torch.cuda.is_available():
        raise SystemExit("hybrid_layer.py: needs a CUDA GPU")
    dev = torch.device("cuda")
    threads = a.threads or default_cpu_threads(cuda=True)
    batches = [int(b) for b in a.batches.split(",")]
    placements = [int(n) for n in a.gpu.split(",")]
    g = torch.Generator().manual_seed(0)
    t0 = time.perf_counter()
    kt = KTExperts(0, EXPERTS, TOP_K, HIDDEN, INTER,
                   KTSettings(cpu_threads=threads, threadpool_count=1, chunk=max(batches)), LIMIT)
    w13 = torch.empty(EXPERTS, 2 * INTER, HIDDEN // 2, dtype=torch.uint8)
    s13 = torch.empty(EXPERTS, 2 * INTER, HIDDEN // 32, dtype=torch.uint8)
    w2 = torch.empty(EXPERTS, HIDDEN, INTER // 2, dtype=torch.uint8)
    s2 = torch.empty(EXPERTS, HIDDEN, INTER // 32, dtype=torch.uint8)
    for e in range(EXPERTS):
        (c1, z1), (c3, z3), (c2, z2) = _draw(g, INTER, HIDDEN), _draw(g, INTER, HIDDEN), _draw(g, HIDDEN, INTER)
        w13[e, :INTER], w13[e, INTER:], s13[e, :INTER], s13[e, INTER:] = c1, c3, z1, z3
        w2[e], s2[e] = c2, z2
        for proj, codes, scale in (("w1", c1, z1), ("w3", c3, z3), ("w2", c2, z2)):
            kt.stage(e, proj, "weight", codes)
            kt.stage(e, proj, "scale", scale)
    print(f"loaded {EXPERTS} experts into kt-kernel ({kt.backend}, {threads} threads) in "
          f"{time.perf_counter() - t0:.0f} s", flush=True)
    e8m0 = torch.float8_e8m0fnu
    rows: list[dict] = []
    swap_rows: list[dict] = []
    for n_gpu in placements:
        slots = SlotMap(kt.mask, n_gpu, dev)
        if n_gpu:
            gw13, gs13 = w13[:n_gpu].to(dev), s13[:n_gpu].to(dev).view(e8m0)
            gw2, gs2 = w2[:n_gpu].to(dev), s2[:n_gpu].to(dev).view(e8m0)

            def gpu_side(x, slot_ids, w, gw13=gw13, gs13=gs13, gw2=gw2, gs2=gs2):  # noqa: ANN001, ANN202
                return mxfp4_moe(x, gw13.view(torch.int8), gs13, gw2.view(torch.int8), gs2, slot_ids, w, LIMIT)
        else:
            gpu_side = None
        moe = HybridMoE(kt, slots, gpu_side)
        for b in batches:
            x = torch.randn(b, HIDDEN, generator=g).to(torch.bfloat16).to(dev)
            ids = torch.stack([torch.randperm(EXPERTS, generator=g)[:TOP_K] for _ in range(b)]).to(torch.int32).to(dev)
            w = (torch.rand(b, TOP_K, generator=g) + 0.1).to(dev)
            row = _measure(kt, moe, slots, gpu_side, x, ids, w, a.iters) | {"gpu_experts": n_gpu, "batch": b,
                                                                              "threads": threads}
            rows.append(row)
            if a.swaps and n_gpu:
                for fmt in ("fp8", "mxfp4"):
                    swap_rows.append(_measure_swaps(moe, x, ids, w, a.iters, (w13, s13, w2, s2), a.swaps, fmt,
                                                    row["hybrid_ms"]) | {"gpu_experts": n_gpu, "batch": b,
                                                                         "hybrid_ms": row["hybrid_ms"]})
        del moe, slots
        torch.cuda.empty_cache()
    print(f"hybrid MoE layer: {EXPERTS} experts x {EXPERT_BYTES / 1e6:.1f} MB, hidden {HIDDEN}, intermediate "
          f"{INTER}, top-{TOP_K}, random routing; kt-kernel {rows[0]['backend']} on {threads} threads, GPU: Triton MXFP4 "
          f"on {torch.cuda.get_device_name()}")
    print("| GPU experts | batch | GPU ms | CPU ms | hybrid ms | wait ms | hybrid / max | CPU experts | CPU GB/s |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['gpu_experts']} | {r['batch']} | {r['gpu_ms']:.3f} | {r['cpu_ms']:.3f} | {r['hybrid_ms']:.3f} | "
              f"{r['wait_ms']:.3f} | {r['overlap']:.2f} | {r['cpu_experts_read']} | {r['cpu_gbs']:.1f} |")
    if swap_rows:
        print(f"with hot-expert swaps in flight ({a.swaps} experts a batch, worker thread + side stream, a new batch "
              "started whenever the last was done; the swap rate counts the bytes each slot format holds):")
        print("| GPU experts | batch | slots | hybrid ms | with swaps ms | ratio | swap batches | ms a batch | swap GB/s |")
        print("|---|---|---|---|---|---|---|---|---|")
        for r in swap_rows:
            print(f"| {r['gpu_experts']} | {r['batch']} | {r['format']} ({r['slot_expert_mb']:.1f} MB) | "
                  f"{r['hybrid_ms']:.3f} | {r['hybrid_swap_ms']:.3f} | {r['slowdown']:.2f} | {r['swap_batches']} | "
                  f"{r['swap_batch_ms']:.2f} | {r['swap_gbs']:.1f} |")
    if a.json:
        with open(a.json, "w", encoding="utf-8") as fh:
            json.dump({"layer": rows, "swaps": swap_rows} if swap_rows else rows, fh, indent=1)


if __name__ == "__main__":
    main()
