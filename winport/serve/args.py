"""The flags of `winport serve` (scripts/serve.ps1 maps its parameters onto exactly these)."""

from __future__ import annotations

import argparse
from pathlib import Path

DEFAULT_HOST = "127.0.0.1"  # never listen beyond this machine unless asked
DEFAULT_PORT = 30000


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of `winport serve`."""
    ap = argparse.ArgumentParser(
        prog="winport serve",
        description="Serve a DeepSeek-V4.x model through SGLang's OpenAI-compatible API.",
        usage="%(prog)s (--demo | --model MODEL) [options] [-- SGLANG_SERVER_ARGS...]",
        epilog="Arguments after `--` go to SGLang's server unchanged, after winport's own (so they win), "
               "e.g. `-- --disable-radix-cache`.",
    )
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--demo", action="store_true",
                     help="serve the tiny generated DeepSeek-V4 demo model (CPU when there is no GPU)")
    src.add_argument("--model", type=Path, help="model: a GGUF file or shard, a folder of GGUF files, or a checkpoint folder")
    ap.add_argument("--demo-variant", choices=["v4", "v41", "v41-vision"], default="v4", help="which demo model (default v4)")
    ap.add_argument("--served-model-name", default=None,
                    help="the model name clients send and see (default: the model folder's name; never a "
                         "path, whose drive colon SGLang rejects on Windows)")
    ap.add_argument("--host", default=DEFAULT_HOST, help=f"address to bind (default {DEFAULT_HOST})")
    ap.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"port (default {DEFAULT_PORT})")
    ap.add_argument("--api-key", default=None, help="require this key as 'Authorization: Bearer <key>'")
    ap.add_argument("--vram-gib", type=float, default=None,
                    help="GPU memory the server may take, in GiB: the plan (`winport plan`) fits the dense weights, "
                         "KV cache, activations and graphs in it and fills the rest with routed experts, the others "
                         "running in kt-kernel on the CPU; printed at start and checked against what SGLang holds")
    ap.add_argument("--context-length", type=int, default=None, help="maximum context length in tokens")
    ap.add_argument("--draft-model", type=Path, default=None,
                    help="DSpark draft GGUF (default: found next to the model); bundled into the converted "
                         "checkpoint and used for speculative decoding on CUDA (SGLang runs DSpark on GPUs only)")
    ap.add_argument("--speculative-algorithm", type=str.upper, choices=["DSPARK"], default=None,
                    help="speculative decoding with the DSpark draft bundled in the model (the V4.1 demo has "
                         "one; a GGUF model gets one from --draft-model). CUDA only: SGLang runs DSpark on "
                         "GPUs only, so on the CPU the flag is refused")
    ap.add_argument("--mmproj", type=Path, default=None,
                    help="vision projector GGUF (default: found next to the model); converted with the model, "
                         "so chat requests with images are served")
    ap.add_argument("--cpu-threads", type=int, default=None,
                    help="sets OMP_NUM_THREADS (torch's CPU threads; default: left as it is)")
    ap.add_argument("--gpu-experts", type=int, default=None,
                    help="routed experts per layer kept on the GPU; the rest run in kt-kernel on the CPU "
                         "(SGLang's --kt-num-gpu-experts; default: all on the GPU; CPU-only: all in kt-kernel, "
                         "whose threads are physical cores minus one unless `-- --kt-cpuinfer N`)")
    ap.add_argument("--record-experts", type=Path, default=None, metavar="FILE",
                    help="count how often each routed expert is chosen, per layer, in prefill and decode, and "
                         "write the counts to FILE whenever the server goes idle (needs kt-kernel's experts: a "
                         "CPU server, or --gpu-experts / --vram-gib on CUDA); `winport experts show FILE` reads it")
    ap.add_argument("--expert-placement", type=Path, default=None, metavar="FILE",
                    help="start each layer's GPU expert slots with the experts a route record (--record-experts) "
                         "counted most often there, instead of experts 0..N-1 (CUDA with --gpu-experts or --vram-gib)")
    ap.add_argument("--max-running-requests", type=int, default=None,
                    help="how many requests run at once; more wait in a queue (default on CUDA 16, a "
                         "workstation's share: winport.placement.kv; on the CPU SGLang's)")
    ap.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto", help="where to run (default auto)")
    ap.add_argument("--tp", type=int, default=1, help="tensor-parallel size (gloo collectives)")
    ap.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    return ap
