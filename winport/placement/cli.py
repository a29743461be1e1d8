"""`winport plan`: the GPU budget of a model and the expert slots it leaves, without loading weights."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from winport.placement.budget import GIB, Inputs, Plan, PlanError, make_plan
from winport.placement.kv import WORKSTATION_RUNNING_REQUESTS
from winport.placement.source import ModelSource, SourceError, read_source


def card() -> tuple[int, str] | None:
    """(total bytes, name) of the first visible CUDA GPU, or None."""
    import torch

    if not torch.cuda.is_available():
        return None
    props = torch.cuda.get_device_properties(0)
    return int(props.total_memory), str(props.name)


def host_ram() -> int:
    """This machine's RAM in bytes."""
    import psutil

    return int(psutil.virtual_memory().total)


def plan_for(source: ModelSource, *, vram_gib: float | None, context_length: int | None,
             gpu_experts: int | None, card_bytes: int, card_name: str, host_bytes: int,
             gpu_mxfp4: bool | None = None, max_running: int = WORKSTATION_RUNNING_REQUESTS) -> Plan:
    """The plan of `source` on a card and host of these sizes (gpu_mxfp4 None: the launch policy's), for
    `max_running` requests at once."""
    from winport.placement.model_bytes import model_bytes
    from winport.platform.launch_policy import gpu_mxfp4_moe

    return make_plan(Inputs(
        config=source.config, sizes=model_bytes(source.config), card_bytes=card_bytes, host_bytes=host_bytes,
        vram_gib=vram_gib, context_length=context_length, draft_bytes=source.draft_bytes,
        mmproj_bytes=source.mmproj_bytes, gpu_mxfp4=gpu_mxfp4_moe() if gpu_mxfp4 is None else gpu_mxfp4,
        gpu_experts=gpu_experts, card_name=card_name, max_running=max_running))


def main(argv: list[str] | None = None) -> int:
    """Entry point of `winport plan`."""
    ap = argparse.ArgumentParser(prog="winport plan", description=(
        "Print the GPU budget of a model (dense weights, KV cache, activations, CUDA graphs, draft, vision "
        "tower) and the routed experts a layer it leaves on the GPU, from the model's metadata alone."))
    ap.add_argument("--model", type=Path, required=True,
                    help="a GGUF file, shard or folder, a checkpoint folder, or a config.json")
    ap.add_argument("--vram-gib", type=float, default=None,
                    help="GPU memory the server may take, GiB (default: the whole card)")
    ap.add_argument("--context-length", type=int, default=None, help="tokens of KV cache (default: the model's maximum)")
    ap.add_argument("--draft", type=Path, default=None, help="DSpark draft GGUF (default: found next to the model)")
    ap.add_argument("--mmproj", type=Path, default=None, help="vision projector GGUF (default: found next to the model)")
    ap.add_argument("--gpu-experts", type=int, default=None, help="experts a layer on the GPU, checked against the budget")
    ap.add_argument("--max-running-requests", type=int, default=WORKSTATION_RUNNING_REQUESTS,
                    help="requests served at once, which sizes SGLang's sliding-window KV pool "
                         f"(default {WORKSTATION_RUNNING_REQUESTS}, what `winport serve` passes on CUDA)")
    ap.add_argument("--card-gib", type=float, default=None,
                    help="plan for a card of this size (default: the visible GPU; required without one)")
    ap.add_argument("--ram-gib", type=float, default=None, help="plan for this much host RAM (default: this machine's)")
    fmt = ap.add_mutually_exclusive_group()
    fmt.add_argument("--mxfp4", dest="mxfp4", action="store_const", const=True, default=None,
                     help="resident experts stay MXFP4 (WINPORT_GPU_MXFP4_MOE=1)")
    fmt.add_argument("--fp8", dest="mxfp4", action="store_const", const=False,
                     help="resident experts dequantized to FP8 (the default on CUDA today)")
    args = ap.parse_args(argv)
    if args.card_gib is not None:
        card_bytes, name = int(args.card_gib * GIB), f"a {args.card_gib:g} GiB card"
    else:
        found = card()
        if found is None:
            print("winport plan: no CUDA GPU here: give --card-gib N to plan for a card of N GiB", file=sys.stderr)
            return 2
        card_bytes, name = found
    host = int(args.ram_gib * GIB) if args.ram_gib is not None else host_ram()
    try:
        source = read_source(args.model, args.draft, args.mmproj)
        plan = plan_for(source, vram_gib=args.vram_gib, context_length=args.context_length,
                        gpu_experts=args.gpu_experts, card_bytes=card_bytes, card_name=name, host_bytes=host,
                        gpu_mxfp4=args.mxfp4, max_running=args.max_running_requests)
    except (SourceError, PlanError) as exc:
        print(f"winport plan: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:  # a GGUFError names the file and tensor
        from winport.gguf import GGUFError

        if isinstance(exc, GGUFError):
            print(f"winport plan: {exc}", file=sys.stderr)
            return 2
        raise
    print(f"winport plan: {source.path} ({source.kind})")
    print(plan.describe())
    if source.kind != "config":
        print(f"`winport serve --model {source.path} --vram-gib {plan.budget / GIB:g}` serves it this way")
    return 0
