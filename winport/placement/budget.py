"""`--vram-gib N` -> what the GPU holds, and how many routed experts a layer that leaves room for.

The budget N is everything the server takes on the card:

    N = CUDA context + dense weights + draft + vision tower + KV cache (context length L)
        + activations (one chunked-prefill chunk) + CUDA graphs (the captured decode batches)
        + prefill staging + GPU expert slots x MoE layers x bytes of one resident expert

and the slots per layer are what is left divided by (MoE layers x one expert), at most every
expert. SGLang is then told (--mem-fraction-static) to keep weights + KV cache inside
`pre-load free memory x fraction` and leaves the rest for activations and graphs, which is how
it sizes its pools (mem_cache/kv_cache_configurator.py _profile_available_bytes: KV = free after
load - free before load x (1 - fraction)). The host side: kt-kernel holds every routed expert
(the CPU side keeps them all, so the GPU's share can change without reloading), and the engram
tables are read through the page cache from the GGUF's map.

The estimates that are not sizes of tensors (context, activations, graphs) are constants of this
module with the measurement that chose them; `winport serve` prints what SGLang and CUDA really
hold next to the plan once the server is up.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from winport.placement.kv import DEFAULT_SWA_RATIO, MAX_RUNNING_REQUESTS, KVBytes, kv_bytes
from winport.placement.model_bytes import ModelBytes

GIB = 1024**3
# CUDA context, cuBLAS/Triton modules and the allocator's first blocks before SGLang measures free
# memory: about 0.5 GiB on the H200 with torch 2.11 (nvml used at start-up, before any weight).
CONTEXT_BYTES = int(0.75 * GIB)
# What SGLang's weight measurement (free memory before minus after loading) shows beyond the tensor
# sizes, counted inside the static fraction or SGLang refuses to start ("Loaded weights leave no GPU
# memory for the KV cache"). Measured on the 2-layer full-width proxy (H200, 2026-12-02): 70 FP8
# slots a layer 5.81 and 4.82 GB in two starts against 5.01 GiB of tensors; 206 slots 15.91 GB
# against 13.97 GiB. The excess grows with the slots, as if one layer's packed MXFP4 experts were
# still referenced when SGLang measures (they are dequantized to FP8 at load): so a fixed part plus
# one layer's slots in MXFP4, on the FP8 path.
LOAD_OVERHEAD_BYTES = 1 * GIB
# Host memory the server's processes take besides kt-kernel's experts (Python, torch, SGLang,
# the tokenizer, one layer of experts staged while loading).
HOST_BASE_BYTES = 8 * GIB
# KV tokens planned at least: the SWA pool (a tenth of the full one) then holds 25 requests'
# 128-token windows in 256-token pages; fewer would cap concurrency, not fail.
MIN_KV_TOKENS = 65536
# activation_bytes' margin over its count of the largest buffers. Measured on the 2-layer full-width
# proxy (H200, 2026-12-02, scripts/gpu/proxy_check.py --vram-gib 14 --long-prompt 8192): the server's
# processes held 5.95 GiB before an 8192-token prefill and 9.74 GiB after it, 3.79 GiB of activations
# (and the allocator blocks they leave cached) against the count's 3.98 GiB: 0.95x. A 25% margin on
# top; the buffers are reused layer after layer, so 40 layers should not need more (not measured).
ACTIVATION_SLACK = 1.25


class PlanError(ValueError):
    """A budget that cannot work (the message carries the numbers)."""


def prefill_chunk(card_bytes: int) -> int:
    """SGLang 0.5.23's default chunked-prefill size for a card of this size
    (arg_groups/memory_hook.py handle_gpu_memory_settings)."""
    gib_ = card_bytes / GIB
    if gib_ < 20:
        return 2048
    if gib_ < 60:
        return 4096
    return 8192 if gib_ < 160 else 16384


def decode_graph_max_bs(card_bytes: int) -> int:
    """SGLang 0.5.23's default largest captured decode batch for a card of this size (tp < 4)."""
    gib_ = card_bytes / GIB
    if gib_ < 20:
        return 8
    if gib_ < 35:
        return 48
    return 32 if gib_ < 60 else 256


def activation_bytes(config: dict[str, Any], tokens: int) -> int:
    """Peak activation bytes of a forward over `tokens` tokens: the fused-MoE runner's caches
    (top-k x (2I + I + H) bf16 a token), q and the attention output (2 x heads x head_dim bf16),
    three copies of mHC's fp32 residual streams (hc_mult x hidden), times ACTIVATION_SLACK for the
    allocator and the buffers not listed."""
    h, i = config["hidden_size"], config["moe_intermediate_size"]
    k = config["num_experts_per_tok"]
    heads, hd = config["num_attention_heads"], config["head_dim"]
    per_token = k * (3 * i + h) * 2 + 2 * heads * hd * 2 + 3 * config.get("hc_mult", 1) * h * 4
    return int(ACTIVATION_SLACK * per_token * tokens)


@dataclass(frozen=True)
class Inputs:
    """What a plan is made from."""

    config: dict[str, Any]
    sizes: ModelBytes
    card_bytes: int  # the GPU's total memory
    host_bytes: int  # the machine's RAM
    vram_gib: float | None = None  # None: the largest budget the card allows
    context_length: int | None = None  # None: the model's max_position_embeddings
    draft_bytes: int = 0  # the DSpark draft as served (all on the GPU)
    mmproj_bytes: int = 0  # the vision tower as served
    gpu_mxfp4: bool = False  # resident experts stay MXFP4 (winport's Triton W4A16 kernel)
    gpu_experts: int | None = None  # --gpu-experts N: the slots per layer, checked against the budget
    staging_bytes: int = 0  # prefill staging buffers for streamed CPU experts
    swa_ratio: float | None = None  # --swa-full-tokens-ratio; None: SGLang's cap-mode SWA pool (its default)
    max_running: int = MAX_RUNNING_REQUESTS  # --max-running-requests: sizes the cap-mode SWA pool
    card_name: str = "GPU"


@dataclass
class Plan:
    """A budget and what it leaves for the experts."""

    inputs: Inputs
    budget: int
    lines: list[tuple[str, int, str]] = field(default_factory=list)  # (what, bytes, how)
    slots: int = 0
    kv_tokens: int = 0
    chunk: int = 0
    host_experts: int = 0
    mem_fraction_static: float = 0.0
    kv: KVBytes | None = None  # the KV layout the KV line was priced with

    @property
    def static_bytes(self) -> int:
        """Weights and KV cache: what SGLang's --mem-fraction-static must cover."""
        return sum(b for what, b, _ in self.lines if what in _STATIC)

    def fraction_of(self, free_before_load: int) -> float:
        """SGLang's --mem-fraction-static for a card with `free_before_load` bytes free once its
        CUDA context exists: weights + KV over that."""
        return min(0.99, self.static_bytes / free_before_load)

    def describe(self) -> str:
        """The plan as the lines `winport plan` and `winport serve` print."""
        inp, m = self.inputs, self.inputs.sizes
        fmt = "MXFP4" if inp.gpu_mxfp4 else "FP8 (dequantized at load)"
        out = [f"GPU budget {gib(self.budget)} of {inp.card_name} ({gib(inp.card_bytes)}):"]
        for what, b, how in self.lines:
            out.append(f"  {what:<24}{gib(b):>11}  {how}")
        used = sum(b for _, b, _ in self.lines)
        out.append(f"  {'total':<24}{gib(used):>11}  ({gib(self.budget - used)} of the budget unused)")
        cpu = m.experts_per_layer - self.slots
        out.append(f"Experts: {self.slots} of {m.experts_per_layer} a layer on the GPU ({fmt}, "
                   f"{m.expert_gpu(inp.gpu_mxfp4) / 2**20:.1f} MiB each), {cpu} a layer in kt-kernel on the CPU; "
                   f"{m.moe_layers} MoE layers")
        out.append(f"Host RAM: kt-kernel holds all {m.experts_per_layer * m.moe_layers} experts "
                   f"({gib(self.host_experts)}), plus about {gib(HOST_BASE_BYTES)} for the server's processes, "
                   f"of {gib(inp.host_bytes)}")
        if m.engram_host:
            left = inp.host_bytes - self.host_experts - HOST_BASE_BYTES
            share = max(0.0, min(1.0, left / m.engram_host))
            out.append(f"Engram tables: {gib(m.engram_host)} read from the GGUF's memory map through the page "
                       f"cache ({share:.0%} of them fit in the RAM left)")
        return "\n".join(out)


_STATIC = ("dense weights", "load overhead", "draft", "vision tower", "KV cache", "GPU experts")


def gib(n: float) -> str:
    """Bytes as GiB with two decimals."""
    return f"{n / GIB:.2f} GiB"


def _kv_how(kv: KVBytes, tokens: int, max_running: int) -> str:
    if kv.swa_cap_tokens:
        return (f"{tokens} tokens x {kv.full:.0f} B (compressed pools) + SWA pool of {kv.swa_cap_tokens} slots x "
                f"{kv.swa_slot:.0f} B (SGLang's cap for {max_running} running requests)")
    return f"{tokens} tokens x {kv.per_token:.0f} B (compressed pools {kv.full:.0f} B + SWA {kv.swa:.0f} B a token)"


def make_plan(inp: Inputs) -> Plan:
    """The plan for `inp`; PlanError when the budget cannot hold the model's GPU part."""
    from winport.placement.model_bytes import with_defaults

    m, cfg = inp.sizes, with_defaults(inp.config)
    card = inp.card_bytes
    if inp.vram_gib is not None and (not math.isfinite(inp.vram_gib) or inp.vram_gib <= 0):
        raise PlanError(f"--vram-gib must be a positive number of GiB, got {inp.vram_gib}")
    budget = int(inp.vram_gib * GIB) if inp.vram_gib is not None else card
    if budget > card:
        raise PlanError(f"--vram-gib {inp.vram_gib:g} is more than {inp.card_name} has: {gib(card)}")
    context = inp.context_length or int(cfg.get("max_position_embeddings") or 0)
    if context <= 0:
        raise PlanError("the context length is unknown: give --context-length")
    chunk = prefill_chunk(card)
    if inp.max_running < 1:
        raise PlanError(f"--max-running-requests must be at least 1, got {inp.max_running}")
    kv = kv_bytes(cfg, inp.swa_ratio or DEFAULT_SWA_RATIO, draft=inp.draft_bytes > 0,
                  cap_chunk=chunk if inp.swa_ratio is None else None, max_running=inp.max_running)
    # SGLang captures no decode batch above the running-request cap (H200, 2026-12-03: bs 1..16 at 16).
    max_bs = min(decode_graph_max_bs(card), inp.max_running)
    tokens = max(context, MIN_KV_TOKENS)
    plan = Plan(inputs=inp, budget=budget, kv_tokens=tokens, chunk=chunk, kv=kv)
    plan.lines = [
        ("CUDA context", CONTEXT_BYTES, "CUDA, cuBLAS and Triton modules before any weight"),
        ("dense weights", m.dense_gpu, f"FP8 blocks + bf16/fp32 small tensors; embedding and head {gib(m.embed_head)}"),
    ]
    if inp.draft_bytes:
        plan.lines.append(("draft", inp.draft_bytes, "DSpark draft, all of it on the GPU"))
    if inp.mmproj_bytes:
        plan.lines.append(("vision tower", inp.mmproj_bytes, "mmproj as served"))
    plan.lines += [
        ("KV cache", kv.total(tokens), _kv_how(kv, tokens, inp.max_running)),
        ("activations", activation_bytes(cfg, chunk), f"one chunked-prefill chunk of {chunk} tokens"),
        ("CUDA graphs", activation_bytes(cfg, max_bs), f"decode batches up to {max_bs}"),
    ]
    if inp.staging_bytes:
        plan.lines.append(("prefill staging", inp.staging_bytes, "pinned staging for streamed CPU experts"))
    plan.lines.append(("load overhead", LOAD_OVERHEAD_BYTES, "held after loading beyond the tensors (measured)"))
    fixed = sum(b for _, b, _ in plan.lines)
    per_slot = m.moe_layers * m.expert_gpu(inp.gpu_mxfp4)
    # FP8 path: one layer's slots of packed MXFP4 still held when SGLang measures (LOAD_OVERHEAD_BYTES)
    per_slot_load = 0 if inp.gpu_mxfp4 else m.expert_mxfp4
    room = budget - fixed
    if room < 0:
        what = f"--vram-gib {inp.vram_gib:g}" if inp.vram_gib is not None else f"{inp.card_name}'s {gib(card)}"
        raise PlanError(
            f"{what}: below what the server needs before any routed expert, {gib(fixed)} "
            f"(dense weights {gib(m.dense_gpu)}, KV cache for {tokens} tokens {gib(kv.total(tokens))}, "
            f"activations and graphs {gib(activation_bytes(cfg, chunk) + activation_bytes(cfg, max_bs))}, "
            f"context {gib(CONTEXT_BYTES)}, load overhead {gib(LOAD_OVERHEAD_BYTES)}); give at least {math.ceil(fixed / GIB * 10) / 10:g} GiB or a "
            "shorter --context-length")
    fits = min(m.experts_per_layer, room // (per_slot + per_slot_load)) if per_slot else m.experts_per_layer
    if inp.gpu_experts is not None:
        if not 0 <= inp.gpu_experts <= m.experts_per_layer:
            raise PlanError(f"--gpu-experts {inp.gpu_experts}: a count of experts a layer, 0 to {m.experts_per_layer}")
        if inp.gpu_experts > fits:
            raise PlanError(
                f"--gpu-experts {inp.gpu_experts} needs {gib(inp.gpu_experts * (per_slot + per_slot_load))} of GPU "
                f"memory for experts; "
                f"the budget of {gib(budget)} leaves {gib(room)}, room for {fits} a layer")
        fits = inp.gpu_experts
    plan.slots = int(fits)
    if per_slot_load:
        plan.lines = [(w, b + plan.slots * per_slot_load, f"{h}; {plan.slots} packed experts being dequantized")
                      if w == "load overhead" else (w, b, h) for w, b, h in plan.lines]
    plan.lines.append(("GPU experts", plan.slots * per_slot,
                       f"{plan.slots} a layer x {m.moe_layers} layers x {m.expert_gpu(inp.gpu_mxfp4) / 2**20:.1f} MiB"))
    # Every expert on the GPU: no kt-kernel (winport.hybrid.settings.kt_off_reason needs a count).
    on_cpu = plan.slots < m.experts_per_layer
    plan.host_experts = m.experts_per_layer * m.moe_layers * m.expert_host if on_cpu else 0
    host_need = plan.host_experts + HOST_BASE_BYTES
    if on_cpu and host_need > inp.host_bytes:
        raise PlanError(
            f"host RAM: kt-kernel needs {gib(plan.host_experts)} for the routed experts plus about "
            f"{gib(HOST_BASE_BYTES)} for the server's processes, {gib(host_need)}; this machine has "
            f"{gib(inp.host_bytes)}")
    plan.mem_fraction_static = plan.fraction_of(card - CONTEXT_BYTES)
    return plan
