"""Benchmark: DeepSeek-V4.1-Flash's per-token decode budget from measured component times, projected.

Reads the component times in `--inputs` (scripts/bench/decode_budget_h200.json: each one measured on
the H200 or a named CPU, with its source row of scripts/bench/RESULTS.md) and prints, per decode token
at batch 1 and per DSpark verify step (a block of 5 tokens): dense GEMMs, attention, indexer, GPU
experts, CPU experts, the wait for the CPU, kt-kernel's round trip, embedding and head, engram rows,
sampling, scheduler and launch overhead, and tok/s for 40 layers. `--workstation` projects the same
budget onto the users' machine, each assumption printed next to the line it drives:
- GPU lines that read memory scale with the card's bandwidth at the share of copy the H200 runs reached;
  launch-bound lines (attention, indexer, sampling, overhead, the round trip) are carried over as they are;
- CPU experts run at cores x one core's measured rate x the thread scaling measured on the H200 host,
  capped by the DRAM bandwidth's achievable share.
The hit rate (share of routes the GPU slots serve) is an input, not a measurement (the proxy's random
weights route uniformly); so is DSpark's acceptance length (the demo draft's random weights accept
almost nothing). Each (hit rate, acceptance) pair is its own row.

Per layer: dense + attention + max(GPU experts, CPU experts + round trip) x the measured overlap.
Distinct experts of a verify block assume tokens route independently (real text repeats experts
across neighbouring tokens, so this overstates the CPU's share of a block).

This is the projection half of the budget: the measuring half (one run of the full-width proxy that
times every line in the same process) is not built; `--inputs` is where its output would go.

Usage: python scripts/bench/decode_budget.py [--inputs FILE] [--workstation] [--hit-rates 0.70,0.85,0.95]
       [--accept 2.0,2.5] [--slots 87] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import dataclass
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)
INPUTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "decode_budget_h200.json")
FORMAT = "winport-decode-budget-inputs/1"
BLOCK = 5  # DSpark's verify block
DRAFT_LAYERS = 3  # DSpark's draft stages, priced as dense layers (not measured)
# Where one core's kt-kernel rate comes from, printed next to the lines it drives.
CORE_SOURCE = "measured on a Xeon core of the dev VM with kt-kernel's avx512_bf16 build, not on Zen 4"
GOALS = {"without DSpark": 70.0, "with DSpark": 100.0}  # tok/s at 85% hits (issue 24)


@dataclass(frozen=True)
class Machine:
    """Where the budget is priced: the GPU's bandwidth, the CPU's cores and DRAM."""

    name: str
    gpu_gbs: float  # achievable copy bandwidth (read + write)
    cores: int  # kt-kernel threads
    pair_ms: dict[int, float]  # one core's kt-kernel milliseconds per (expert, token) pair, by batch
    threads_scaling: float
    dram_gbs: float  # achievable DRAM read bandwidth


@dataclass(frozen=True)
class Model:
    """The shapes the budget needs (DeepSeek-V4.1-Flash)."""

    layers: int
    index_layers: int
    experts: int
    top_k: int
    expert_bytes: int  # MXFP4, on the GPU and in kt-kernel
    head_bytes: int


def v41_flash() -> Model:
    """V4.1-Flash's shapes, from its config (tests/placement/v41_flash.py)."""
    from tests.placement.v41_flash import v41_flash_config
    from winport.placement.model_bytes import model_bytes

    cfg = v41_flash_config()
    m = model_bytes(cfg)
    return Model(layers=cfg["num_hidden_layers"], index_layers=len(cfg["index_source_layer_ids"]),
                 experts=cfg["n_routed_experts"], top_k=cfg["num_experts_per_tok"], expert_bytes=m.expert_mxfp4,
                 head_bytes=cfg["vocab_size"] * cfg["hidden_size"] * 2)


def load_inputs(path: str) -> dict[str, Any]:
    """The measured values of an inputs file (`value` of each entry), checked for the format."""
    with open(path, encoding="utf-8") as f:
        doc = json.load(f)
    if doc.get("format") != FORMAT:
        raise SystemExit(f"{path}: format {doc.get('format')!r}, expected {FORMAT!r}")
    try:
        return {k: v["value"] for k, v in doc["measured"].items()}
    except (KeyError, TypeError) as exc:
        raise SystemExit(f"{path}: every entry of 'measured' needs a 'value' ({exc})") from None


def pair_ms(core_ms: dict[str, float], top_k: int) -> dict[int, float]:
    """One core's milliseconds per (expert, token) pair by batch, from kt-kernel's measured batch times
    (kt-kernel's cost follows the pairs: at batch 1 each pair is one expert read; above it, a pair cost
    1.8x batch 1's in the measurement, whatever the overlap of experts between tokens)."""
    return {int(b): float(ms) / (int(b) * top_k) for b, ms in core_ms.items()}


def at_batch(table: dict[int, float], batch: int) -> float:
    """A per-batch figure at `batch` tokens: the measured batch at or above it, else the largest."""
    sizes = sorted(table)
    return table[next((b for b in sizes if b >= batch), sizes[-1])]


def distinct(pool: int, per_token: float, tokens: int) -> float:
    """Expected distinct experts of a pool of `pool` read by `tokens` tokens routing `per_token` of
    their top-k into it, uniformly and independently."""
    if pool <= 0 or per_token <= 0:
        return 0.0
    return pool * (1.0 - (1.0 - per_token / pool) ** tokens)


@dataclass
class Step:
    """One forward's milliseconds: `lines` sum to the step; `moe` splits the routed-experts line."""

    lines: dict[str, float]
    moe: dict[str, float]
    gpu_experts_read: float  # distinct experts a layer
    cpu_experts_read: float

    @property
    def ms(self) -> float:
        """The step's milliseconds."""
        return sum(self.lines.values())


def budget(inp: dict[str, Any], model: Model, machine: Machine, hit: float, slots: int, tokens: int,
           scale: float) -> Step:
    """One forward over `tokens` tokens (1: a decode step, BLOCK: a verify step). `scale` is the H200's
    copy bandwidth over the machine's (1.0 on the H200)."""
    t = "t1" if tokens == 1 else "t5"
    dense = inp[f"dense_layer_us_{t}"] / 1e3 * scale
    attention = inp[f"attention_layer_us_{t}"] / 1e3
    gpu_n = distinct(slots, model.top_k * hit, tokens)
    cpu_n = distinct(model.experts - slots, model.top_k * (1.0 - hit), tokens)
    gpu = gpu_n * model.expert_bytes / (machine.gpu_gbs * inp[f"gpu_moe_copy_share_{t}"]) / 1e6
    pairs = tokens * model.top_k * (1.0 - hit)
    cpu = max(pairs * at_batch(machine.pair_ms, tokens) / (machine.cores * machine.threads_scaling),
              cpu_n * model.expert_bytes / machine.dram_gbs / 1e6)
    trip = inp["kt_round_trip_ms"] if slots < model.experts else 0.0
    moe = max(gpu, cpu + trip) * inp["overlap"]
    n = model.layers
    lines = {
        "dense GEMMs": n * dense,
        "attention": n * attention,
        "indexer": model.index_layers * inp["indexer_us"] / 1e3,
        "routed experts": n * moe,
        "embedding and head": model.head_bytes / (machine.gpu_gbs * inp["head_copy_share"]) / 1e6,
        "engram rows": 0.0,
        "sampling": inp["sampling_ms"],
        "scheduler and launch": inp["overhead_ms"],
    }
    split = {"GPU experts": n * gpu, "CPU experts": n * cpu, "kt-kernel round trip": n * trip,
             "the wait (GPU idle for the CPU)": n * max(0.0, moe - gpu)}
    return Step(lines, split, gpu_n, cpu_n)


def derived(inp: dict[str, Any], model: Model) -> dict[str, Any]:
    """Inputs derived from others: the head's share of copy (the dense GEMV's) and the overhead the
    proxy's step leaves beyond its two layers and head (a lower bound: its experts may have sat in L3)."""
    out = dict(inp)
    out["head_copy_share"] = inp["dense_layer_bytes"] / (inp["dense_layer_us_t1"] * 1e-6) / (inp["copy_gbs"] * 1e9)
    head_ms = model.head_bytes / (inp["copy_gbs"] * out["head_copy_share"]) / 1e6
    layer_gpu = (inp["dense_layer_us_t1"] + inp["attention_layer_us_t1"]) / 1e3
    out["overhead_ms"] = max(0.0, inp["proxy_token_ms"] - 2 * (inp["proxy_layer_ms"] + layer_gpu) - head_ms)
    return out


def machines(inp: dict[str, Any], model: Model, args: argparse.Namespace) -> list[tuple[Machine, float, list[str]]]:
    """The H200 host as measured and, with --workstation, the users' machine; with the assumptions."""
    core = pair_ms(inp["kt_core_ms"], model.top_k)
    rate = model.expert_bytes / (core[1] * 1e-3) / 1e9  # GB/s of one core at batch 1, for the notes
    h200 = Machine("H200 + its host", inp["copy_gbs"], args.h200_threads, core, inp["kt_threads_scaling"],
                   args.h200_dram_gbs)
    out = [(h200, 1.0, [f"kt-kernel on {args.h200_threads} threads of the host at {inp['kt_threads_scaling']:.2f} "
                        f"of threads x one core's rate ({rate:.1f} GB/s at batch 1, per pair 1.8x that above it: {CORE_SOURCE})",
                        f"DRAM cap {args.h200_dram_gbs:.0f} GB/s (assumed)"])]
    if args.workstation:
        share = inp["copy_gbs"] / args.h200_spec_gbs
        gbs = args.card_gbs * share
        dram = args.channels * args.mts * 8 / 1e3 * args.dram_share
        ws = Machine("RTX PRO 6000 + Threadripper PRO 7965WX", gbs, args.cores, core, inp["kt_threads_scaling"], dram)
        out.append((ws, inp["copy_gbs"] / gbs, [
            f"GPU {args.card_gbs:.0f} GB/s spec x {share:.3f} (the H200's measured copy {inp['copy_gbs']:.0f} over its "
            f"{args.h200_spec_gbs:.0f} spec) = {gbs:.0f} GB/s; memory-bound GPU lines scale by {inp['copy_gbs'] / gbs:.2f}x",
            "launch-bound lines (attention, indexer, sampling, scheduler, kt-kernel's round trip) as on the H200",
            f"kt-kernel on {args.cores} Zen 4 cores at {rate:.1f} GB/s a core at batch 1 ({CORE_SOURCE}) x "
            f"{inp['kt_threads_scaling']:.2f} thread scaling (the H200 host's)",
            f"DRAM {args.channels} channels of DDR5-{args.mts} = {args.channels * args.mts * 8 / 1e3:.0f} GB/s x "
            f"{args.dram_share:.2f} achievable = {dram:.0f} GB/s cap for the CPU experts",
        ]))
    return out


def rows(inp: dict[str, Any], model: Model, args: argparse.Namespace) -> list[dict[str, Any]]:
    """One row per machine x hit rate x DSpark setting."""
    out = []
    for machine, scale, notes in machines(inp, model, args):
        for hit in args.hit_rates:
            step = budget(inp, model, machine, hit, args.slots, 1, scale)
            verify = budget(inp, model, machine, hit, args.slots, BLOCK, scale)
            draft = DRAFT_LAYERS * (inp["dense_layer_us_t5"] * scale + inp["attention_layer_us_t5"]) / 1e3
            verify_ms = verify.ms + draft
            row = {"machine": machine.name, "notes": notes, "hit_rate": hit, "slots": args.slots,
                   "decode": step.lines, "decode_moe": step.moe, "decode_ms": step.ms, "decode_tok_s": 1e3 / step.ms,
                   "experts_read": (step.gpu_experts_read, step.cpu_experts_read),
                   "verify": verify.lines, "verify_moe": verify.moe, "draft_ms": draft, "verify_ms": verify_ms,
                   "dspark": {}}
            for accept in args.accept:
                row["dspark"][accept] = accept * 1e3 / verify_ms
            out.append(row)
    return out


def table(rs: list[dict[str, Any]]) -> str:
    """The budget as text: each machine's assumptions, then per hit rate the lines of a decode step."""
    out, seen = [], set()
    for r in rs:
        if r["machine"] not in seen:
            seen.add(r["machine"])
            out.append(f"\n== {r['machine']} ==")
            out += [f"  assumes: {n}" for n in r["notes"]]
        gpu_n, cpu_n = r["experts_read"]
        out.append(f"-- hit rate {r['hit_rate']:.0%} ({r['slots']} GPU slots a layer; a decode step reads "
                   f"{gpu_n:.2f} experts a layer on the GPU, {cpu_n:.2f} on the CPU) --")
        for k, v in r["decode"].items():
            out.append(f"  {k:<34}{v:8.2f} ms" + ("  (not measured: 0)" if k == "engram rows" else ""))
            if k == "routed experts":
                out += [f"    {kk:<32}{vv:8.2f} ms" for kk, vv in r["decode_moe"].items()]
        out.append(f"  {'decode step':<34}{r['decode_ms']:8.2f} ms  -> {r['decode_tok_s']:.1f} tok/s")
        spec = ", ".join(f"accept {a:g}: {v:.1f} tok/s" for a, v in r["dspark"].items())
        out.append(f"  {'DSpark verify step (5 tokens)':<34}{r['verify_ms']:8.2f} ms (draft {r['draft_ms']:.2f} ms, "
                   f"priced) -> {spec}")
    return "\n".join(out)


def verdict(rs: list[dict[str, Any]], hit: float = 0.85) -> list[str]:
    """The issue's goals at `hit` on the last machine priced, and the largest line in the way."""
    row = next((r for r in reversed(rs) if abs(r["hit_rate"] - hit) < 1e-9), None)
    if row is None:
        return [f"no row at {hit:.0%} hits: the goals are judged there"]
    best = max(row["dspark"].values(), default=0.0)
    # the routed-experts line by its parts; the wait is made of the others, so it is not one of them
    lines = {**{k: v for k, v in row["decode"].items() if k != "routed experts"},
             **{k: v for k, v in row["decode_moe"].items() if not k.startswith("the wait")}}
    top = sorted(lines.items(), key=lambda kv: -kv[1])[:3]
    plain = row["decode_tok_s"]
    spec = max(best, plain)
    return [
        f"{row['machine']} at {hit:.0%} hits: {plain:.1f} tok/s without DSpark (goal {GOALS['without DSpark']:.0f}: "
        f"{'met' if plain >= GOALS['without DSpark'] else 'not met'}), {spec:.1f} with DSpark where it pays "
        f"(goal {GOALS['with DSpark']:.0f}: {'met' if spec >= GOALS['with DSpark'] else 'not met'})",
        "largest lines of a decode step: " + ", ".join(f"{k} {v:.2f} ms" for k, v in top),
    ]


def model_check(inp: dict[str, Any], model: Model, machine: Machine) -> tuple[float, float]:
    """(modelled, measured) ms of the routed experts of one layer with 71 slots and uniform routing on
    the H200 host, the one hybrid layer measured whole: how far the budget's expert model is off."""
    slots = 71
    step = budget(inp, model, machine, slots / model.experts, slots, 1, 1.0)
    return step.lines["routed experts"] / model.layers, float(inp["layer_71_ms"])


def levers(inp: dict[str, Any], model: Model, machine: Machine, scale: float, slots: int,
           hit: float = 0.85) -> list[tuple[str, float]]:
    """tok/s of a decode step at `hit` as the largest lines come down one after the other: kt-kernel's
    round trip gone, the GPU experts at issue 23's goal (70% of copy), the CPU experts at the DRAM cap."""
    steps: list[tuple[str, float]] = [("as measured", 1e3 / budget(inp, model, machine, hit, slots, 1, scale).ms)]
    inp = {**inp, "kt_round_trip_ms": 0.0}
    steps.append(("without kt-kernel's round trip", 1e3 / budget(inp, model, machine, hit, slots, 1, scale).ms))
    inp = {**inp, "gpu_moe_copy_share_t1": 0.70}
    steps.append(("+ GPU experts at 70% of copy", 1e3 / budget(inp, model, machine, hit, slots, 1, scale).ms))
    fast = Machine(machine.name, machine.gpu_gbs, machine.cores, {b: 0.0 for b in machine.pair_ms},
                   machine.threads_scaling, machine.dram_gbs)
    steps.append(("+ CPU experts at the DRAM cap", 1e3 / budget(inp, model, fast, hit, slots, 1, scale).ms))
    return steps


def main(argv: list[str] | None = None) -> None:
    """Print the budget (and --json)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--inputs", default=INPUTS)
    ap.add_argument("--workstation", action="store_true", help="also project onto the users' machine")
    ap.add_argument("--hit-rates", type=lambda s: [float(x) for x in s.split(",")], default=[0.70, 0.85, 0.95])
    ap.add_argument("--accept", type=lambda s: [float(x) for x in s.split(",")], default=[1.5, 2.0, 2.5],
                    help="DSpark acceptance lengths, bonus token included (the seed port's maximum is 3)")
    ap.add_argument("--slots", type=int, default=87, help="GPU expert slots a layer (winport plan: 87 MXFP4 at 80 of 96 GiB)")
    ap.add_argument("--h200-threads", type=int, default=14)
    ap.add_argument("--h200-dram-gbs", type=float, default=200.0)
    ap.add_argument("--h200-spec-gbs", type=float, default=4800.0)
    ap.add_argument("--card-gbs", type=float, default=1792.0, help="RTX PRO 6000 Blackwell memory bandwidth, spec")
    ap.add_argument("--cores", type=int, default=22, help="kt-kernel threads on the 24-core 7965WX (cores - 2, the CUDA default)")
    ap.add_argument("--channels", type=int, default=8)
    ap.add_argument("--mts", type=int, default=6000)
    ap.add_argument("--dram-share", type=float, default=0.75, help="achievable share of the DRAM peak (assumed)")
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    for h in a.hit_rates:
        if not 0.0 <= h <= 1.0:
            raise SystemExit(f"--hit-rates: {h} is not a share between 0 and 1")
    model = v41_flash()
    if not 0 <= a.slots <= model.experts:
        raise SystemExit(f"--slots {a.slots}: a count of experts a layer, 0 to {model.experts}")
    inp = derived(load_inputs(a.inputs), model)
    rs = rows(inp, model, a)
    print(f"inputs: {a.inputs}; scheduler and launch overhead {inp['overhead_ms']:.2f} ms a token, derived from the "
          "2-layer proxy's step (a lower bound); CUDA graphs assumed on (the V4.1 GGUF's engram tables read from the "
          "host map turn them off today, which this budget does not price)")
    print(table(rs))
    for line in verdict(rs):
        print(line)
    modelled, measured = model_check(inp, model, machines(inp, model, a)[0][0])
    print(f"model check: one hybrid layer, 71 slots, uniform routing, H200 host: routed experts modelled "
          f"{modelled:.2f} ms vs measured {measured:.2f} ms ({modelled / measured:.2f}x)")
    machine, scale, _ = machines(inp, model, a)[-1]
    print(f"levers on {machine.name} at 85% hits: " + "; ".join(
        f"{what} {tok_s:.1f} tok/s" for what, tok_s in levers(inp, model, machine, scale, a.slots)))
    if a.json:
        with open(a.json, "w", encoding="utf-8") as f:
            json.dump({"inputs": inp, "rows": rs}, f, indent=1, default=str)


if __name__ == "__main__":
    main()
