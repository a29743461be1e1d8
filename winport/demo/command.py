"""`winport demo-model`: write the tiny DeepSeek-V4 demo checkpoint."""

from __future__ import annotations

import argparse
from pathlib import Path

from winport.demo.build import build_demo, default_dir, is_current


def main(argv: list[str] | None = None) -> int:
    """Build (or check) the demo model folder."""
    ap = argparse.ArgumentParser(prog="winport demo-model", description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=None, help="folder (default: the winport cache)")
    ap.add_argument("--variant", choices=["v4", "v41", "v41-vision"], default="v4")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--force", action="store_true", help="rebuild even when a current copy exists")
    ap.add_argument("--bf16", action="store_true",
                    help="write plain bf16 weights (the same values) instead of DeepSeek's FP8 dense + MXFP4 experts")
    ap.add_argument("--gguf", type=Path, default=None, metavar="OUT",
                    help="also write the model as a GGUF file (llama.cpp deepseek4 / deepseek41 names) at OUT")
    ap.add_argument("--q8-0", action="store_true", help="with --gguf: store dense linear weights as Q8_0")
    ap.add_argument("--mxfp4-experts", action="store_true",
                    help="with --gguf: store routed experts as MXFP4 (with --q8-0: UD-Q4_K_XL's mix)")
    ap.add_argument("--full-width", action="store_true",
                    help="with --variant v41: V4.1-Flash's real layer shapes with random weights (the "
                         "performance proxy, ~7 GB a layer; winport.demo.full_width)")
    ap.add_argument("--layers", type=int, default=2, help="with --full-width: decoder layers, 2 to 4 (default 2)")
    args = ap.parse_args(argv)
    if args.full_width:
        return _full_width(ap, args)
    # None: the variant's default (V4: FP8 + MXFP4). GGUF export reads the plain bf16 form.
    quantized = False if args.bf16 or args.gguf is not None else None
    out = args.out or default_dir(args.variant, quantized)
    if args.gguf is not None:
        from winport.gguf.export import export_demo_gguf

        if args.force or args.seed != 0 or not is_current(out, args.variant, quantized):
            build_demo(out, args.variant, args.seed, quantized=quantized)
        path = export_demo_gguf(args.gguf, dense_q8_0=args.q8_0, folder=out, variant=args.variant,
                                experts_mxfp4=args.mxfp4_experts)
        print(f"winport demo-model: wrote {path}")
        return 0
    if not args.force and args.seed == 0 and is_current(out, args.variant, quantized):
        print(f"winport demo-model: {out} is current")
        return 0
    build_demo(out, args.variant, args.seed, quantized=quantized)
    return 0


def _full_width(ap: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    from winport.demo.full_width import build_full_width, full_width_config
    from winport.paths import cache_dir

    if args.variant != "v41":
        ap.error("--full-width is the V4.1-Flash proxy: use it with --variant v41")
    for flag, given in (("--gguf", args.gguf is not None), ("--bf16", args.bf16), ("--q8-0", args.q8_0),
                        ("--mxfp4-experts", args.mxfp4_experts)):
        if given:
            ap.error(f"{flag} is not available with --full-width (the proxy is written as FP8 dense + MXFP4 experts)")
    try:
        full_width_config(args.layers)
    except ValueError as exc:
        ap.error(str(exc))
    out = args.out or cache_dir() / f"proxy-v41-{args.layers}l"
    build_full_width(out, args.layers, args.seed)
    return 0
