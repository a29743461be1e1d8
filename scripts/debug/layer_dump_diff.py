"""Debug aid: where, module by module, does a demo server's decode part from its own prefill?

Starts `winport serve --demo` (V4.1 unless --demo-variant says otherwise) with SGLang's tensor dump
(`--debug-tensor-dump-output-folder`: every leaf module's output, one file per forward pass; SGLang
turns CUDA graphs off for it) and the radix cache off. Request A takes a few greedy tokens after a
prompt; request B prefills the prompt plus those tokens. Each decode pass of A computes one position
that B's prefill computes too, so every leaf output of the decode pass is compared with B's row at
that position, in execution order. A's prefill rows against B's are printed as the control (the same
computation at a different batch size). The first module whose decode/prefill gap jumps above the
control is where to look.
Usage: python scripts/debug/layer_dump_diff.py [--steps N] [--show K] [--dump-dir D] [serve args...]
On the GPU machine: bash scripts/gpu/serve_demo.sh --script scripts/debug/layer_dump_diff.py ...
(results of 2026-11-30 in scripts/bench/RESULTS.md).
"""

from __future__ import annotations

import argparse
import glob
import os
import sys
import tempfile
import time

import torch

sys.path.insert(0, ".")
from tests.serve._server import start, stop, wait_ready  # noqa: E402
from tests.serve.test_dspark_live import PROMPTS, _post  # noqa: E402


def _tensors(value: object) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for t in value if isinstance(t, torch.Tensor)]
    return []


def _gap(a: torch.Tensor, b: torch.Tensor) -> float:
    """max |a - b| / max |b|, in float64; inf where shapes differ or a value is not finite."""
    if a.shape != b.shape:
        return float("inf")
    a, b = a.double(), b.double()
    if not (torch.isfinite(a).all() and torch.isfinite(b).all()):
        return float("inf")
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))


def _row_gaps(small: dict, big: dict, rows: slice | int, ntok_small: int, ntok_big: int) -> dict[str, float]:
    """Per leaf output: the gap between `small` (a pass of ntok_small tokens, all rows) and the
    `rows` of `big` (a pass of ntok_big tokens). Outputs not laid out by token are left out."""
    out: dict[str, float] = {}
    for name, value in small.items():
        # `_next_layer` links a layer to the next, so each module is reached (and hooked) by several names.
        if name not in big or ".forward_batch_info." in name or "._next_layer" in name:
            continue
        for i, (a, b) in enumerate(zip(_tensors(value), _tensors(big[name]), strict=False)):
            if a.dim() == 0 or a.shape[0] != ntok_small or b.shape[0] != ntok_big or not a.is_floating_point():
                continue
            out[name if i == 0 else f"{name}[{i}]"] = _gap(a, b[rows])
    return out


def main() -> None:
    """Start the server, make the two requests, print the per-module gaps, stop it."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=4, help="greedy tokens of request A")
    ap.add_argument("--show", type=int, default=60, help="leaf outputs to print per comparison")
    ap.add_argument("--prompt", type=int, default=0, help="index into the DSpark test's prompts")
    ap.add_argument("--dump-dir", default=None, help="keep the dumps here (default: a temporary folder)")
    ns, serve = ap.parse_known_args()
    dump = ns.dump_dir or tempfile.mkdtemp(prefix="winport_dump_")
    passed = {k: v for k, v in os.environ.items() if k == "WINPORT_TRITON_ON_CPU" or k.startswith("SGLANG_OPT_")}
    # SGLang writes a pass when its "top-level module" returns; DeepSeek-V4 calls `self.model.forward`
    # directly (no hooks run), so the logits processor, which it calls as a module, ends each pass.
    passed["TENSOR_DUMP_TOP_LEVEL_MODULE_NAME"] = "logits_processor"
    variant = [] if "--demo-variant" in serve else ["--demo-variant", "v41"]
    t0 = time.time()
    srv = start(["--demo", "--max-running-requests", "1", *variant, *serve, "--", "--disable-radix-cache",
                 "--debug-tensor-dump-output-folder", dump], env=passed)
    try:
        wait_ready(srv)
        print(f"ready after {time.time() - t0:.0f} s", flush=True)
        ids = PROMPTS[ns.prompt]
        before = set(glob.glob(f"{dump}/*/Pass*.pt"))
        # Each pass is written when its logits are computed, before the response: no flush is needed.
        a = _post(srv, {"input_ids": ids, "sampling_params": {"max_new_tokens": ns.steps, "temperature": 0,
                                                              "ignore_eos": True}})["output_ids"]
        print(f"A done after {time.time() - t0:.0f} s: {a}", flush=True)
        _post(srv, {"input_ids": ids + a[:-1], "sampling_params": {"max_new_tokens": 1, "temperature": 0}})
        print(f"B done after {time.time() - t0:.0f} s", flush=True)
        files = sorted(set(glob.glob(f"{dump}/*/Pass*.pt")) - before)
        passes = [torch.load(f, weights_only=False) for f in files]
        if not passes:
            sys.exit(f"no tensor dump was written; the server said:\n{srv.text()[-4000:]}")
        _report(passes, len(ids), ns.steps, ns.show)
    finally:
        stop(srv)


def _report(passes: list[dict], n_a: int, steps: int, show: int) -> None:
    """Print, per decode pass of request A, each leaf output's gap to B's prefill row."""
    def ntok(p: dict) -> int:
        for name, value in p.items():
            if name.endswith("embed_tokens") or ".embed" in name:
                return _tensors(value)[0].shape[0]
        return -1

    sizes = [ntok(p) for p in passes]
    print("passes (tokens):", sizes, flush=True)
    n_b = n_a + steps - 1
    ia = sizes.index(n_a)
    ib = sizes.index(n_b, ia + 1)
    decodes = [i for i in range(ia + 1, ib) if sizes[i] == 1]
    print(f"A prefill pass {ia}, decode passes {decodes}, B prefill pass {ib}")
    control = _row_gaps(passes[ia], passes[ib], slice(0, n_a), n_a, n_b)
    for k, d in enumerate(decodes):
        gaps = _row_gaps(passes[d], passes[ib], slice(n_a + k, n_a + k + 1), 1, n_b)
        print(f"\n== decode step {k + 1} (position {n_a + k}) vs B's prefill row; control = A prefill vs B rows")
        print(f"{'module':70s} {'decode gap':>11s} {'control':>9s}")
        for name, g in list(gaps.items())[:show]:
            c = control.get(name, float("nan"))
            flag = "  <==" if g > 10 * max(c, 1e-3) else ""
            print(f"{name[-70:]:70s} {g:11.3e} {c:9.2e}{flag}", flush=True)


if __name__ == "__main__":
    main()
