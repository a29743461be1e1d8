"""Command-line pieces: ``info`` (like gguf-dump, plus the SGLang name each tensor maps to),
``dump`` (one tensor, dequantized, to .npy) and ``export`` (a checkpoint folder, and/or the DSpark
draft it bundles, as GGUF). The lead wires these into ``winport gguf``."""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from typing import Any

import numpy as np

from .reader import GGUFError, open_gguf


def _short(v: Any, width: int = 60) -> str:
    if isinstance(v, np.ndarray):
        head = ", ".join(map(str, v[:8].tolist()))
        return f"[{head}{', ...' if v.size > 8 else ''}] ({v.dtype}, {v.size})"
    if isinstance(v, list):
        head = ", ".join(repr(x) for x in v[:5])
        return f"[{head}{', ...' if len(v) > 5 else ''}] ({len(v)} items)"
    s = repr(v)
    return s if len(s) <= width else s[: width - 3] + "..."


def info_main(argv: list[str] | None = None) -> int:
    """``info FILE [--no-tensors]``: metadata, tensors (type, shape, bytes) and their SGLang names."""
    ap = argparse.ArgumentParser(prog="winport gguf info", description=info_main.__doc__)
    ap.add_argument("file")
    ap.add_argument("--no-tensors", action="store_true", help="metadata only")
    args = ap.parse_args(argv)
    from . import names

    try:
        with open_gguf(args.file) as m:
            print(f"# {args.file}: {len(m.paths)} file(s), GGUF v{m.files[0].version}, {len(m.metadata)} keys, {len(m)} tensors")
            for k, v in m.metadata.items():
                print(f"{k:50s} {_short(v)}")
            n_layers = names.n_layers_from_metadata(m.metadata, m.tensors, m.paths[0])
            plan = names.plan_names(m.tensors, n_layers)
            types = Counter(t.type_name for t in m)
            total = sum(t.nbytes for t in m)
            print(f"# types: {dict(types)}; {total / 2**30:.2f} GiB of tensor data")
            if not args.no_tensors:
                for t in m:
                    mp = plan.mapped.get(t.name)
                    target = f"{mp.target} [{mp.role}]" if mp else "(unmapped)"
                    print(f"{t.name:45s} {t.type_name:12s} {str(list(t.shape)):24s} {t.nbytes:>14d}  -> {target}")
            if plan.unknown:
                print(f"# {len(plan.unknown)} unmapped tensor(s): {', '.join(plan.unknown[:20])}{' ...' if len(plan.unknown) > 20 else ''}")
            if plan.missing:
                print(f"# {len(plan.missing)} required tensor(s) missing: {', '.join(plan.missing[:20])}{' ...' if len(plan.missing) > 20 else ''}")
        print(cache_line())
    except GGUFError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


def cache_line() -> str:
    """What winport's GGUF cache holds (served GGUFs keep only config, tokenizer and sidecars there)."""
    from winport.paths import cache_dir

    root = cache_dir() / "gguf"
    folders = [p for p in root.iterdir() if p.is_dir()] if root.is_dir() else []
    total = sum(f.stat().st_size for p in folders for f in p.rglob("*") if f.is_file())
    return f"# winport GGUF cache {root}: {len(folders)} folder(s), {total / 1e6:,.1f} MB"


def convert_main(argv: list[str] | None = None) -> int:
    """``convert FILE OUT``: the GGUF (with a draft / mmproj found next to it) as a safetensors checkpoint
    folder OUT, for tools that want one (`winport serve` reads the GGUF itself and needs none)."""
    ap = argparse.ArgumentParser(prog="winport gguf convert", description=convert_main.__doc__)
    ap.add_argument("file")
    ap.add_argument("out")
    args = ap.parse_args(argv)
    import shutil
    from pathlib import Path

    from .to_checkpoint import gguf_to_checkpoint

    out = Path(args.out)
    if out.exists():
        print(f"error: {out} exists; name a new folder", file=sys.stderr)
        return 2
    work = out.with_name(out.name + ".converting")
    try:
        folder = gguf_to_checkpoint(args.file, cache=work, dense_fp8=None, draft=None, mmproj=None, weights="copy")
        folder.rename(out)
    except GGUFError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"wrote {out}")
    return 0


def dump_main(argv: list[str] | None = None) -> int:
    """``dump FILE TENSOR --npy OUT``: write one tensor, dequantized to float32, as .npy."""
    ap = argparse.ArgumentParser(prog="winport gguf dump", description=dump_main.__doc__)
    ap.add_argument("file")
    ap.add_argument("tensor")
    ap.add_argument("--npy", required=True, help="output .npy path")
    args = ap.parse_args(argv)
    try:
        with open_gguf(args.file) as m:
            t = m[args.tensor]
            arr = t.dequantize(np.float32)
            np.save(args.npy, arr)
            print(f"{t.name}: {t.type_name} {list(t.shape)} -> {args.npy}")
    except GGUFError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


def export_main(argv: list[str] | None = None) -> int:
    """``export CHECKPOINT OUT.gguf [--draft-out DRAFT.gguf] [--draft-only] [--mmproj-only] [--q8_0] [--mxfp4-experts] [--arch A]``:
    a DeepSeek-V4/V4.1 checkpoint folder (bf16/f32 tensors) as llama.cpp-named GGUF; with
    ``--draft-only`` OUT is the DSpark draft GGUF (Q8_0 unless ``--no-q8_0``) of its ``mtp.*`` tensors;
    with ``--mmproj-only`` OUT is the vision projector GGUF of its ``vision.*`` / ``aligner.*`` /
    ``image_*`` tensors (e.g. the ``mmproj`` folder of a converted GGUF)."""
    ap = argparse.ArgumentParser(prog="winport gguf export", description=export_main.__doc__)
    ap.add_argument("checkpoint")
    ap.add_argument("out")
    ap.add_argument("--arch", choices=("deepseek4", "deepseek41"), default=None,
                    help="GGUF architecture (default: from config.json model_type)")
    ap.add_argument("--draft-out", default=None, help="also write the bundled DSpark draft here")
    ap.add_argument("--draft-only", action="store_true", help="write only the DSpark draft, to OUT")
    ap.add_argument("--mmproj-only", action="store_true", help="write only the vision projector, to OUT")
    ap.add_argument("--q8_0", dest="q8_0", action="store_true",
                    help="model: dense linear weights as Q8_0 (default: as stored); the draft follows")
    ap.add_argument("--mxfp4-experts", action="store_true",
                    help="model: routed experts as MXFP4 (with --q8_0: UD-Q4_K_XL's mix; the draft is written as without it)")
    ap.add_argument("--no-q8_0", dest="draft_q8_0", action="store_false",
                    help="with --draft-only: keep the draft's tensors as stored (default Q8_0)")
    args = ap.parse_args(argv)
    import json
    from pathlib import Path

    from .export import checkpoint_to_gguf, draft_to_gguf, mmproj_to_gguf

    try:
        if args.mmproj_only:
            print(f"wrote {mmproj_to_gguf(args.checkpoint, args.out)}")
            return 0
        cfg_path = Path(args.checkpoint) / "config.json"
        try:
            config = json.loads(cfg_path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            raise GGUFError(f"{cfg_path}: cannot read ({e})") from e
        arch = args.arch or ("deepseek41" if config.get("model_type") == "deepseek_v41" else "deepseek4")
        if args.draft_only:
            out = draft_to_gguf(args.checkpoint, args.out, arch=arch, q8_0=args.draft_q8_0)
        else:
            out = checkpoint_to_gguf(args.checkpoint, args.out, arch=arch, dense_q8_0=args.q8_0,
                                     draft_out=args.draft_out, progress=True, experts_mxfp4=args.mxfp4_experts)
        print(f"wrote {out}" + (f" and {args.draft_out}" if args.draft_out and not args.draft_only else ""))
    except GGUFError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


_COMMANDS = {"info": info_main, "dump": dump_main, "export": export_main, "convert": convert_main}


def main(argv: list[str] | None = None) -> int:
    """Dispatch ``info`` / ``dump`` / ``export`` / ``convert``."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in _COMMANDS:
        print("usage: python -m winport.gguf {info FILE | dump FILE TENSOR --npy OUT | convert FILE OUT | "
              "export CHECKPOINT OUT.gguf [--draft-out D.gguf | --draft-only | --mmproj-only]}", file=sys.stderr)
        return 2
    return _COMMANDS[argv[0]](argv[1:])
