"""Benchmark: FP8 block-scaled GEMV (decode, M=1..16) and GEMM (prefill, M=2048) at V4.1-Flash shapes.

Prints, with rooflines measured in the same run:
- copy bandwidth (device-to-device copy, read + write bytes / time);
- per dense shape (N x K, [32,32] blocks): GEMV time and GB/s of weight (+ scale) bytes at M=1, % of
  copy bandwidth, and the sum over 40 layers for one decode token; torch._scaled_mm (per-tensor
  scales, M padded to 16: its minimum) and bf16 torch.matmul on the same shapes;
- prefill at M=2048: TFLOP/s of the Triton GEMM ([32,32] and [128,128]) vs bf16 torch.matmul;
- with --rows-sweep only: M = 2..8 (or --rows-m), the GEMV kernel's tiles against the default
  dispatch and the tl.dot path (`rows_sweep`);
- with --prefetch-sweep only: the default GEMV configs with L2 prefetch distances (`prefetch_sweep`).
Weights rotate over several copies (> L2) so the GEMV numbers are DRAM numbers, as in decode.
Usage: PYTHONPATH=. python3 scripts/bench/gemm.py [--sweep] [--prefill-sweep] [--no-prefill] [--baseline]
       [--rows-sweep [--rows-m 1,2,4] [--rows-tiles 4x2048w4r,2x8192w8rp2,...]]
       [--prefetch-sweep [--prefetch-dists 1,2,4]] [--json PATH]
WINPORT_FP8_GEMV_PDL=force|0 forces PDL on or off for every GEMV the run launches, over GemvConfig.pdl.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import re
import sys

import torch
import triton

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from roofline import median_ms  # noqa: E402  (sibling module: scripts/bench is on sys.path)

from kernels_triton.fp8_gemm import (  # noqa: E402
    GemmConfig,
    GemvConfig,
    default_config,
    default_gemv_config,
    fp8_block_gemm,
)

SMALL_M = (2, 3, 4, 5, 6, 8, 16)  # decode batches / speculative verify blocks timed with the defaults
DOT_M = (2, 3, 4)  # ... and with the tl.dot split-K path forced
SHAPES = [(25600, 6144), (16384, 1280), (5120, 4096), (4096, 1280), (5120, 1152), (2304, 5120), (1792, 5120)]
LAYERS = 40
FP8 = torch.float8_e4m3fn
# (block_m, block_n, block_k, split, warps, stages, dequant, group_m) candidates for M = 2048
PREFILL_SWEEP = {
    32: [GemmConfig(128, 128, 32, 1, 8, 4, False), GemmConfig(128, 128, 32, 1, 4, 5, False),
         GemmConfig(128, 128, 64, 1, 8, 3, True), GemmConfig(128, 128, 128, 1, 8, 3, True),
         GemmConfig(128, 256, 64, 1, 8, 3, True), GemmConfig(64, 128, 64, 1, 4, 4, True)],
    128: [GemmConfig(128, 128, 128, 1, 8, 3, False), GemmConfig(128, 128, 128, 1, 4, 4, False),
          GemmConfig(128, 256, 128, 1, 8, 3, False), GemmConfig(64, 128, 128, 1, 4, 4, False)],
}


def graph_bench(calls: list, reps: int = 20) -> float:
    """Milliseconds per call of `calls`, captured in one CUDA graph (as SGLang's decode runs): no
    Python/launch overhead in the number, only GPU time."""
    for f in calls:  # compile + warm up outside the capture
        f()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for f in calls:
            f()
    return median_ms(g.replay, reps) / len(calls)


def copy_bandwidth() -> float:
    src = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    ms = median_ms(lambda: dst.copy_(src), 20)
    return 2 * src.numel() / ms / 1e6  # GB/s


class Weights:
    """`copies` independent FP8 weights of one shape (cycled so the L2 never holds the next one)."""

    def __init__(self, n: int, k: int, bn: int, bk: int, copies: int):
        self.n, self.k, self.bn, self.bk = n, k, bn, bk
        self.w = [torch.randn(n, k, device="cuda").to(FP8) for _ in range(copies)]
        self.s = [torch.rand(-(-n // bn), -(-k // bk), device="cuda") * 1e-3 + 1e-4 for _ in range(copies)]
        self.i = 0

    def next(self) -> tuple[torch.Tensor, torch.Tensor]:
        self.i = (self.i + 1) % len(self.w)
        return self.w[self.i], self.s[self.i]

    def nbytes(self) -> int:
        return self.w[0].numel() + self.s[0].numel() * 4


def act(m: int, k: int, bk: int) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(m, k, device="cuda").to(FP8), torch.rand(m, -(-k // bk), device="cuda") * 1e-2 + 1e-3


def gemv_time(wts: Weights, m: int, cfg: GemmConfig | GemvConfig | None, repeat: int = 2) -> float:
    a, sa = act(m, wts.k, wts.bk)
    out = torch.empty(m, wts.n, dtype=torch.bfloat16, device="cuda")
    calls = [lambda w=w, s=s: fp8_block_gemm(a, sa, w, s, (wts.bn, wts.bk), out=out, config=cfg)
             for _ in range(repeat) for w, s in zip(wts.w, wts.s, strict=True)]
    return graph_bench(calls)


def scaled_mm_time(wts: Weights, m: int) -> float | None:
    mp = max(16, m)
    a = torch.randn(mp, wts.k, device="cuda").to(FP8)
    one = torch.ones((), device="cuda")
    try:
        return graph_bench([lambda w=w: torch._scaled_mm(a, w.t(), scale_a=one, scale_b=one,
                                                         out_dtype=torch.bfloat16) for w in wts.w * 2])
    except Exception as e:  # noqa: BLE001 - report, do not fail the benchmark
        print(f"  _scaled_mm unavailable: {type(e).__name__}: {str(e)[:120]}")
        return None


def pdl_mode(mode: str, fn):
    """fn() with WINPORT_FP8_GEMV_PDL=mode ("0": the M = 1 GEMV without programmatic dependent
    launch, "force": with it on every shape, "1": the shipped per-shape rule)."""
    old = os.environ.get("WINPORT_FP8_GEMV_PDL")
    os.environ["WINPORT_FP8_GEMV_PDL"] = mode
    try:
        return fn()
    finally:
        if old is None:
            del os.environ["WINPORT_FP8_GEMV_PDL"]
        else:
            os.environ["WINPORT_FP8_GEMV_PDL"] = old


def layer_sequence_time(mode: str, layers: int = 4, configs: dict | None = None) -> tuple[float, int]:
    """Milliseconds per layer of the seven M = 1 GEMVs run one after another in one CUDA graph, as a
    decode step issues them (each shape's own activation and output), over `layers` layers' distinct
    weights (~930 MB, so L2 never holds the next weight), and the bytes one layer reads. `configs`:
    (N, K) -> GemvConfig in place of the default dispatch."""
    per_layer = [[Weights(n, k, 32, 32, 1) for n, k in SHAPES] for _ in range(layers)]
    io = [(*act(1, k, 32), torch.empty(1, n, dtype=torch.bfloat16, device="cuda")) for n, k in SHAPES]
    cfgs = [(configs or {}).get(shape) for shape in SHAPES]
    calls = [lambda w=w, a=a, c=c: fp8_block_gemm(a[0], a[1], w.w[0], w.s[0], (32, 32), out=a[2], config=c)
             for layer in per_layer for w, a, c in zip(layer, io, cfgs, strict=True)]
    ms = pdl_mode(mode, lambda: graph_bench(calls)) * len(SHAPES)
    nbytes = sum(w.nbytes() for w in per_layer[0])
    del per_layer
    torch.cuda.empty_cache()
    return ms, nbytes


ROWS_SWEEP_M = (2, 3, 4, 5, 6, 8)
# (block_n, block_k, warps, x_row[, l2_prefetch])
ROWS_SWEEP_TILES = [(8, 512, 4, False), (8, 1024, 4, False), (8, 1024, 8, False), (8, 2048, 4, False),
                    (8, 2048, 8, False), (4, 1024, 4, False), (4, 2048, 4, False), (4, 4096, 4, False),
                    (2, 4096, 4, False), (2, 8192, 4, False), (16, 512, 8, False), (16, 1024, 8, False)]


def rows_sweep(sweep_tiles: list[tuple], ms: tuple[int, ...] = ROWS_SWEEP_M) -> list[dict]:
    """M = 2..8: per shape, the default dispatch, the tl.dot split-K path and every tile of
    `sweep_tiles` in the GEMV kernel (one split, PDL by the shipped rule); prints per-layer sums
    for each and each tile's mean time relative to the per-shape best (to choose a default rule)."""
    out = []
    sums: dict = {}
    rel: dict = {}
    dev = torch.device("cuda")
    for n, k in SHAPES:
        copies = max(2, int(3 * 60e6 // (n * k)) + 1)
        wts = Weights(n, k, 32, 32, copies)
        m1 = gemv_time(wts, 1, None)
        sums[("M1",)] = sums.get(("M1",), 0.0) + m1
        for m in ms:
            row = {"n": n, "k": k, "m": m, "m1_ms": m1, "default_ms": gemv_time(wts, m, None),
                   "dot_ms": gemv_time(wts, m, default_config(m, n, k, 32, 32, dev))}
            tiles = {}
            for bn_, bk_, w, x_row, *pf in sweep_tiles:
                if bk_ > max(512, triton.next_power_of_2(k)):
                    continue
                name = f"{bn_}x{bk_}w{w}{'r' if x_row else ''}{f'p{pf[0]}' if pf and pf[0] else ''}"
                try:
                    cfg = GemvConfig(bn_, bk_, 1, w, 1, None, x_row, pf[0] if pf else 0)
                    tiles[name] = gemv_time(wts, m, cfg, repeat=1)
                except Exception as e:  # noqa: BLE001 - report, keep sweeping
                    print(f"  M={m} {n}x{k} {name} failed: {type(e).__name__}: {str(e)[:80]}")
            if not tiles:  # every tile's K step is wider than this shape's rows
                continue
            best = min(tiles.items(), key=lambda kv: kv[1])
            row["tiles_ms"] = tiles
            row["best"] = best
            for key, t in tiles.items():
                rel.setdefault((m, key), []).append(t / best[1])
            for name, t in (("default", row["default_ms"]), ("dot", row["dot_ms"]), ("best", best[1])):
                sums[(name, m)] = sums.get((name, m), 0.0) + t
            out.append(row)
            print(f"M={m} {n:>6}x{k:<5}: M=1 {m1 * 1e3:.1f} | default {row['default_ms'] * 1e3:.1f} | tl.dot "
                  f"{row['dot_ms'] * 1e3:.1f} | best tile {best[0]} {best[1] * 1e3:.1f} us | top 3: "
                  + "; ".join(f"{c} {t * 1e3:.1f}" for c, t in sorted(tiles.items(), key=lambda kv: kv[1])[:3]))
        del wts
        torch.cuda.empty_cache()
    print(f"per layer M=1: {sums[('M1',)] * 1e3:.1f} us")
    for m in ms:
        line = (f"per layer M={m}: default {sums[('default', m)] * 1e3:.1f} us, "
                f"tl.dot {sums[('dot', m)] * 1e3:.1f} us, "
                f"best tile per shape {sums[('best', m)] * 1e3:.1f} us; tiles (mean time / best): ")
        tops = sorted(((sum(v) / len(v), key) for (mm, key), v in rel.items() if mm == m))[:4]
        print(line + "; ".join(f"{key} {r:.3f}" for r, key in tops))
    return out


def prefetch_sweep(dists: list[int], copy_bw: float) -> list[dict]:
    """M = 1 (and the M = 2, 3 defaults): each shape's default GEMV config against the same config
    with `GemvConfig.l2_prefetch` = d for each d in `dists` (PDL by the shipped rule, and off), then
    the seven shapes in turn in one graph with each shape's best distance."""
    dev = torch.device("cuda")
    out = []
    best_cfgs = {}
    sums: dict = {}
    for n, k in SHAPES:
        copies = max(2, int(3 * 60e6 // (n * k)) + 1)
        wts = Weights(n, k, 32, 32, copies)
        for m in (1, 2, 3):
            base = default_gemv_config(n, k, 32, dev, m)
            if base is None:
                continue
            row = {"n": n, "k": k, "m": m, "cfg": str(base), "ms": {}}
            for d in [0, *dists]:
                cfg = dataclasses.replace(base, l2_prefetch=d)
                row["ms"][d] = gemv_time(wts, m, cfg)
                if m == 1:
                    row["ms"][f"{d} no PDL"] = gemv_time(wts, m, dataclasses.replace(cfg, pdl=False))
            best = min((kv for kv in row["ms"].items() if isinstance(kv[0], int)), key=lambda kv: kv[1])
            row["best"] = best
            for key, t in row["ms"].items():
                sums[(m, key)] = sums.get((m, key), 0.0) + t
            sums[(m, "best")] = sums.get((m, "best"), 0.0) + best[1]
            if m == 1:
                best_cfgs[(n, k)] = dataclasses.replace(base, l2_prefetch=best[0])
            out.append(row)
            print(f"prefetch M={m} {n:>6}x{k:<5} {base}: " + " | ".join(f"d={key} {t * 1e3:.2f}" for key, t in row["ms"].items())
                  + f" us; best d={best[0]}")
        del wts
        torch.cuda.empty_cache()
    for m in (1, 2, 3):
        print(f"per layer M={m}: " + " | ".join(f"d={key} {t * 1e3:.1f}" for (mm, key), t in sums.items() if mm == m)
              + " us")
    for name, cfgs in (("defaults", None), ("best distance per shape", best_cfgs)):
        t, nbytes = layer_sequence_time("1", configs=cfgs)
        print(f"layer sequence in one graph, {name}: {t * 1e3:.1f} us per layer = "
              f"{100 * nbytes / t / 1e6 / copy_bw:.1f}% of copy")
        out.append({"sequence": name, "ms": t, "pct_copy": 100 * nbytes / t / 1e6 / copy_bw})
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sweep", action="store_true", help="try GEMV configs and report the best per shape")
    ap.add_argument("--no-prefill", action="store_true", help="skip the M=2048 part")
    ap.add_argument("--prefill-sweep", action="store_true", help="try the M=2048 GEMM configs too")
    ap.add_argument("--sweep-tiles", default="",
                    help="M=1 sweep tiles as BLOCK_NxBLOCK_K,... (default: the 2026-11-29 sweep's seven)")
    ap.add_argument("--rows-sweep", action="store_true",
                    help="only the M = 2..8 GEMV tile sweep against the default dispatch and the tl.dot path")
    ap.add_argument("--rows-tiles", default="",
                    help="tiles of --rows-sweep as BLOCK_NxBLOCK_KwWARPS[r][pD],... (r: x as one row, GemvConfig.x_row; "
                         "pD: L2 prefetch distance D, GemvConfig.l2_prefetch; "
                         "default: ROWS_SWEEP_TILES)")
    ap.add_argument("--rows-m", default=",".join(map(str, ROWS_SWEEP_M)), help="M values of --rows-sweep")
    ap.add_argument("--prefetch-sweep", action="store_true",
                    help="only the L2 prefetch distances of the default GEMV configs (M = 1..3)")
    ap.add_argument("--prefetch-dists", default="1,2,4,8", help="distances of --prefetch-sweep (K steps)")
    ap.add_argument("--baseline", action="store_true",
                    help="also time scripts/bench/_fp8_gemm_before.py's GEMV (the previous kernel), if present")
    ap.add_argument("--json", default=os.path.join(os.environ.get("OUT", "."), "gemm_bench.json"))
    args = ap.parse_args()
    dev = torch.cuda.get_device_name()
    print(f"# FP8 GEMM bench {datetime.date.today()} on {dev}, torch {torch.__version__}")
    print(f"# triton {triton.__version__}")
    res: dict = {"device": dev, "date": str(datetime.date.today())}
    copy_bw = copy_bandwidth()
    res["copy_GBps"] = copy_bw
    print(f"copy bandwidth: {copy_bw:.0f} GB/s (read+write)")

    if args.prefetch_sweep:
        res["prefetch_sweep"] = prefetch_sweep([int(d) for d in args.prefetch_dists.split(",")], copy_bw)
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)
        return
    if args.rows_sweep:
        tiles = ROWS_SWEEP_TILES
        if args.rows_tiles:
            specs = [re.fullmatch(r"(\d+)x(\d+)w(\d+)(r?)(?:p(\d+))?", t) for t in args.rows_tiles.split(",")]
            if None in specs:
                ap.error(f"--rows-tiles: cannot read {args.rows_tiles.split(',')[specs.index(None)]!r}")
            tiles = [(int(g[1]), int(g[2]), int(g[3]), g[4] == "r", int(g[5] or 0)) for g in specs]
        res["rows_sweep"] = rows_sweep(tiles, tuple(int(v) for v in args.rows_m.split(",")))
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)
        return
    # M = 1 GEMV sweep: (block_n, block_k) x warps x (no split, ~4 CTAs/SM of splits); the split
    # count is a runtime argument, so only split-or-not doubles the compiles.
    sweep_tiles = [(8, 256), (8, 512), (8, 1024), (8, 2048), (16, 512), (16, 1024), (32, 512)]
    if args.sweep_tiles:
        sweep_tiles = [tuple(int(v) for v in t.split("x")) for t in args.sweep_tiles.split(",")]
    sweep_cfgs = [(bn_, bk_, w) for bn_, bk_ in sweep_tiles for w in (4, 8)] if args.sweep else []
    sweep_hist: dict = {}
    before = None
    if args.baseline:
        # The GEMV kernel as committed before this change (an untracked copy the device run carries),
        # timed with its own default config in the same run: "before" next to "after".
        from winport.modfile import import_file

        path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_fp8_gemm_before.py")
        if os.path.exists(path):
            before = import_file("_fp8_gemm_before", path)

    rows = []
    total_ms = 0.0
    total_bytes = 0
    best_total = 0.0
    before_total = 0.0
    nopdl_total = 0.0
    small_sum: dict = {}
    dot_sum: dict = {}
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    for n, k in SHAPES:
        copies = max(2, int(3 * 60e6 // (n * k)) + 1)  # > 3x the 60 MB L2 per rotation
        wts = Weights(n, k, 32, 32, copies)
        ms = gemv_time(wts, 1, None)
        nopdl_ms = pdl_mode("0", lambda wts=wts: gemv_time(wts, 1, None))
        force_ms = pdl_mode("force", lambda wts=wts: gemv_time(wts, 1, None))
        best = (ms, "default " + str(default_gemv_config(n, k, 32, torch.device("cuda"))))
        before_ms = None
        if before is not None:
            a1, sa1 = act(1, k, 32)
            o1 = torch.empty(1, n, dtype=torch.bfloat16, device="cuda")
            before_ms = graph_bench([lambda w=w, s=s, a1=a1, sa1=sa1, o1=o1: before.fp8_block_gemm(a1, sa1, w, s, (32, 32), out=o1)
                                     for _ in range(2) for w, s in zip(wts.w, wts.s, strict=True)])
        if args.sweep:
            tops = []
            for bn_, bk_, w in sweep_cfgs:
                if bk_ > max(512, triton.next_power_of_2(k)):
                    continue
                tiles = -(-n // bn_)
                auto = max(1, min(-(-k // bk_), -(-4 * sms // tiles)))
                for split in sorted({1, auto}):
                    cfg = GemvConfig(bn_, bk_, split, w, 1)
                    try:
                        t = gemv_time(wts, 1, cfg, repeat=1)
                    except Exception as e:  # noqa: BLE001
                        print(f"  cfg {cfg} failed: {type(e).__name__}: {str(e)[:80]}")
                        continue
                    sweep_hist.setdefault((bn_, bk_, w, split == 1), []).append(t / ms)
                    tops.append((t, f"{bn_},{bk_},{split},{w},1"))
                    if t < best[0]:
                        best = (t, str(cfg))
            tops.sort()
            print(f"  best for {n}x{k}: {best[0] * 1e3:.1f} us {best[1]}; top 4: "
                  + "; ".join(f"{c} {t * 1e3:.1f}" for t, c in tops[:4]))
        best_total += best[0]
        before_total += before_ms or 0.0
        gbps = wts.nbytes() / ms / 1e6
        smm = scaled_mm_time(wts, 1)
        bfs = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) for _ in range(max(2, copies // 2))]
        xb = torch.randn(1, k, device="cuda", dtype=torch.bfloat16)
        bf_ms = graph_bench([lambda w=w: torch.matmul(xb, w.t()) for w in bfs * 2])  # noqa: B023
        del bfs
        small = {m: gemv_time(wts, m, None) for m in SMALL_M}
        # the tl.dot split-K path at the same M, forced (the default from M = 4 on; next to the GEMV
        # kernel that the defaults take for M = 2 and 3)
        dot_path = {m: gemv_time(wts, m, default_config(m, n, k, 32, 32, torch.device("cuda"))) for m in DOT_M}
        for m_ in SMALL_M:
            small_sum[m_] = small_sum.get(m_, 0.0) + small[m_]
        for m_ in dot_path:
            dot_sum[m_] = dot_sum.get(m_, 0.0) + dot_path[m_]
        nopdl_total += nopdl_ms
        rows.append({"n": n, "k": k, "ms": ms, "no_pdl_ms": nopdl_ms, "pdl_ms": force_ms, "GBps": gbps, "pct_copy": 100 * gbps / copy_bw,
                     "scaled_mm_ms_M16": smm, "bf16_matmul_ms_M1": bf_ms,
                     "best_sweep": best if args.sweep else None, "before_ms": before_ms,
                     **{f"ms_M{m}": t for m, t in small.items()},
                     **{f"dot_path_ms_M{m}": t for m, t in dot_path.items()}})
        total_ms += ms
        total_bytes += wts.nbytes()
        print(f"GEMV M=1 {n:>6}x{k:<5}: {ms * 1e3:7.1f} us {gbps:6.0f} GB/s ({100 * gbps / copy_bw:4.1f}% of copy)"
              f" | PDL off {nopdl_ms * 1e3:.1f} us ({100 * wts.nbytes() / nopdl_ms / 1e6 / copy_bw:.1f}%)"
              f" | PDL on {force_ms * 1e3:.1f} us ({100 * wts.nbytes() / force_ms / 1e6 / copy_bw:.1f}%)"
              f" | before: {'n/a' if before_ms is None else f'{before_ms * 1e3:.1f} us'}"
              f" | M={'/'.join(map(str, SMALL_M))}: {'/'.join(f'{small[m_] * 1e3:.1f}' for m_ in SMALL_M)} us"
              f" (tl.dot path M={'/'.join(map(str, DOT_M))}: {'/'.join(f'{dot_path[m_] * 1e3:.1f}' for m_ in DOT_M)})"
              f" | _scaled_mm(M=16, per-tensor): {'n/a' if smm is None else f'{smm * 1e3:.1f} us'}"
              f" | bf16 matmul M=1: {bf_ms * 1e3:.1f} us")
        del wts
        torch.cuda.empty_cache()
    layer_gbps = total_bytes / total_ms / 1e6
    if args.sweep:
        print(f"sweep best per shape, summed: {best_total * 1e3:.1f} us per layer "
              f"({100 * total_bytes / best_total / 1e6 / copy_bw:.1f}% of copy)")
        for key, rel in sorted(sweep_hist.items(), key=lambda kv: sum(kv[1]) / len(kv[1]))[:8]:
            print(f"  (bn, bk, warps, no-split)={key}: mean time / default = {sum(rel) / len(rel):.3f}")
    if before is not None:
        print(f"before (previous GEMV kernel, its defaults): {before_total * 1e3:.1f} us per layer "
              f"({100 * total_bytes / before_total / 1e6 / copy_bw:.1f}% of copy)")
    for m_ in SMALL_M:
        extra = f" (tl.dot path {dot_sum[m_] * 1e3:.1f} us)" if m_ in dot_sum else ""
        print(f"per layer at M={m_}: {small_sum[m_] * 1e3:.1f} us{extra}; 40 layers {small_sum[m_] * LAYERS:.2f} ms")
    res["gemv"] = rows
    res["per_layer_ms"] = total_ms
    res["per_token_40_layers_ms"] = total_ms * LAYERS
    print(f"per layer: {total_bytes / 1e6:.1f} MB in {total_ms * 1e3:.1f} us = {layer_gbps:.0f} GB/s "
          f"({100 * layer_gbps / copy_bw:.1f}% of copy); 40 layers: {total_ms * LAYERS:.2f} ms per decode token")
    print(f"per layer without PDL: {nopdl_total * 1e3:.1f} us "
          f"({100 * total_bytes / nopdl_total / 1e6 / copy_bw:.1f}% of copy)")
    res["per_layer_no_pdl_ms"] = nopdl_total
    for mode, name in (("1", "shipped rule"), ("0", "off"), ("force", "on everywhere")):
        t, nbytes = layer_sequence_time(mode)
        print(f"layer sequence in one graph (the 7 shapes in turn, 4 layers' weights rotated), PDL {name}: "
              f"{t * 1e3:.1f} us per layer = {100 * nbytes / t / 1e6 / copy_bw:.1f}% of copy; "
              f"40 layers {t * LAYERS:.2f} ms")
        res[f"layer_sequence_ms_pdl_{mode}"] = t

    if args.no_prefill:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)
        return
    # Prefill, M = 2048
    prow = []
    m = 2048
    for n, k in SHAPES:
        flops = 2 * m * n * k
        xb = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        wb = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
        bf_ms = graph_bench([lambda: torch.matmul(xb, wb.t())] * 3)  # noqa: B023
        entry = {"n": n, "k": k, "bf16_TFLOPs": flops / bf_ms / 1e9}
        for bn_, bk_ in ((32, 32), (128, 128)):
            wts = Weights(n, k, bn_, bk_, 1)
            t_best, c_best = gemv_time(wts, m, None, 3), "default"
            if args.prefill_sweep:
                for cfg in PREFILL_SWEEP[bk_]:
                    try:
                        t = gemv_time(wts, m, cfg, 3)
                    except Exception as e:  # noqa: BLE001
                        print(f"  cfg {cfg} failed: {type(e).__name__}")
                        continue
                    if t < t_best:
                        t_best, c_best = t, str(cfg)
                print(f"  prefill best {n}x{k} [{bn_},{bk_}]: {flops / t_best / 1e9:.0f} TFLOP/s {c_best}")
            entry[f"fp8_{bn_}_TFLOPs"] = flops / t_best / 1e9
            entry[f"fp8_{bn_}_cfg"] = c_best
        a = torch.randn(m, k, device="cuda").to(FP8)
        one = torch.ones((), device="cuda")
        try:
            smm = graph_bench([lambda: torch._scaled_mm(a, wts.w[0].t(), scale_a=one, scale_b=one,  # noqa: B023
                                                        out_dtype=torch.bfloat16)] * 3)
            entry["scaled_mm_TFLOPs"] = flops / smm / 1e9
        except Exception:  # noqa: BLE001
            entry["scaled_mm_TFLOPs"] = None
        prow.append(entry)
        sm_txt = "n/a" if entry["scaled_mm_TFLOPs"] is None else f"{entry['scaled_mm_TFLOPs']:.0f}"
        print(f"GEMM M=2048 {n:>6}x{k:<5}: fp8[32,32] {entry['fp8_32_TFLOPs']:6.0f} TFLOP/s "
              f"({100 * entry['fp8_32_TFLOPs'] / entry['bf16_TFLOPs']:3.0f}% of bf16), fp8[128,128] "
              f"{entry['fp8_128_TFLOPs']:6.0f} ({100 * entry['fp8_128_TFLOPs'] / entry['bf16_TFLOPs']:3.0f}%), "
              f"bf16 matmul {entry['bf16_TFLOPs']:6.0f}, _scaled_mm per-tensor {sm_txt}")
        torch.cuda.empty_cache()
    res["prefill"] = prow
    with open(args.json, "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
