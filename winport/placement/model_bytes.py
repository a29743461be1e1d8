"""What a DeepSeek-V4.x model's weights take where they are served, from its config alone.

Counted from the tensor list the config implies (transformers' DeepseekV4 on the meta device for
the V4 parts, winport.demo.weights_v41.v41_only_shapes for V4.1's own tensors: the same lists the
demo and the full-width proxy write), in the form each tensor is served in:
- dense matrices DeepSeek stores in FP8 (winport.demo.quantize.FP8_DENSE): 1 byte a value plus one
  float32 scale per weight block (SGLang keeps `weight_scale_inv` as float32); GGUF Q8_0 is
  converted into the same form at load;
- every other dense tensor in its checkpoint dtype (bf16, fp32 for sinks and mHC, int32 tid2eid);
- routed experts per expert: on the GPU in the runner's format (MXFP4 packed codes + E8M0 scales
  for winport's Triton W4A16 kernel, or FP8 blocks of [128, 128] with float32 scales when they are
  dequantized at load), on the host in kt-kernel's MXFP4 layout (codes + bf16 scales per 32);
- engram tables on the host (SGLang reads them from host memory, winport from the GGUF's map).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from kernels_triton.formats import FP8_BLOCK_V4, FP8_BLOCK_V41, MXFP4_GROUP

FP8_SCALE_BYTES = 4  # float32 per block in SGLang's parameters
KT_SCALE_BYTES = 2  # kt-kernel 0.7.2 keeps MXFP4 scales as bf16
_DTYPE_BYTES = {"bf16": 2, "fp32": 4, "int32": 4}


@dataclass(frozen=True)
class ModelBytes:
    """Bytes of one model's weights where they are served (module docstring)."""

    dense_gpu: int  # every dense tensor, as served on the GPU
    embed_head: int  # of which the embedding and the LM head
    moe_layers: int
    experts_per_layer: int
    expert_mxfp4: int  # one expert on the GPU as MXFP4 (codes + E8M0 scales)
    expert_fp8: int  # one expert on the GPU dequantized to FP8 blocks
    expert_host: int  # one expert in kt-kernel's memory
    engram_host: int  # engram tables (host memory or the GGUF's map)

    def expert_gpu(self, mxfp4: bool) -> int:
        """One resident expert on the GPU in the format the runner uses."""
        return self.expert_mxfp4 if mxfp4 else self.expert_fp8


def _blocks(rows: int, cols: int, block: tuple[int, int]) -> int:
    return math.ceil(rows / block[0]) * math.ceil(cols / block[1])


def with_defaults(config: dict[str, Any]) -> dict[str, Any]:
    """`config` with transformers' DeepseekV4Config defaults for the keys it leaves out (what the model
    is built with when config.json omits them, e.g. a small GGUF's metadata)."""
    from transformers import DeepseekV4Config

    defaults = {k: v for k, v in DeepseekV4Config().to_dict().items() if k not in config}
    return {**defaults, **config}


def fp8_served_bytes(shape: tuple[int, ...], block: tuple[int, int]) -> int:
    """An FP8 block-quantized matrix [rows, cols] with its float32 block scales."""
    rows, cols = shape
    return rows * cols + _blocks(rows, cols, block) * FP8_SCALE_BYTES


def expert_bytes(hidden: int, inter: int) -> tuple[int, int, int]:
    """(GPU MXFP4, GPU FP8, kt-kernel host) bytes of one routed expert: w1 and w3 [inter, hidden],
    w2 [hidden, inter]."""
    values = 3 * hidden * inter
    groups = values // MXFP4_GROUP
    mxfp4 = values // 2 + groups  # two E2M1 codes a byte, one E8M0 byte per 32
    fp8 = values + (2 * _blocks(inter, hidden, FP8_BLOCK_V4) + _blocks(hidden, inter, FP8_BLOCK_V4)) * FP8_SCALE_BYTES
    host = values // 2 + groups * KT_SCALE_BYTES
    return mxfp4, fp8, host


def _v4_shapes(config: dict[str, Any]) -> list[tuple[str, tuple[int, ...]]]:
    from winport.demo.weights import hf_shapes, original_name
    from winport.demo.weights_v41 import v4_base_config

    base = v4_base_config(config) if "kv_source_layer_ids" in config else config
    return [(original_name(k), shape) for k, (shape, _dtype) in hf_shapes(base).items()]


def _storage(name: str) -> str:
    from winport.demo.weights import _storage_dtype

    if name.endswith("tid2eid"):
        return "int32"
    return "fp32" if str(_storage_dtype(name)) == "torch.float32" else "bf16"


def model_bytes(config: dict[str, Any]) -> ModelBytes:
    """ModelBytes of a DeepSeek-V4 or V4.1 config.json (no weights read)."""
    from winport.demo.quantize import FP8_DENSE

    v41 = "kv_source_layer_ids" in config
    block = tuple((config.get("quantization_config") or {}).get("weight_block_size")
                  or (FP8_BLOCK_V41 if v41 else FP8_BLOCK_V4))
    shapes = _v4_shapes(config)
    if v41:
        from winport.demo.weights_v41 import v41_only_shapes

        # V4.1 builds no LM-head mixer (hc_pre_from_prev_sublayer); its own tensors come on top.
        shapes = [(n, s) for n, s in shapes if not n.startswith("hc_head_")]
        extra = v41_only_shapes(config)
    else:
        extra = {}
    dense = embed_head = engram = 0
    moe_layers = 0
    for name, shape in shapes:
        if ".ffn.experts." in name:
            moe_layers += name.endswith("gate_up_proj")
            continue
        size = (fp8_served_bytes(shape, block) if FP8_DENSE.match(name)  # type: ignore[arg-type]
                else math.prod(shape) * _DTYPE_BYTES[_storage(name)])
        dense += size
        if name in ("embed.weight", "head.weight"):
            embed_head += size
    for name, (shape, role) in extra.items():
        if role == "rows":
            rows, dim = shape
            engram += rows * dim + rows * (dim // 32)  # FP8 e4m3 + one E8M0 byte per 32 values
        elif FP8_DENSE.match(name):
            dense += fp8_served_bytes(shape, block)  # type: ignore[arg-type]
        else:
            dense += math.prod(shape) * 2  # bf16
    mx, fp8, host = expert_bytes(config["hidden_size"], config["moe_intermediate_size"])
    return ModelBytes(dense_gpu=dense, embed_head=embed_head, moe_layers=moe_layers,
                      experts_per_layer=int(config["n_routed_experts"]), expert_mxfp4=mx, expert_fp8=fp8,
                      expert_host=host, engram_host=engram)
