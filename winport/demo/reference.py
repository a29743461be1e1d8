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

NOPE_DIMS = 448
TILE = 64


def fp8_kv_round_trip(x: torch.Tensor) -> torch.Tensor:
    """DeepSeek's KV quantization as a round trip: e4m3 in tiles of 64 with scale 2^ceil(log2(amax/448))."""
    nope = x[..., :NOPE_DIMS].float()
    tiles = nope.reshape(*nope.shape[:-1], NOPE_DIMS // TILE, TILE)
    amax = tiles.abs().amax(-1, keepdim=True).clamp(min=1e-4)
    scale = torch.exp2(torch.ceil(torch.log2(amax / 448.0)))
    q = (tiles / scale).clamp(-448.0, 448.0).to(torch.float8_e4m3fn).float() * scale
    return torch.cat([q.reshape(nope.shape).to(x.dtype), x[..., NOPE_DIMS:]], dim=-1)


def add_fp8_kv(model: torch.nn.Module) -> int:
    """Hook the attention and compressor KV norms so their output takes the FP8 round trip."""
    n = 0
    for name, mod in model.named_modules():
        if name.endswith(("self_attn.kv_norm", "self_attn.compressor.kv_norm")):
            mod.register_forward_hook(lambda _m, _i, out: fp8_kv_round_trip(out))
            n += 1
    return n


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


def load_reference(folder: Path, *, fp8_kv: bool = True) -> torch.nn.Module:
    """transformers' DeepseekV4ForCausalLM for the demo folder, fp32, eval mode, FP8 KV if asked.

    A quantized folder (FP8 dense + MXFP4 experts) is loaded through its dequantized copy.
    """
    import json
    import tempfile

    from transformers import AutoModelForCausalLM

    folder = Path(folder)
    if "quantization_config" in json.loads((folder / "config.json").read_text()):
        with tempfile.TemporaryDirectory(prefix="winport-ref-") as tmp:
            model = AutoModelForCausalLM.from_pretrained(str(dequantized_copy(folder, Path(tmp))),
                                                         dtype=torch.float32).eval()
    else:
        model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()
    if fp8_kv and add_fp8_kv(model) == 0:
        raise RuntimeError("found no KV norm to hook: transformers' DeepSeek-V4 module names changed")
    return model


@torch.no_grad()
def prompt_logprobs(model: torch.nn.Module, ids: list[int]) -> list[float]:
    """log p(ids[t] | ids[:t]) for t = 1 .. len(ids)-1, in float64."""
    logits = model(torch.tensor([ids]), use_cache=False).logits[0].double()
    lp = torch.log_softmax(logits, -1)
    return [float(lp[t, ids[t + 1]]) for t in range(len(ids) - 1)]
