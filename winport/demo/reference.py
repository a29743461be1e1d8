"""transformers' eager DeepSeek-V4 as the independent reference for the demo model.

One difference is added on purpose: DeepSeek's reference model rounds the 448 non-RoPE KV dims
through FP8 e4m3 (tiles of 64, power-of-two scales) before attention, which SGLang's 584-byte KV
cache stores exactly and transformers skips. Without the same round trip the two disagree by a few
percent per layer for a reason that is not a bug (scripts/debug/compare_hf.py shows both).

A quantized demo (FP8 block dense, MXFP4 experts) reaches transformers as its exact bf16
dequantization. SGLang on CPU multiplies bf16 activations by those same values (W8A16 / W4A16,
winport.patches.cpu_fp8_block_linear and cpu_mxfp4_moe), so no activation rounding is added here.
"""

from __future__ import annotations

from pathlib import Path

import torch

from kernels_triton.formats import E4M3_MAX
from kernels_triton.formats import V4_DIM_NOPE as NOPE_DIMS
from kernels_triton.formats import V4_TILE as TILE


def fp8_kv_round_trip(x: torch.Tensor) -> torch.Tensor:
    """DeepSeek's KV quantization as a round trip: e4m3 in tiles of 64 with scale 2^ceil(log2(amax/448))."""
    nope = x[..., :NOPE_DIMS].float()
    tiles = nope.reshape(*nope.shape[:-1], NOPE_DIMS // TILE, TILE)
    amax = tiles.abs().amax(-1, keepdim=True).clamp(min=1e-4)
    scale = torch.exp2(torch.ceil(torch.log2(amax / E4M3_MAX)))
    q = (tiles / scale).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn).float() * scale
    return torch.cat([q.reshape(nope.shape).to(x.dtype), x[..., NOPE_DIMS:]], dim=-1)


def add_fp8_kv(model: torch.nn.Module) -> int:
    """Hook the attention and compressor KV norms so their output takes the FP8 round trip."""
    n = 0
    for name, mod in model.named_modules():
        if name.endswith(("self_attn.kv_norm", "self_attn.compressor.kv_norm")):
            mod.register_forward_hook(lambda _m, _i, out: fp8_kv_round_trip(out))
            n += 1
    return n


def fp8_activation_round_trip(x: torch.Tensor, *, ue8m0: bool = False) -> torch.Tensor:
    """SGLang's W8A8 activation quantization on CUDA as a round trip: per token, groups of 128 along
    the last dim, e4m3 with scale amax/448 (sgl_per_token_group_quant_8bit's semantics), rounded up
    to a power of two when `ue8m0` (checkpoints whose quantization_config says scale_fmt ue8m0)."""
    shape = x.shape
    g = x.float().reshape(*shape[:-1], shape[-1] // 128, 128)
    scale = g.abs().amax(-1, keepdim=True).clamp_min(1e-10) / E4M3_MAX
    if ue8m0:
        scale = torch.exp2(torch.ceil(torch.log2(scale)))
    return ((g / scale).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn).float() * scale).reshape(shape).to(x.dtype)


# transformers' names of the linears whose checkpoint weights are FP8 blocks and that SGLang runs as
# W8A8 on CUDA. Left out: o_a_proj (wo_a), which SGLang dequantizes to bf16 at load.
_W8A8_LINEARS = ("self_attn.q_a_proj", "self_attn.q_b_proj", "self_attn.kv_proj", "self_attn.o_b_proj",
                 "self_attn.compressor.indexer.q_b_proj", "mlp.shared_experts.gate_proj",
                 "mlp.shared_experts.up_proj", "mlp.shared_experts.down_proj")


def add_fp8_activations(model: torch.nn.Module, *, dense_ue8m0: bool, experts: bool = True) -> int:
    """Round the inputs of every W8A8 linear and of the routed experts (gate_up and down) through FP8,
    as SGLang's block-FP8 linears and Triton fused MoE do on CUDA; returns how many modules were hooked.
    `experts=False` leaves the routed experts' inputs in full precision, as winport's W4A16 MXFP4 MoE
    (WINPORT_GPU_MXFP4_MOE=1) multiplies them.

    The dense linears use power-of-two scales when `dense_ue8m0` (SGLang's act_scale_ue8m0 for a
    scale_fmt ue8m0 checkpoint); the Triton fused MoE always quantizes with exact scales.
    On CPU SGLang multiplies bf16 activations (W8A16), so the CPU comparison does not use this.
    """
    hooked = 0
    for name, mod in model.named_modules():
        if isinstance(mod, torch.nn.Linear) and name.endswith(_W8A8_LINEARS):
            mod.register_forward_pre_hook(
                lambda _m, args: (fp8_activation_round_trip(args[0], ue8m0=dense_ue8m0), *args[1:]))
            hooked += 1
        elif experts and name.endswith("mlp.experts") and hasattr(mod, "_apply_gate"):
            mod.register_forward_pre_hook(lambda _m, args: (fp8_activation_round_trip(args[0]), *args[1:]))
            gate = mod._apply_gate  # its output is exactly the down projection's input
            mod._apply_gate = lambda gate_up, _gate=gate: fp8_activation_round_trip(_gate(gate_up))
            hooked += 1
    return hooked


def dequantized_copy(folder: Path, out: Path) -> Path:
    """A plain copy of a quantized demo folder: config without quantization_config, bf16 weights.

    The FP8 block weights and MXFP4 experts become the values they stand for (exact in bf16:
    winport.demo.quantize), so transformers runs the very model SGLang serves without needing a
    quantized-checkpoint code path of its own.
    """
    import json
    import shutil

    from safetensors.torch import load_file, save_file

    from winport.demo.quantize import dequantize_state_dict

    out.mkdir(parents=True, exist_ok=True)
    for f in folder.iterdir():
        if f.is_file() and f.suffix != ".safetensors" and f.name != "config.json":
            shutil.copyfile(f, out / f.name)
    config = json.loads((folder / "config.json").read_text())
    config.pop("quantization_config", None)
    (out / "config.json").write_text(json.dumps(config, indent=1, sort_keys=True) + "\n")
    files = sorted(folder.glob("*.safetensors"))
    if len(files) != 1:
        raise ValueError(f"{folder}: expected one model.safetensors, found {[f.name for f in files]}")
    save_file(dequantize_state_dict(load_file(str(files[0]))), str(out / files[0].name), metadata={"format": "pt"})
    return out


def load_reference(folder: Path, *, fp8_kv: bool = True, fp8_activations: bool = False,
                   fp8_expert_activations: bool | None = None) -> torch.nn.Module:
    """transformers' DeepseekV4ForCausalLM for the demo folder, fp32, eval mode, FP8 KV if asked.

    A quantized folder (FP8 dense + MXFP4 experts) is loaded through its dequantized copy.
    `fp8_activations` adds SGLang's CUDA activation quantization (:func:`add_fp8_activations`), at the
    routed experts too unless `fp8_expert_activations` is False (winport's W4A16 MXFP4 MoE).
    """
    import json
    import tempfile

    from transformers import AutoModelForCausalLM

    folder = Path(folder)
    quant = json.loads((folder / "config.json").read_text()).get("quantization_config")
    if quant:
        with tempfile.TemporaryDirectory(prefix="winport-ref-") as tmp:
            model = AutoModelForCausalLM.from_pretrained(str(dequantized_copy(folder, Path(tmp))),
                                                         dtype=torch.float32).eval()
    else:
        model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()
    if fp8_kv and add_fp8_kv(model) == 0:
        raise RuntimeError("found no KV norm to hook: transformers' DeepSeek-V4 module names changed")
    experts = fp8_activations if fp8_expert_activations is None else fp8_expert_activations
    if fp8_activations and add_fp8_activations(model, dense_ue8m0=(quant or {}).get("scale_fmt") == "ue8m0",
                                               experts=experts) == 0:
        raise RuntimeError("found no W8A8 linear to hook: transformers' DeepSeek-V4 module names changed")
    return model


@torch.no_grad()
def prompt_logprobs(model: torch.nn.Module, ids: list[int]) -> list[float]:
    """log p(ids[t] | ids[:t]) for t = 1 .. len(ids)-1, in float64 (on whichever device `model` is)."""
    device = next(model.parameters()).device
    logits = model(torch.tensor([ids], device=device), use_cache=False).logits[0].double().cpu()
    lp = torch.log_softmax(logits, -1)
    return [float(lp[t, ids[t + 1]]) for t in range(len(ids) - 1)]
