"""Benchmark: the MXFP4 fused MoE (kernels_triton/mxfp4_moe.py) at DeepSeek-V4.1-Flash expert sizes.

Per token count T (decode 1, 2, 5 = DSpark's verify block, 8, 64; prefill 2048 by default), with top-6
routing over 384 experts (hidden 5120, intermediate 2304), prints:
- copy bandwidth measured in the same run (device-to-device copy, read + write bytes / time);
- the decode GEMV (kernels_triton/mxfp4_moe_gemv.py, what mxfp4_moe() runs for T * top_k <=
  GEMV_MAX_SLOTS; also timed up to 1024 (token, slot) pairs to show the crossover) and the tl.dot kernels
  (an explicit MoeConfig), each eager and in a CUDA graph, as % of copy bandwidth for the bytes of the
  distinct experts touched; --gemv-sweep adds the GEMV_SWEEP tiles (pick the best per T);
  --gemv-baseline FILE times another version of kernels_triton/mxfp4_moe_gemv.py (e.g. `git show
  REV:kernels_triton/mxfp4_moe_gemv.py > FILE`) on the same inputs, with its own default tiles, and
  checks that both give the same output bits;
- the MXFP4 kernel's time per call (moe_align + gate/up + down + moe_sum, what a layer would
  call), the bytes of expert weights it touches (unique routed experts x (packed codes + E8M0
  scales)), GB/s and % of copy bandwidth; at decode also the time inside one CUDA graph (as
  SGLang's decode runs), which removes the Python/launch overhead;
- baselines on the same routing: (a) "dequant + matmul": each routed expert dequantized to bf16
  with torch ops, then torch matmuls (what one gets without a fused kernel); (b) "bf16 resident":
  experts pre-dequantized to bf16 (3.8x the memory) and torch matmuls per expert;
- the FP8-dequantized path (SGLang's SGLANG_DSV4_FP4_DEQUANT=1 + its Triton fused_moe) is not on
  the device (no SGLang there): its bytes (1 byte per weight + a float32 scale per 128x128 block,
  about 1.9x the MXFP4 bytes) are printed with the time it would take at 100% of the measured copy
  bandwidth, a computed lower bound, labelled as such, not a measurement.
Routings rotate over several draws (decode: 8 x 6 experts x 18.8 MB = 0.9 GB > L2) so weights
come from DRAM, as in a real decode step.

Usage: PYTHONPATH=. python3 scripts/bench/mxfp4_moe.py [--tokens 1,2,5,8,64,2048] [--gemv-sweep] [--sweep]
       [--gemv-baseline FILE]
       [--no-baseline]
       [--check] [--json PATH]
       TRITON_INTERPRET=1 PYTHONPATH=. python3 scripts/bench/mxfp4_moe.py --cpu-smoke   (tiny shapes on CPU:
       exercises the script's code paths, its times mean nothing)
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
from collections.abc import Callable

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from roofline import graph_time, median_ms  # noqa: E402  (sibling module: scripts/bench is on sys.path)

from kernels_triton import mxfp4_moe as mm  # noqa: E402
from kernels_triton import mxfp4_moe_gemv as gv  # noqa: E402
from kernels_triton.formats import E2M1_VALUES  # noqa: E402
from winport.modfile import import_file  # noqa: E402

SWEEP = [mm.MoeConfig(16, 64, 128, 4, 3), mm.MoeConfig(16, 128, 128, 4, 3), mm.MoeConfig(16, 64, 256, 4, 4),
         mm.MoeConfig(16, 32, 128, 4, 4), mm.MoeConfig(32, 64, 128, 4, 3), mm.MoeConfig(64, 64, 64, 8, 3),
         mm.MoeConfig(64, 128, 64, 8, 3), mm.MoeConfig(64, 64, 128, 4, 3), mm.MoeConfig(128, 64, 64, 8, 3)]


# --gemv-sweep: a few tiles of the decode GEMV (gate_up / down: block_n, block_k, warps). block_k = 1024 x
# warps puts every warp along K (x reused by every row a thread holds); the smaller ones spread rows.
GEMV_SWEEP = [gv.GemvMoeConfig(gn, gk, gw, dn, dk, dw) for gn, gk, gw, dn, dk, dw in (
    (4, 1024, 1, 4, 1024, 1), (2, 1024, 1, 2, 1024, 1), (8, 1024, 1, 8, 1024, 1), (4, 2048, 2, 4, 1024, 1),
    (4, 1024, 1, 4, 256, 1), (4, 1024, 1, 8, 512, 1), (2, 2048, 2, 4, 2048, 2), (4, 512, 1, 4, 512, 1),
    (1, 1024, 1, 1, 1024, 1), (8, 512, 2, 8, 256, 1), (4, 4096, 4, 4, 2048, 2), (16, 256, 1, 16, 256, 1),
    (4, 512, 1, 8, 256, 1), (8, 512, 2, 4, 256, 1), (2, 512, 1, 4, 256, 1), (8, 1024, 2, 8, 512, 2))]


def load_gemv_module(path: str):  # noqa: ANN201 - a module object
    """Import another version of kernels_triton/mxfp4_moe_gemv.py from `path` under its own name."""
    try:
        return import_file("mxfp4_moe_gemv_baseline", path)
    except (ImportError, FileNotFoundError) as exc:
        raise SystemExit(f"--gemv-baseline: {exc}") from exc


def graph_bench(calls: list[Callable[[], object]], reps: int = 20) -> float:
    """Milliseconds per call of `calls` captured in one CUDA graph (GPU time only, no launch overhead)."""
    return graph_time(lambda: [f() for f in calls], iters=reps) * 1e3 / len(calls)


def copy_bandwidth(dev: str) -> float:
    """Device-to-device copy GB/s (read + write bytes)."""
    n = (1 << 30) if dev == "cuda" else (1 << 24)
    src = torch.empty(n, dtype=torch.uint8, device=dev)
    dst = torch.empty_like(src)
    ms = median_ms(lambda: dst.copy_(src), 10)
    return 2 * n / ms / 1e6


def dequant_bf16(packed: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """Fast torch dequantization (baseline): packed [N, K/2] + E8M0 [N, K/32] -> bf16 [N, K]."""
    table = torch.tensor(E2M1_VALUES, dtype=torch.bfloat16, device=packed.device)
    u = packed.view(torch.uint8)
    w = table[torch.stack([u & 15, u >> 4], -1).flatten(-2).long()]
    s = torch.exp2(scale.view(torch.uint8).to(torch.float32) - 127).to(torch.bfloat16)
    return (w.view(*s.shape, 32) * s[..., None]).flatten(-2)


def torch_moe(x: torch.Tensor, ids: torch.Tensor, tw: torch.Tensor, expert: Callable[[int], tuple],
              limit: float) -> torch.Tensor:
    """Per-expert torch MoE; expert(e) returns bf16 (w13 [2I, H], w2 [H, I])."""
    out = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
    for e in torch.unique(ids).tolist():
        tok, slot = torch.nonzero(ids == e, as_tuple=True)
        w13, w2 = expert(e)
        g, u = (x[tok] @ w13.T).chunk(2, dim=-1)
        a = torch.nn.functional.silu(g.clamp(max=limit)) * u.clamp(-limit, limit)
        out.index_add_(0, tok, (a @ w2.T).float() * tw[tok, slot, None])
    return out.to(torch.bfloat16)


def gemv_baseline(row: dict, base, x: torch.Tensor, experts: tuple[torch.Tensor, ...],  # noqa: ANN001
                  draws: list, limit: float, out: torch.Tensor, wbytes: float, copy_bw: float, dev: str) -> None:
    """Time the --gemv-baseline module's GEMV with its default tiles on the same inputs (CUDA graph on the
    GPU) and compare its output bits with this tree's; fills row["baseline_*"] and prints a line."""
    w13, s13, w2, s2 = experts
    w13w, w2w = gv.words_view(w13), gv.words_view(w2)
    emulate = dev != "cuda"

    def run(mod, j: int, dst: torch.Tensor) -> torch.Tensor:  # noqa: ANN001
        ids, tw = draws[j]
        return mod.mxfp4_moe_gemv(x, w13w, s13, w2w, s2, False, ids, tw, limit, 1.0, dst, mod.DEFAULT_GEMV_CONFIG,
                                  emulate)

    mine = run(gv, 0, torch.full_like(out, float("nan"))).clone()
    theirs = run(base, 0, torch.full_like(out, float("nan")))
    row["baseline_identical"] = bool(torch.equal(mine, theirs))
    if dev == "cuda":
        ms = graph_bench([lambda j=j: run(base, j, out) for j in range(len(draws))])
    else:
        ms = median_ms(lambda: run(base, 0, out), 2)
    row["baseline_ms"] = ms
    row["baseline_pct_copy"] = 100 * wbytes / ms / 1e6 / copy_bw
    print(f"         baseline {ms * 1e3:9.1f} us {'CUDA graph' if dev == 'cuda' else 'eager'} "
          f"({row['baseline_pct_copy']:5.1f}% of copy), its tiles {tuple(base.DEFAULT_GEMV_CONFIG.__dict__.values())}; "
          f"output bits {'identical' if row['baseline_identical'] else 'DIFFER  <-- FAIL'}")


def bench_tokens(t: int, args: argparse.Namespace, dev: str, experts: tuple[torch.Tensor, ...],
                 resident: list | None, per_expert: int, fp8_per_expert: int, copy_bw: float) -> dict:
    """Time one token count; returns the row printed."""
    w13, s13, w2, s2 = experts
    h, e, k = args.hidden, args.experts, args.topk
    limit = 10.0
    x = torch.randn(t, h, device=dev).bfloat16()
    draws = []
    for _ in range(args.routings):
        ids = torch.argsort(torch.rand(t, e, device=dev), dim=1)[:, :k].to(torch.int32)
        tw = torch.softmax(torch.randn(t, k, device=dev), -1)
        draws.append((ids, tw))
    uniq = sum(int(torch.unique(ids).numel()) for ids, _ in draws) / len(draws)
    wbytes = uniq * per_expert
    out = torch.empty(t, h, dtype=torch.bfloat16, device=dev)
    row: dict = {"T": t, "unique_experts": uniq, "weight_MB": wbytes / 1e6}

    def call(cfg: mm.MoeConfig | gv.GemvMoeConfig | None = None, state: list = [0]) -> None:  # noqa: B006
        state[0] = (state[0] + 1) % len(draws)
        ids, tw = draws[state[0]]
        mm.mxfp4_moe(x, w13, s13, w2, s2, ids, tw, limit, 1.0, config=cfg, out=out)

    def timed(label: str, cfg: mm.MoeConfig | gv.GemvMoeConfig, key: str) -> float:
        """Eager and (decode) CUDA-graph time of one path; prints a line and fills row[key*]."""
        ms = median_ms(lambda: call(cfg), 30 if dev == "cuda" else 2)
        row[f"{key}_ms"] = ms
        line = (f"         {label:<8} {ms * 1e3:9.1f} us eager ({100 * wbytes / ms / 1e6 / copy_bw:5.1f}% of copy)"
                f" cfg {tuple(cfg.__dict__.values())}")
        best = ms
        if dev == "cuda" and t <= 64:
            try:
                calls = [(lambda j=j: mm.mxfp4_moe(x, w13, s13, w2, s2, *draws[j], limit, 1.0, config=cfg, out=out))
                         for j in range(len(draws))]
                gms = graph_bench(calls)
                best = gms
                row[f"{key}_graph_ms"] = gms
                row[f"{key}_graph_pct_copy"] = 100 * wbytes / gms / 1e6 / copy_bw
                line += f" | CUDA graph {gms * 1e3:9.1f} us ({row[f'{key}_graph_pct_copy']:5.1f}% of copy)"
            except Exception as exc:  # noqa: BLE001 - report and go on: capture is informative only
                row[f"{key}_graph_error"] = repr(exc)
                line += f" | CUDA graph capture failed: {exc!r}"
        print(line)
        return best

    cfg = mm.pick_config(t * k, e)
    print(f"T={t:5d}: {uniq:6.1f} experts, {wbytes / 1e6:8.1f} MB of weights (distinct experts touched); "
          f"default dispatch: {'GEMV' if t * k <= gv.GEMV_MAX_SLOTS else 'tl.dot'}")
    row.update(config=cfg.__dict__)
    if t * k <= 1024:  # the GEMV launcher's limit; beyond GEMV_MAX_SLOTS it is timed for the crossover
        timed("GEMV", gv.DEFAULT_GEMV_CONFIG, "gemv")
        if args.baseline_module is not None:
            gemv_baseline(row, args.baseline_module, x, experts, draws, limit, out, wbytes, copy_bw, dev)
    ms = timed("tl.dot", cfg, "tldot")
    gbps = wbytes / ms / 1e6
    row.update(ms=ms, GBps=gbps, pct_copy=100 * gbps / copy_bw)
    if args.gemv_sweep and t * k <= 1024:
        row["gemv_sweep"] = []
        for c in GEMV_SWEEP:
            try:
                sms = timed("sweep", c, "sweep_last")
            except Exception as exc:  # noqa: BLE001 - a tile may not compile or fit on a target
                print(f"         sweep {tuple(c.__dict__.values())}: failed {exc!r}")
                continue
            row["gemv_sweep"].append({"config": c.__dict__, "ms": sms})
    fp8_ms = uniq * fp8_per_expert / copy_bw / 1e6
    row["fp8_bound_ms"] = fp8_ms
    print(f"         FP8-dequantized path at 100% of copy bandwidth (computed bound, not measured): "
          f"{fp8_ms * 1e3:9.1f} us")
    if args.sweep:
        row["sweep"] = []
        for c in SWEEP:
            try:
                sms = median_ms(lambda c=c: call(c), 20 if dev == "cuda" else 1)
            except Exception as exc:  # noqa: BLE001 - a config may exceed shared memory on a target
                print(f"         sweep {tuple(c.__dict__.values())}: failed {exc!r}")
                continue
            row["sweep"].append({"config": c.__dict__, "ms": sms})
            print(f"         sweep {tuple(c.__dict__.values())}: {sms * 1e3:9.1f} us "
                  f"({100 * wbytes / sms / 1e6 / copy_bw:5.1f}% of copy)")
    if not args.no_baseline:
        ids, tw = draws[0]
        dq = median_ms(lambda: torch_moe(x, ids, tw, lambda j: (dequant_bf16(w13[j], s13[j]),
                                                            dequant_bf16(w2[j], s2[j])), limit),
                   10 if dev == "cuda" else 1)
        row["dequant_matmul_ms"] = dq
        line = f"         baselines (one routing): dequant+matmul {dq * 1e3:9.1f} us"
        if resident is not None:
            rs = median_ms(lambda: torch_moe(x, ids, tw, lambda j: resident[j], limit), 10 if dev == "cuda" else 1)
            row["bf16_resident_ms"] = rs
            line += f", bf16-resident matmul {rs * 1e3:9.1f} us"
        print(line)
    if args.check:
        ids, tw = draws[0]
        got = mm.mxfp4_moe(x, w13, s13, w2, s2, ids, tw, limit, 1.0)
        ref = mm.mxfp4_moe_ref(x, w13, s13, w2, s2, ids, tw, limit, 1.0, dtype=torch.float32,
                               round_like_kernel=True)
        rel = float((got.float() - ref).norm() / ref.norm())
        row["check_rel_frobenius"] = rel
        print(f"         check vs rounding-faithful float32 reference: relative Frobenius {rel:.2e}"
              f"{'' if rel < 2 ** -8 else '  <-- FAIL (> 2^-8)'}")
    return row


def main() -> None:
    """Run the benchmark and print (and optionally save) the numbers."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", default="1,2,5,8,64,2048")
    ap.add_argument("--experts", type=int, default=384)
    ap.add_argument("--hidden", type=int, default=5120)
    ap.add_argument("--inter", type=int, default=2304)
    ap.add_argument("--topk", type=int, default=6)
    ap.add_argument("--routings", type=int, default=8, help="routing draws rotated per timed call")
    ap.add_argument("--sweep", action="store_true", help="also time the SWEEP tile configs")
    ap.add_argument("--gemv-sweep", action="store_true", help="also time the GEMV_SWEEP tiles of the decode GEMV")
    ap.add_argument("--no-baseline", action="store_true")
    ap.add_argument("--gemv-baseline", default="", metavar="FILE",
                    help="another mxfp4_moe_gemv.py to time and compare bits with (see the docstring)")
    ap.add_argument("--check", action="store_true", help="compare one call per T with the float32 torch reference")
    ap.add_argument("--json", default="")
    ap.add_argument("--cpu-smoke", action="store_true", help="tiny shapes on CPU under TRITON_INTERPRET=1")
    args = ap.parse_args()
    if args.cpu_smoke:
        if os.environ.get("TRITON_INTERPRET") != "1":
            raise SystemExit("--cpu-smoke needs TRITON_INTERPRET=1 in the environment")
        args.tokens, args.experts, args.hidden, args.inter, args.routings = "1,5,40", 8, 128, 64, 2
        args.check = True
    dev = "cpu" if args.cpu_smoke else "cuda"
    args.baseline_module = load_gemv_module(args.gemv_baseline) if args.gemv_baseline else None
    if dev == "cuda" and not torch.cuda.is_available():
        raise SystemExit("no CUDA device (use --cpu-smoke with TRITON_INTERPRET=1 for a CPU dry run)")
    h, i, e, k = args.hidden, args.inter, args.experts, args.topk
    torch.manual_seed(0)
    res: dict = {"date": datetime.date.today().isoformat(), "device": torch.cuda.get_device_name() if dev == "cuda"
                 else "cpu (smoke)", "torch": torch.__version__, "shape": {"H": h, "I": i, "E": e, "topk": k}}
    try:
        import triton

        res["triton"] = triton.__version__
    except ImportError:
        pass
    copy_bw = copy_bandwidth(dev)
    res["copy_GBps"] = copy_bw
    print(f"{res['device']}: copy bandwidth {copy_bw:.0f} GB/s (read+write); H={h} I={i} E={e} top-{k}")

    w13 = torch.randint(0, 256, (e, 2 * i, h // 2), dtype=torch.uint8, device=dev)
    s13 = torch.randint(117, 124, (e, 2 * i, h // 32), dtype=torch.uint8, device=dev)
    w2 = torch.randint(0, 256, (e, h, i // 2), dtype=torch.uint8, device=dev)
    s2 = torch.randint(117, 124, (e, h, i // 32), dtype=torch.uint8, device=dev)
    per_expert = (w13[0].numel() + s13[0].numel() + w2[0].numel() + s2[0].numel())
    # FP8 block-dequantized expert (SGLang's cast_e2m1fn_to_e4m3fn): 1 byte/weight + fp32 per 128x128.
    fp8_per_expert = 3 * h * i + 4 * ((2 * i // 128) * (h // 128) + (h // 128) * (i // 128))
    print(f"expert bytes: MXFP4 {per_expert / 1e6:.2f} MB, FP8-dequantized {fp8_per_expert / 1e6:.2f} MB "
          f"({fp8_per_expert / per_expert:.2f}x)")
    resident = None
    if not args.no_baseline:
        try:
            resident = [(dequant_bf16(w13[j], s13[j]), dequant_bf16(w2[j], s2[j])) for j in range(e)]
        except torch.OutOfMemoryError:
            print("bf16-resident baseline skipped: out of memory")
            resident = None
            if dev == "cuda":
                torch.cuda.empty_cache()
    rows = [bench_tokens(t, args, dev, (w13, s13, w2, s2), resident, per_expert, fp8_per_expert, copy_bw)
            for t in [int(v) for v in args.tokens.split(",")]]
    res["rows"] = rows
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
