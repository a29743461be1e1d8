"""Benchmark: the hot-expert refresh interval and decay on a synthetic V4.1-Flash routing stream.

No model runs: one MoE layer's routes (384 experts, top 6, one token a decode step) are drawn from a
popularity curve fitted to the static hit rates published for V4.1-Flash (5 / 16 / 32 / 64 slots a
layer serve 48 / 59 / 71 / 83% of routed tokens), over a permutation of the experts that changes every
`--phase` tokens (the text moves from code to prose, say). The GPU slots follow the decayed counts
through winport's own RouteCounts and plan_swaps (4 swaps a refresh, the margin its default or
`--margins`), with each refresh's swaps landing `--lag` steps later (the CUDA server's swaps complete a
few steps after the refresh that plans them: snapshot, side-stream writes, mapping). For each
(interval, decay, margin) it prints:
- the share of routes the slots served over the whole stream, and against the oracle (each phase's best
  static placement of the same slot count, measured on the same stream);
- the same over the first `--settle` tokens after each shift (how fast the slots follow);
- swaps a token and the MXFP4 bytes they copy (18.8 MB an expert), as GB/s at `--tok-s` decode.

Usage: python scripts/bench/hot_experts_sweep.py [--slots 87] [--tokens 12000] [--phase 3000]
       [--intervals 8,16,32,64] [--decays 0.98,0.99,0.995] [--margins 1.25,2] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

EXPERTS, TOP_K = 384, 6
EXPERT_MXFP4_BYTES = 18.8e6
# The published static hit rates (slots a layer -> share of routed tokens), the curve the stream fits.
PUBLISHED = {5: 0.48, 16: 0.59, 32: 0.71, 64: 0.83}


def popularity(a: float, s: float):  # type: ignore[no-untyped-def]
    """Route probability by popularity rank, proportional to (rank + a)^-s (float64 [EXPERTS])."""
    import torch

    w = (torch.arange(EXPERTS, dtype=torch.float64) + a) ** -s
    return w / w.sum()


def static_share(p, slots: int) -> float:  # type: ignore[no-untyped-def]
    """Share of top-k routes the `slots` most popular experts serve (routes drawn without replacement)."""
    import torch

    g = torch.Generator().manual_seed(0)
    draws = torch.multinomial(p.expand(4000, -1), TOP_K, replacement=False, generator=g)
    return float((draws < slots).double().mean())


def fit() -> tuple[float, float, float]:
    """(a, s, worst miss) of the grid point whose static shares come closest to PUBLISHED."""
    best = (0.0, 0.0, 1.0)
    for a in (0.5, 1.0, 2.0, 4.0, 8.0):
        for s in (0.6, 0.8, 1.0, 1.2, 1.4, 1.6, 1.8, 2.0):
            p = popularity(a, s)
            miss = max(abs(static_share(p, k) - v) for k, v in PUBLISHED.items())
            if miss < best[2]:
                best = (a, s, miss)
    return best


def stream(p, tokens: int, phase: int, seed: int):  # type: ignore[no-untyped-def]
    """(routes [tokens, TOP_K] of expert ids, the permutation of each phase)."""
    import torch

    g = torch.Generator().manual_seed(seed)
    ranks = torch.multinomial(p.expand(tokens, -1), TOP_K, replacement=False, generator=g)
    perms, out = [], torch.empty_like(ranks)
    for start in range(0, tokens, phase):
        perm = torch.randperm(EXPERTS, generator=g)
        perms.append(perm)
        out[start:start + phase] = perm[ranks[start:start + phase]]
    return out, perms


def simulate(routes, perms, phase: int, slots: int, interval: int, decay: float, lag: int,  # type: ignore[no-untyped-def]
             settle: int, margin: float | None = None) -> dict:
    """Slots following RouteCounts through plan_swaps, swaps landing `lag` steps after their refresh."""
    import torch

    from winport.hybrid.hot_experts import DEFAULT_MARGIN, RouteCounts, plan_swaps

    margin = DEFAULT_MARGIN if margin is None else margin

    counts = RouteCounts(EXPERTS, "cpu", decay)
    resident = list(range(slots))
    on_gpu = torch.zeros(EXPERTS + 1, dtype=torch.bool)
    on_gpu[resident] = True
    pending: list[tuple[int, list]] = []
    hits = settle_hits = settle_routes = swaps = 0
    oracle_hits = oracle_settle = 0
    oracle_sets = []
    for perm in perms:
        m = torch.zeros(EXPERTS + 1, dtype=torch.bool)
        m[perm[:slots]] = True
        oracle_sets.append(m)
    for t in range(routes.shape[0]):
        ids = routes[t]
        served = int(on_gpu[ids].sum())
        best = int(oracle_sets[t // phase][ids].sum())
        hits += served
        oracle_hits += best
        if t % phase < settle and t >= phase:
            settle_hits += served
            oracle_settle += best
            settle_routes += TOP_K
        counts.update(ids.view(1, TOP_K))
        while pending and pending[0][0] <= t:
            for sw in pending.pop(0)[1]:
                on_gpu[sw.into] = True
                resident[sw.slot] = sw.into
        if (t + 1) % interval == 0 and not pending:
            planned = plan_swaps(counts.read(), resident, margin, max_swaps=4)
            for sw in planned:  # retired at once: the CPU serves the old expert from now on
                on_gpu[sw.out] = False
                resident[sw.slot] = -1
            swaps += len(planned)
            if planned:
                pending.append((t + lag, planned))
    routes_n = routes.shape[0] * TOP_K
    return {"interval": interval, "decay": decay, "margin": margin, "slots": slots, "lag": lag, "share": hits / routes_n,
            "oracle": oracle_hits / routes_n, "settle_share": settle_hits / max(settle_routes, 1),
            "settle_oracle": oracle_settle / max(settle_routes, 1), "swaps_per_token": swaps / routes.shape[0]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--slots", type=int, default=87, help="GPU slots a layer (87: V4.1-Flash at 80 of 96 GiB, MXFP4)")
    ap.add_argument("--tokens", type=int, default=12000)
    ap.add_argument("--phase", type=int, default=3000, help="tokens between shifts of the hot set")
    ap.add_argument("--settle", type=int, default=500, help="tokens after a shift counted apart")
    ap.add_argument("--lag", type=int, default=4, help="decode steps from a refresh to its swaps landing")
    ap.add_argument("--intervals", default="8,16,32,64")
    ap.add_argument("--decays", default="0.98,0.99,0.995")
    ap.add_argument("--margins", default="", help="swap margins to try (default: plan_swaps' own)")
    ap.add_argument("--tok-s", type=float, default=40.0, help="decode rate for the copy traffic column")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json")
    args = ap.parse_args()
    a, s, miss = fit()
    p = popularity(a, s)
    fitted = {k: static_share(p, k) for k in PUBLISHED}
    print(f"popularity (rank + {a})^-{s}: static shares "
          + ", ".join(f"{k} slots {fitted[k]:.1%} (published {v:.0%})" for k, v in PUBLISHED.items())
          + f"; worst miss {miss:.3f}; {args.slots} slots {static_share(p, args.slots):.1%}")
    routes, perms = stream(p, args.tokens, args.phase, args.seed)
    print(f"{args.tokens} tokens, hot set shifting every {args.phase}; {args.slots} slots of {EXPERTS}; "
          f"swaps land {args.lag} steps after their refresh; copy GB/s at {args.tok_s:.0f} tok/s, one layer")
    print(f"| interval | decay | margin | share | oracle | share / oracle | first {args.settle} after a shift | its oracle "
          "| swaps / token | copy GB/s a layer |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    rows = []
    for interval in (int(x) for x in args.intervals.split(",")):
        for decay, margin in ((float(d), float(m) if m else None) for d in args.decays.split(",")
                              for m in (args.margins.split(",") if args.margins else [""])):
            r = simulate(routes, perms, args.phase, args.slots, interval, decay, args.lag, args.settle, margin)
            r["copy_gbs"] = r["swaps_per_token"] * EXPERT_MXFP4_BYTES * args.tok_s / 1e9
            rows.append(r)
            print(f"| {interval} | {decay} | {r['margin']} | {r['share']:.1%} | {r['oracle']:.1%} | {r['share'] / r['oracle']:.3f} "
                  f"| {r['settle_share']:.1%} | {r['settle_oracle']:.1%} | {r['swaps_per_token']:.3f} "
                  f"| {r['copy_gbs']:.2f} |", flush=True)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"fit": {"a": a, "s": s, "worst_miss": miss, "shares": fitted}, "args": vars(args),
                       "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
