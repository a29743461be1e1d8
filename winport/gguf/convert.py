"""Streaming conversion of GGUF tensors to what SGLang's DeepSeek-V4 model loads.

Layouts produced (names are DeepSeek checkpoint names; SGLang's load_weights remaps them):
- ``fp8`` role: ``<x>.weight`` float8_e4m3fn [N, K] and ``<x>.scale`` float32
  [ceil(N/bn), ceil(K/bk)] such that weight * scale (broadcast per [bn, bk] block) approximates the
  stored values. SGLang renames ``.scale`` to ``.weight_scale_inv`` (Fp8LinearMethod's block
  scale, same shape). Blocks are [128, 128] for V4 and [32, 32] for V4.1. With
  ``scale_fmt="ue8m0"`` (default, as DeepSeek's checkpoints) every scale is a power of two, so
  the DeepGEMM UE8M0 path reads the same numbers.
- ``experts`` role, MXFP4: per expert ``<x>.weight`` uint8 [N, K/2] (E2M1 codes, column 2j in the
  low nibble, 2j+1 in the high) and ``<x>.scale`` float8_e8m0fnu [N, K/32] (uint8 where torch has no
  e8m0). This is DeepSeek's own FP4 expert layout and kt-kernel's MXFP4 layout, made by
  winport.gguf.mxfp4_repack.gguf_mxfp4_to_kt: the GPU MXFP4 MoE kernel takes the same arrays,
  stacked to [E, N, K/2] and [E, N, K/32].
- ``float`` role: F32/F16/BF16 as stored; quantized types dequantized to bfloat16.
- ``engram`` role: never loaded; rows are read through the memory map (winport.gguf.engram_rows)
  or streamed into the checkpoint (winport.gguf.to_checkpoint.EngramStream).

Every converter reads the source in row chunks straight from the memory map, writes into one
preallocated output, and drops the source pages afterwards, so a tensor is never held twice.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from kernels_triton.formats import E4M3_MAX as FP8_E4M3_MAX
from kernels_triton.formats import FP8_BLOCK_V4, FP8_BLOCK_V41, GGML_BLOCKS, MXFP4_GROUP, GGMLType

from . import mxfp4_repack
from . import names as _names
from .dequant import dequantize
from .mxfp4_repack import conversion_threads, gguf_mxfp4_into_many, parallel_chunks
from .reader import GGUFError, GGUFModel, GGUFTensor, open_gguf, shard_paths, to_torch

Q8_0_VALUES, Q8_0_BYTES = GGML_BLOCKS[GGMLType.Q8_0]  # 32 values: float16 d, then 32 int8
# Rows converted per numpy/torch step: bounds temporaries to ~64 MB of float32.
_CHUNK_BYTES = 64 << 20
# Values per parallel work item of the FP8 / bf16 conversions. A Q8_0 -> FP8 item makes ~30 torch
# and numpy calls whose Python-level setup holds the GIL, ~50-100 us per item on the 2-core dev VM
# (RESULTS.md, issue 6: ~11% of a 262144-value item, ~22% of the 131072-value items before), which
# bounds how far the pool scales; the float32 temporaries (1 MB) still fit a server core's L2, and
# a 6.5M-value V4.1 tensor still makes 25 items for the threads to share.
_TILE_VALUES = 262144


def _torch() -> Any:
    import torch

    return torch


def _rows_dequant(t: GGUFTensor, r0: int, r1: int) -> np.ndarray:
    """Rows [r0, r1) of a tensor viewed as 2-D [rows, cols], dequantized to float32."""
    cols = t.ggml_dims[0]
    raw = t.raw_rows()[r0:r1]
    return dequantize(raw, t.type.id, (r1 - r0, cols), name=t.name, path=t.path)


def _release_rows(t: GGUFTensor, r0: int, r1: int) -> None:
    """Drop the mapped pages of rows [r0, r1) once converted (they stay in the page cache)."""
    row_bytes = t.type.row_bytes(t.ggml_dims[0]) if t.ggml_dims else t.nbytes
    t._file._release(t.offset + r0 * row_bytes, (r1 - r0) * row_bytes)  # noqa: SLF001


def _as_2d(t: GGUFTensor) -> tuple[int, int]:
    if not t.ggml_dims:
        return 1, 1
    cols = t.ggml_dims[0]
    rows = t.n_elements // cols if cols else 0
    return rows, cols


def _q8_0_rows(t: GGUFTensor, r0: int, r1: int) -> tuple[Any, Any]:
    """Zero-copy torch views of Q8_0 rows [r0, r1): (float16 d [R, nblk], int8 q [R, nblk, 32]).

    Q8_0 blocks are 34 bytes (float16 d, then 32 int8), so every d is 2-byte aligned: the views
    read straight from the memory map; nothing is copied until the caller converts.
    """
    torch = _torch()
    cols = t.ggml_dims[0]
    nblk = cols // Q8_0_VALUES
    raw = to_torch(t.raw_rows()[r0:r1])  # uint8 [R, nblk * 34], read-only: never written
    blocks = raw.view(r1 - r0, nblk, Q8_0_BYTES)
    d = raw.view(torch.float16).view(r1 - r0, nblk, Q8_0_BYTES // 2)[:, :, 0]
    q = blocks.view(torch.int8)[:, :, 2:]
    return d, q


def _q8_0_values(d: Any, q: Any) -> Any:
    """float32 [R, nblk, 32] = d * q: kernels_triton.formats.codecs.q8_0_values (as ggml computes it)."""
    from kernels_triton.formats.codecs import q8_0_values

    return q8_0_values(d, q)


_F32_TINY = np.array(2.0**-126, dtype=np.float32)
_F32_MAX = np.array(FP8_E4M3_MAX, dtype=np.float32)
_F32_ONE = np.array(1.0, dtype=np.float32)


def _ue8m0_scales(amax: np.ndarray) -> np.ndarray:
    """2^ceil(log2(max(v, 2^-126))) in float32, elementwise (a new array).

    Computed in place on one float32 array: the same float32 loops as the plain expression, with
    fewer numpy calls (each holds the GIL while it starts; they run once per conversion work item).
    """
    s = np.maximum(np.asarray(amax, dtype=np.float32), _F32_TINY)
    np.log2(s, out=s)
    np.ceil(s, out=s)
    np.exp2(s, out=s)
    return s


def _block_scales(amax: np.ndarray, scale_fmt: str) -> np.ndarray:
    """Per-block scale from the block's max |value| (float32 [rb, cb]); the formula every path uses.

    amax / 448, rounded up to a power of two for "ue8m0"; blocks whose max is 0 (or NaN) get 1.
    """
    amax = np.asarray(amax, dtype=np.float32)
    s = np.divide(amax, _F32_MAX)
    if scale_fmt == "ue8m0":
        s = _ue8m0_scales(s)
    np.copyto(s, _F32_ONE, where=~(amax > 0))  # 0 and NaN maxima
    return s


def _pad_blocks(x: Any, bn: int, bk: int) -> Any:
    """[R, K] -> [R', K'] padded with zeros to whole [bn, bk] blocks (zeros never raise a max)."""
    rows, k = x.shape
    rp, kp = -(-rows // bn) * bn, -(-k // bk) * bk
    if rp == rows and kp == k:
        return x
    xp = x.new_zeros((rp, kp))
    xp[:rows, :k] = x
    return xp


def _fp8_chunk_general(x: Any, block: tuple[int, int], scale_fmt: str) -> tuple[Any, np.ndarray]:
    """float32 [R, K] (whole row blocks except at the tensor's end) -> (values / scale, clamped to
    +-448, as float32; scales [ceil(R/bn), ceil(K/bk)]). Any input values, NaN and inf included."""
    torch = _torch()
    bn, bk = block
    rows, k = x.shape
    xp = _pad_blocks(x, bn, bk)
    rp, kp = xp.shape
    blocks = xp.view(rp // bn, bn, kp // bk, bk)
    # max |x| as max(max x, -min x): no |x| temporary; both reductions propagate NaN, as numpy's
    # max of |x| does.
    amax = torch.maximum(torch.amax(blocks, dim=(1, 3)), torch.amin(blocks, dim=(1, 3)).neg()).numpy()
    s = _block_scales(amax, scale_fmt)
    if scale_fmt == "ue8m0":
        # Powers of two in [2^-126, inf]: 1/s is exact, so x * (1/s) rounds the same real number as
        # x / s (inf scales give 0 both ways), and a multiply is cheaper than a divide.
        blocks.mul_(torch.from_numpy(np.reciprocal(s)).view(rp // bn, 1, kp // bk, 1))
    else:
        blocks.div_(torch.from_numpy(s).view(rp // bn, 1, kp // bk, 1))
    # With power-of-two scales s * 448 >= max|x| makes every |x / s| <= 448 exactly, so the clamp
    # would change nothing (NaN blocks fail the test and are clamped as before).
    if scale_fmt != "ue8m0" or not (s * _F32_MAX >= amax).all():
        xp.clamp_(-FP8_E4M3_MAX, FP8_E4M3_MAX)
    return (xp[:rows, :k] if xp is not x else xp), s


def _fp8_rows_parallel(src: Any, weight: Any, scale: Any, r0: int, r1: int, tile_cols: int,
                       block: tuple[int, int], scale_fmt: str) -> None:
    """Convert rows [r0, r1) tile by tile on the pool. ``src``: (d, q) Q8_0 views or float32 rows."""
    torch = _torch()
    bn, bk = block
    k = weight.shape[1]
    # Narrow tensors: several row blocks per tile, so per-call overheads stay small.
    tile_rows = bn * max(1, _TILE_VALUES // (bn * min(k, tile_cols)))
    tiles = [(a, c) for a in range(r0, r1, tile_rows) for c in range(0, k, tile_cols)]

    def work(i0: int, i1: int) -> None:
        # Full-width tiles (the usual case) take one row slice per tensor: a 2-D slice costs ~6.5 us
        # of Python-level parsing against ~1.8 us, and that time holds the GIL (see mxfp4_repack).
        for a, c in tiles[i0:i1]:
            b, c1 = min(r1, a + tile_rows), min(k, c + tile_cols)
            full = c == 0 and c1 == k
            if isinstance(src, tuple):
                d, q = src[0][a - r0 : b - r0], src[1][a - r0 : b - r0]
                if not full:
                    d, q = d[:, c // Q8_0_VALUES : c1 // Q8_0_VALUES], q[:, c // Q8_0_VALUES : c1 // Q8_0_VALUES]
                x = _q8_0_values(d, q).view(b - a, c1 - c)
            else:
                x = (src[a - r0 : b - r0] if full else src[a - r0 : b - r0, c:c1]).clone()
            y, s = _fp8_chunk_general(x, block, scale_fmt)
            sb = scale[a // bn : a // bn + s.shape[0]]
            if full:
                weight[a:b].copy_(y)
                sb.copy_(torch.from_numpy(s))
            else:
                weight[a:b, c:c1].copy_(y)
                sb[:, c // bk : c // bk + s.shape[1]].copy_(torch.from_numpy(s))

    parallel_chunks(len(tiles), 1, work)


def _bf16_rows_parallel(d: Any, q: Any, out: Any, rows_per_item: int) -> None:
    """Q8_0 rows (views) -> bfloat16 ``out`` rows, in parallel work items."""
    k = out.shape[1]

    def work(a: int, b: int) -> None:
        out[a:b] = _q8_0_values(d[a:b], q[a:b]).view(b - a, k)

    parallel_chunks(out.shape[0], rows_per_item, work)


def fp8_block_for_arch(arch: str | None) -> tuple[int, int]:
    """[bn, bk] of SGLang's block FP8 for an architecture: [32, 32] for V4.1, [128, 128] for V4."""
    return FP8_BLOCK_V41 if arch == "deepseek41" else FP8_BLOCK_V4


def to_fp8_blocks(
    t: GGUFTensor,
    block: tuple[int, int] = FP8_BLOCK_V4,
    *,
    scale_fmt: str = "ue8m0",
) -> tuple[Any, Any]:
    """Any dense GGUF tensor [N, K] -> (float8_e4m3fn [N, K], float32 scales [ceil(N/bn), ceil(K/bk)]).

    Q8_0 goes through its exact float32 values; the only added error is FP8's rounding (at most
    2^-4 relative for normal values, 2^-10 x scale below). ``scale_fmt``: "ue8m0" rounds each scale
    up to a power of two (as DeepSeek's checkpoints), "fp32" uses amax / 448 exactly.

    Streaming: rows are converted in chunks of whole row blocks straight from the memory map (torch
    ops in work items on the conversion pool), each chunk's source pages dropped afterwards, so the
    only full-size allocation is the output.
    """
    torch = _torch()
    if scale_fmt not in ("ue8m0", "fp32"):
        raise ValueError(f"scale_fmt must be 'ue8m0' or 'fp32', not {scale_fmt!r}")
    bn, bk = block
    n, k = _as_2d(t)
    sn, sk = -(-n // bn), -(-k // bk)
    weight = torch.empty((n, k), dtype=torch.float8_e4m3fn)
    scale = torch.empty((sn, sk), dtype=torch.float32)
    rows_per_step = max(bn, (_CHUNK_BYTES // max(1, 4 * k)) // bn * bn)
    # Work items: one row block high, whole column blocks wide, ~_TILE_VALUES values, run in
    # parallel on the conversion pool (one thread per core, each op single-threaded; see
    # mxfp4_repack.parallel_chunks): robust when other processes hold some cores, where OpenMP's
    # barriers in every op were measured 10x slower than one thread.
    tile_cols = max(bk, (_TILE_VALUES // bn) // bk * bk)
    for r0 in range(0, n, rows_per_step):
        r1 = min(n, r0 + rows_per_step)
        src = _q8_0_rows(t, r0, r1) if t.type.name == "Q8_0" else torch.from_numpy(_rows_dequant(t, r0, r1))
        _fp8_rows_parallel(src, weight, scale, r0, r1, tile_cols, block, scale_fmt)
        _release_rows(t, r0, r1)
    return weight.reshape(t.shape), scale


def fp8_blocks_dequant(weight: Any, scale: Any, block: tuple[int, int]) -> np.ndarray:
    """Float64 FP8 weight x block scales -> values (for tests and checks): the block-FP8
    reference, kernels_triton.formats.codecs.dequantize_fp8_block, computed in float64."""
    from kernels_triton.formats.codecs import dequantize_fp8_block

    return dequantize_fp8_block(weight, scale, tuple(block), dtype=_torch().float64).numpy()


def to_float(t: GGUFTensor, *, copy: bool = True) -> Any:
    """A float tensor: F32/F16/BF16 as stored (copied unless ``copy=False``), others -> bfloat16."""
    torch = _torch()
    name = t.type.name
    if name in ("F32", "F16", "F64"):
        arr = t.plain()
        out = torch.from_numpy(np.array(arr)) if copy else to_torch(arr)
    elif name == "BF16":
        arr = t.raw().view("<i2").reshape(t.shape)
        out = (torch.from_numpy(np.array(arr)) if copy else to_torch(arr)).view(torch.bfloat16)
    else:
        n, k = _as_2d(t)
        out = torch.empty((n, k), dtype=torch.bfloat16)
        step = max(1, _CHUNK_BYTES // max(1, 4 * k))
        sub = max(1, _TILE_VALUES // max(1, k))  # rows per parallel work item
        for r0 in range(0, n, step):
            r1 = min(n, r0 + step)
            if name == "Q8_0":
                _bf16_rows_parallel(*_q8_0_rows(t, r0, r1), out[r0:r1], sub)
            else:
                out[r0:r1] = torch.from_numpy(_rows_dequant(t, r0, r1))
            if copy:
                _release_rows(t, r0, r1)
        out = out.reshape(t.shape)
    if copy:
        t.release()
    return out


def e8m0_tensor(arr: np.ndarray) -> Any:
    """uint8 E8M0 exponents as torch.float8_e8m0fnu (same bytes), or uint8 without that dtype."""
    torch = _torch()
    u8 = torch.from_numpy(np.ascontiguousarray(arr))
    dt = getattr(torch, "float8_e8m0fnu", None)
    return u8.view(dt) if dt is not None else u8


def iter_mxfp4_experts(
    t: GGUFTensor, keep: Callable[[int], bool] | None = None
) -> Iterator[tuple[int, np.ndarray, np.ndarray]]:
    """(expert, packed uint8 [N, K/2], E8M0 uint8 [N, K/32]) per expert of an MXFP4 [E, N, K].

    ``keep(expert)``: convert and yield only the experts it accepts (the others are skipped, not
    converted). Experts are repacked straight from the memory map into their own output arrays, a
    few at a time in one pool call (winport.gguf.mxfp4_repack.gguf_mxfp4_into_many: enough work
    items for every conversion thread even when one expert is smaller than threads x work item),
    and the group's source pages are dropped before the next group.
    """
    if t.type.name != "MXFP4" or len(t.ggml_dims) != 3:
        raise GGUFError(f"{t.path}: tensor {t.name!r}: expected 3-D MXFP4 experts, got {t.type.name} {t.shape}")
    e_count, n, k = t.shape
    rows = t.raw_rows()
    blocks = max(1, n * k // 32)
    # Two work items per thread per group; at most ~256 MB of outputs converted ahead of the caller.
    group = max(1, min(-(-2 * conversion_threads() * mxfp4_repack.chunk_blocks() // blocks),
                       (256 << 20) // (blocks * 17)))
    for g0 in range(0, e_count, group):
        g1 = min(e_count, g0 + group)
        todo = [e for e in range(g0, g1) if keep is None or keep(e)]
        outs = [(np.empty((n, k // 2), dtype=np.uint8), np.empty((n, k // 32), dtype=np.uint8)) for _ in todo]
        if todo:
            gguf_mxfp4_into_many([(rows[e * n : (e + 1) * n], p, s) for e, (p, s) in zip(todo, outs, strict=True)])
        _release_rows(t, g0 * n, g1 * n)
        for e, (p, s) in zip(todo, outs, strict=True):
            yield e, p, s
        del outs
    t.release()


_SKIP_SUFFIX = re.compile(r"\.weight$")

# config.json keys of a bundled DSpark draft that SGLang 0.5.23 reads (dspark_config.py,
# deepseek_v4_dspark.py _dspark_stage_config), taken from the draft GGUF's metadata.
_DSPARK_KEYS = ("dspark_block_size", "dspark_markov_rank", "dspark_target_layer_ids", "dspark_noise_token_id",
                "dspark_n_routed_experts", "dspark_num_experts_per_tok", "enable_confidence_head",
                "confidence_head_with_markov")
MMPROJ_TABLE_PATH = Path(__file__).with_name("deepseek41_mmproj_names.toml")


@dataclass
class MmprojPlan:
    """A vision projector GGUF mapped to SGLang's names: target -> GGUF tensor(s) (several = stacked)."""

    tensors: dict[str, list[str]]
    unknown: list[str]
    config: dict[str, Any]


def _mmproj_table() -> tuple[list[dict[str, Any]], dict[str, str]]:
    try:
        import tomllib
    except ImportError:  # Python 3.10
        import tomli as tomllib  # type: ignore[no-redef]
    with open(MMPROJ_TABLE_PATH, "rb") as fh:
        data = tomllib.load(fh)
    return list(data.get("tensor", [])), dict(data.get("hparams", {}))


def plan_mmproj(model: GGUFModel) -> MmprojPlan:
    """Map a DeepSeek-V4.1 mmproj GGUF through deepseek41_mmproj_names.toml and check it.

    Every missing required tensor and inconsistent shape is named in one GGUFError with the file.
    """
    from .bounds import check_hparams

    rows, hp_table = _mmproj_table()
    path = model.paths[0]
    check_hparams(model.metadata, model.tensors, path)
    names = set(model.tensors)
    cfg = {t: (v.tolist() if hasattr(v, "tolist") else v) for k, t in hp_table.items()
           if (v := model.metadata.get(k)) is not None}
    blocks = {int(m.group(1)) for n in names if (m := re.match(r"^(?:v\.blk|vision\.blocks)\.(\d+)\.", n))}
    n_blocks = int(cfg.get("vision_n_layers", max(blocks) + 1 if blocks else 0))
    cfg["vision_n_layers"] = n_blocks
    problems: list[str] = []
    if n_blocks < 1:
        problems.append("no vision blocks (v.blk.N.*)")
    tensors: dict[str, list[str]] = {}
    used: set[str] = set()
    for row in rows:
        layers: list[int | None] = list(range(n_blocks)) if "{L}" in row["target"] else [None]
        for layer in layers:
            fill = (lambda x: x.replace("{L}", str(layer))) if layer is not None else (lambda x: x)  # noqa: B023
            target = fill(row["target"])
            found = next((fill(g) for g in row["gguf"] if fill(g) in names), None)
            parts = [fill(g) for g in row.get("concat", [])]
            if found is not None:
                tensors[target] = [found]
            elif parts and all(p in names for p in parts):
                tensors[target] = parts
            elif row.get("required"):
                problems.append(f"required tensor {fill(row['gguf'][0])} missing")
                continue
            else:
                continue
            used.update(tensors[target])
    dim = cfg.get("vision_dim")
    qkv = tensors.get("vision.blocks.0.attn.wqkv.weight")
    if dim and qkv and model[qkv[0]].shape[0] != 3 * dim:
        problems.append(f"{qkv[0]} has {model[qkv[0]].shape[0]} rows, expected 3 x vision dim {dim}")
    if problems:
        raise GGUFError(f"{path}: not a usable DeepSeek-V4.1 vision projector: " + "; ".join(problems))
    return MmprojPlan(tensors, sorted(names - used), cfg)


@dataclass
class LoadedGGUF:
    """A DeepSeek-V4 GGUF model opened for streaming load (plus its draft and mmproj, if any).

    Nothing large is read at construction: names are mapped and required tensors checked first.
    """

    model: GGUFModel
    plan: _names.NamePlan
    draft: GGUFModel | None = None
    draft_plan: _names.NamePlan | None = None
    mmproj: GGUFModel | None = None
    fp8_block: tuple[int, int] = FP8_BLOCK_V4
    scale_fmt: str = "ue8m0"
    hparams: dict[str, Any] = field(default_factory=dict)

    @property
    def arch(self) -> str | None:
        """``general.architecture`` of the main model."""
        return self.model.arch

    @property
    def metadata(self) -> dict[str, Any]:
        """Main model metadata."""
        return self.model.metadata

    @property
    def unknown_tensors(self) -> list[str]:
        """Main-model tensors the name table does not map (reported, not loaded)."""
        return list(self.plan.unknown)

    def quant_config(self) -> dict[str, Any]:
        """The quantization_config the converted dense weights correspond to."""
        return {
            "quant_method": "fp8",
            "fmt": "e4m3",
            "activation_scheme": "dynamic",
            "scale_fmt": self.scale_fmt,
            "weight_block_size": list(self.fp8_block),
        }

    def mxfp4_expert_tensors(self) -> list[str]:
        """GGUF names of the main model's routed-expert tensors stored as MXFP4 (UD-Q4_K_XL's experts)."""
        return [g for g, m in self.plan.mapped.items() if m.role == "experts" and self.model[g].type.name == "MXFP4"]

    def engram_tables(self) -> dict[str, GGUFTensor]:
        """Engram hash tables by target name (``layers.N.engram.embed``), never loaded here: served
        rows are read through the memory map (winport.gguf.engram_rows), ``engram="copy"`` streams
        them (winport.gguf.to_checkpoint.EngramStream)."""
        return {m.target: self.model[g] for g, m in self.plan.mapped.items() if m.role == "engram"}

    def total_bytes(self) -> int:
        """Stored bytes of everything :meth:`weights` reads."""
        return sum(self.model[g].nbytes for g, m in self.plan.mapped.items() if m.role != "engram")

    def weights(
        self,
        *,
        progress: bool = True,
        dense_fp8: bool = True,
        expert_filter: Callable[[int, int], bool] | None = None,
        copy: bool = True,
    ) -> Iterator[tuple[str, Any]]:
        """Yield (checkpoint name, torch tensor) for the main model, streaming in file order.

        ``dense_fp8``: convert ``fp8``-role weights to block FP8 (else dequantize to bfloat16).
        ``expert_filter(layer, expert)``: yield only the routed experts it accepts (e.g. the GPU
        ones; kt-kernel reads the others through :meth:`kt_experts`). ``copy=False`` yields plain
        float tensors as read-only views of the memory map (never write into them).
        """
        yield from _stream(self.model, self.plan, self, progress, dense_fp8, expert_filter, copy, prefix=None)

    def draft_weights(self, *, progress: bool = True, dense_fp8: bool = True) -> Iterator[tuple[str, Any]]:
        """Yield the DSpark draft's stage tensors as ``mtp.<stage>.*`` names (SGLang's DSpark loader).

        Only per-stage tensors: a draft's own embedding / head / final norm (non-stage names) would
        collide with the model's in a bundled checkpoint; :meth:`draft_left_out` lists them.
        """
        if self.draft is None or self.draft_plan is None:
            return
        stage_only = _names.NamePlan(
            {g: m for g, m in self.draft_plan.mapped.items() if m.target.startswith("layers.")},
            [], [], self.draft_plan.n_layers,
        )
        # SGLang decides FP4 experts for the whole model (ModelConfig.is_fp4_experts, also the draft's
        # "mtp.*" experts, which DeepSeek ships as MXFP4): with an MXFP4 model the draft's experts
        # must be MXFP4 too. Unsloth's Q8_0 draft experts are Q8_0 of those MXFP4 values, so the
        # requantization recovers them exactly (see _experts_to_mxfp4).
        yield from _stream(self.draft, stage_only, self, progress, dense_fp8, None, True, prefix="mtp.",
                           fp4_experts=bool(self.mxfp4_expert_tensors()))

    def draft_config(self) -> dict[str, Any]:
        """Check the DSpark draft and return the config.json keys that bundle it (empty: no draft).

        SGLang 0.5.23 loads a DeepSeek-V4 DSpark draft bundled in the target checkpoint: ``mtp.<stage>.*``
        tensors next to the model's, and ``dspark_*`` keys in config.json
        (speculative/dspark_components/dspark_config.py checkpoint_bundles_dspark_draft). Raises a
        GGUFError naming the draft file and everything wrong with it at once.
        """
        if self.draft is None or self.draft_plan is None:
            return {}
        path = self.draft.paths[0]
        plan = self.draft_plan
        n = plan.n_layers
        problems = [f"required tensor {m} missing" for m in plan.missing if m.startswith("blk.")]
        if n < 1:
            problems.append("no DSpark stage tensors (blk.<stage>.*)")
        by_target = {m.target: g for g, m in plan.mapped.items()}
        need = ["layers.0.main_proj.weight", "layers.0.main_norm.weight", f"layers.{max(n - 1, 0)}.norm.weight"]
        problems += [f"DSpark tensor for {t} missing" for t in need if t not in by_target]
        markov = [t for t in by_target if ".markov_head." in t]
        if not any(t.endswith("markov_head.embed.weight") for t in markov) or not any(
            t.endswith("markov_head.head.weight") for t in markov
        ):
            problems.append("the Markov head (markov_head.embed / markov_head.head) is missing: SGLang's "
                            "DSpark V4 draft requires markov_rank > 0")
        hp = _names.hparams_from_metadata(self.draft.metadata)
        cfg: dict[str, Any] = {k: hp[k] for k in _DSPARK_KEYS if k in hp}
        embed = next((g for t, g in by_target.items() if t.endswith("markov_head.embed.weight")), None)
        if embed is not None:
            rank = self.draft[embed].shape[-1]
            if cfg.setdefault("dspark_markov_rank", rank) != rank:
                problems.append(f"markov_rank {cfg['dspark_markov_rank']} in the metadata, {rank} in {embed}")
        hidden = self.hparams.get("hidden_size")
        proj = by_target.get("layers.0.main_proj.weight")
        if proj is not None and hidden:
            k = self.draft[proj].shape[-1]
            if k % hidden:
                problems.append(f"{proj} has {k} input features, not a multiple of the model's hidden size {hidden}")
            elif "dspark_target_layer_ids" not in cfg:
                problems.append(f"metadata key {self.draft.arch}.mtp.target_layers missing: which {k // hidden} "
                                "target layers feed the draft cannot be inferred")
            elif len(cfg["dspark_target_layer_ids"]) != k // hidden:
                problems.append(f"{len(cfg['dspark_target_layer_ids'])} target layers in the metadata, "
                                f"{k // hidden} by the shape of {proj}")
        if problems:
            raise GGUFError(f"{path}: not a usable DSpark draft: " + "; ".join(problems))
        cfg["num_nextn_predict_layers"] = n
        return cfg

    def draft_left_out(self) -> list[str]:
        """Draft tensors not bundled: unknown names and non-stage tensors (SGLang's DSpark draft
        uses the target model's embedding and head)."""
        if self.draft_plan is None:
            return []
        return list(self.draft_plan.unknown) + [
            g for g, m in self.draft_plan.mapped.items() if not m.target.startswith("layers.")
        ]

    def mmproj_plan(self) -> MmprojPlan | None:
        """Check the vision projector and map its tensors (None: no mmproj). GGUFError names the file."""
        if self.mmproj is None:
            return None
        return plan_mmproj(self.mmproj)

    def mmproj_weights(self, *, copy: bool = True) -> Iterator[tuple[str, Any]]:
        """Yield the vision projector's tensors under SGLang's V4.1 vision names (bfloat16 or as stored),
        plus a zero bias (float32) for each bias SGLang's modules have and the file does not carry."""
        from .vision import zero_biases

        plan = self.mmproj_plan()
        if plan is None:
            return
        torch = _torch()
        for target, sources in plan.tensors.items():
            parts = [to_float(self.mmproj[g], copy=copy) for g in sources]
            yield target, parts[0] if len(parts) == 1 else torch.cat(parts, dim=0)
        for target in zero_biases(plan, int(plan.config["vision_n_layers"])):
            rows = sum(int(self.mmproj[g].shape[0]) for g in plan.tensors[target[: -len("bias")] + "weight"])
            yield target, torch.zeros(rows, dtype=torch.float32)

    def weight_streams(self, *, progress: bool = True, dense_fp8: bool = True) -> list[tuple[GGUFModel, Iterator[tuple[str, Any]]]]:
        """(source file, its tensors) for everything a served folder holds, in load order: the model,
        then the bundled DSpark draft and vision projector when open (what the safetensors export
        writes and what SGLang's loader reads straight from the GGUF, winport.gguf.direct)."""
        streams = [(self.model, self.weights(progress=progress, dense_fp8=dense_fp8, copy=True))]
        if self.draft is not None:
            streams.append((self.draft, self.draft_weights(progress=progress, dense_fp8=dense_fp8)))
        if self.mmproj is not None:
            streams.append((self.mmproj, self.mmproj_weights()))
        return streams

    def kt_experts(self, layer: int) -> dict[str, Iterator[tuple[int, np.ndarray, np.ndarray]]]:
        """kt-kernel MXFP4 layout per role ("w1", "w3", "w2"): iterators of (expert, nibbles, E8M0)."""
        out: dict[str, Iterator[tuple[int, np.ndarray, np.ndarray]]] = {}
        for g, m in self.plan.mapped.items():
            if m.role == "experts" and m.layer == layer:
                role = m.target.rsplit(".", 1)[1]
                out[role] = iter_mxfp4_experts(self.model[g])
        return out

    def tokenizer_dir(self, cache_dir: str | Path | None = None) -> Path:
        """Write (once) and return a directory with HF tokenizer files and the chat template."""
        from .tokenizer import tokenizer_cache_dir, write_hf_tokenizer

        d = tokenizer_cache_dir(self.metadata, cache_dir)
        if not (d / "tokenizer.json").exists():
            write_hf_tokenizer(self.metadata, d)
        return d

    def close(self) -> None:
        """Close every file."""
        for m in (self.model, self.draft, self.mmproj):
            if m is not None:
                m.close()

    def __enter__(self) -> LoadedGGUF:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _stream(
    model: GGUFModel,
    plan: _names.NamePlan,
    cfg: LoadedGGUF,
    progress: bool,
    dense_fp8: bool,
    expert_filter: Callable[[int, int], bool] | None,
    copy: bool,
    prefix: str | None,
    fp4_experts: bool = False,
) -> Iterator[tuple[str, Any]]:
    from tqdm import tqdm

    torch = _torch()
    items = [(model[g], m) for g, m in plan.mapped.items() if m.role != "engram"]
    # File order: sequential reads are what the page cache and disks do best.
    order = {p: i for i, p in enumerate(model.paths)}
    items.sort(key=lambda tm: (order[tm[0].path], tm[0].offset))

    def rename(target: str) -> str:
        return prefix + target[len("layers.") :] if prefix and target.startswith("layers.") else target

    bar = tqdm(total=sum(t.nbytes for t, _ in items), unit="B", unit_scale=True, desc="gguf load", disable=not progress)
    def whole(m: _names.Mapping) -> bool:  # is every byte of this tensor read in this pass?
        return m.role != "experts" or expert_filter is None

    try:
        if items and whole(items[0][1]):
            items[0][0].prefetch()
        for i, (t, m) in enumerate(items):
            # The next tensor's bytes are read from disk while this one converts (a cold page cache
            # would otherwise fault them in 128 KiB at a time, the disk idle during each conversion).
            # Expert tensors read only in part (the GPU's experts) are not prefetched whole.
            if i + 1 < len(items) and whole(items[i + 1][1]):
                items[i + 1][0].prefetch()
            target = rename(m.target)
            if m.role == "fp8" and dense_fp8:
                w, s = to_fp8_blocks(t, cfg.fp8_block, scale_fmt=cfg.scale_fmt)
                yield target, w
                yield _SKIP_SUFFIX.sub("", target) + ".scale", s
            elif m.role in ("fp8", "float"):
                yield target, to_float(t, copy=copy)
            elif m.role == "int":
                if t.type.name not in ("I32", "I64", "I16", "I8"):
                    raise GGUFError(f"{t.path}: tensor {t.name!r}: integer table stored as {t.type.name}")
                yield target, torch.from_numpy(np.array(t.plain()))
            elif m.role == "experts":
                if t.type.name == "MXFP4":
                    layer = m.layer or 0
                    keep = None if expert_filter is None else (lambda e, layer=layer: expert_filter(layer, e))
                    for e, packed, scales in iter_mxfp4_experts(t, keep):  # filtered ones never converted
                        base = target.replace("{E}", str(e))
                        yield base + ".weight", torch.from_numpy(packed)
                        yield base + ".scale", e8m0_tensor(scales)
                else:
                    # Non-MXFP4 experts (other quant mixes): dequantize one expert at a time.
                    e_count = t.shape[0]
                    n = t.shape[1]
                    for e in range(e_count):
                        if expert_filter is None or expert_filter(m.layer or 0, e):
                            base = target.replace("{E}", str(e))
                            if fp4_experts:
                                packed, scale = _experts_to_mxfp4(t, e * n, (e + 1) * n)
                                yield base + ".weight", packed
                                yield base + ".scale", scale
                            else:
                                yield base + ".weight", _expert_bf16(t, e * n, (e + 1) * n)
                        _release_rows(t, e * n, (e + 1) * n)
                    t.release()
            bar.update(t.nbytes)
    finally:
        bar.close()


def _expert_bf16(t: GGUFTensor, r0: int, r1: int) -> Any:
    """Rows [r0, r1) of a non-MXFP4 expert tensor (flattened [E*N, K]) dequantized to bf16."""
    torch = _torch()
    if t.type.name == "Q8_0":  # e.g. the DSpark draft's experts: torch path
        out = torch.empty((r1 - r0, t.shape[2]), dtype=torch.bfloat16)
        _bf16_rows_parallel(*_q8_0_rows(t, r0, r1), out, max(1, _TILE_VALUES // t.shape[2]))
        return out
    return torch.from_numpy(_rows_dequant(t, r0, r1)).to(torch.bfloat16)


def _experts_to_mxfp4(t: GGUFTensor, r0: int, r1: int) -> tuple[Any, Any]:
    """Rows [r0, r1) of a non-MXFP4 expert tensor as DeepSeek's MXFP4 (packed E2M1 pairs uint8 [N, K/2],
    E8M0 [N, K/32]), for a draft whose model's experts are MXFP4 (SGLang loads only that then).

    Quantized from the float32 values (kernels_triton.formats.codecs.quantize_mxfp4: per 32 values the scale
    2^(floor(log2 amax') - 2), E2M1 rounded to nearest even). The served values are exactly the MXFP4
    values for Q8_0 made from MXFP4 values, as Unsloth's draft experts are: Q8_0 shares MXFP4's
    32-value blocks and brings back each value of a block with maximum M within d/2 (d = fp16(M/127),
    so about M/254), below half the smallest E2M1 step of the scale found (>= M/32). The scale comes
    from the maximum, which reads back as 127 * d, up to 2^-11 below M: for a power-of-two M (4 * 2^e
    read back as 3.9998 * 2^e) that would halve the scale, so amax' = amax * (1 + 2^-6) puts it back;
    no MXFP4 maximum (0.5, 1, 1.5, 2, 3, 4 or 6 times 2^e) lies within 2^-6 below the next power of
    two, so the slack never picks a larger scale. Other values are rounded to MXFP4.
    """
    from kernels_triton.formats.codecs import quantize_mxfp4

    torch = _torch()
    if t.shape[2] % MXFP4_GROUP:
        raise GGUFError(f"{t.path}: tensor {t.name!r}: rows of {t.shape[2]} values cannot be MXFP4 (32-value blocks)")
    w = torch.from_numpy(_rows_dequant(t, r0, r1)).float()
    packed, scale = quantize_mxfp4(w, name=t.name, amax_slack=2.0**-6)
    return packed.view(torch.uint8), scale


_MMPROJ_RE = re.compile(r"mmproj", re.IGNORECASE)
_DRAFT_RE = re.compile(r"dspark|draft|mtp", re.IGNORECASE)


def _find_sidecar(model_paths: list[Path], pattern: re.Pattern[str], what: str) -> Path | None:
    folder = model_paths[0].parent
    own = {p.resolve() for p in model_paths}
    cands = sorted(
        p for p in folder.glob("*.gguf") if p.resolve() not in own and pattern.search(p.name)
    )
    if what == "draft":
        cands = [p for p in cands if not _MMPROJ_RE.search(p.name)]
    # Shards of one sidecar count once.
    firsts = sorted({shard_paths(p)[0] for p in cands})
    if not firsts:
        return None
    if len(firsts) > 1:
        raise GGUFError(f"{folder}: several {what} GGUF files, name one: {', '.join(map(str, firsts))}")
    return firsts[0]


def _main_model_path(path: Path) -> Path:
    if not path.is_dir():
        return path
    cands = sorted(
        p for p in path.glob("*.gguf") if not _MMPROJ_RE.search(p.name) and not _DRAFT_RE.search(p.name)
    )
    firsts = sorted({shard_paths(p)[0] for p in cands})
    if len(firsts) != 1:
        raise GGUFError(f"{path}: expected one model GGUF (single or split), found {len(firsts)}: {', '.join(map(str, firsts))}")
    return firsts[0]


def load_gguf_model(
    path: str | Path,
    *,
    draft: str | Path | bool | None = None,
    mmproj: str | Path | bool | None = None,
    fp8_block: tuple[int, int] | None = None,
    scale_fmt: str = "ue8m0",
    require: bool = True,
) -> LoadedGGUF:
    """Open a DeepSeek-V4/V4.1 GGUF model (file, any shard, or folder) for streaming load.

    ``draft`` / ``mmproj``: a path, ``False`` to skip, or ``None`` to look next to the model (file
    names containing "dspark"/"draft"/"mtp" and "mmproj"). Required tensors are checked before any
    tensor data is read; all missing ones are named in one GGUFError. ``fp8_block`` defaults to
    [32, 32] for deepseek41 and [128, 128] otherwise.
    """
    main = _main_model_path(Path(path))
    model = open_gguf(main)
    try:
        n_layers = _names.n_layers_from_metadata(model.metadata, model.tensors, main)
        plan = _names.plan_names(model.tensors, n_layers)
        if require:
            plan.check(main)
        draft_model = draft_plan = mm_model = None
        if draft is not False:
            dpath = Path(draft) if draft not in (None, True) else _find_sidecar(model.paths, _DRAFT_RE, "draft")
            if dpath is not None:
                draft_model = open_gguf(dpath)
                dn = _names.n_layers_from_metadata(draft_model.metadata, draft_model.tensors, dpath)
                draft_plan = _names.plan_names(draft_model.tensors, dn)
        if mmproj is not False:
            mpath = Path(mmproj) if mmproj not in (None, True) else _find_sidecar(model.paths, _MMPROJ_RE, "mmproj")
            if mpath is not None:
                mm_model = open_gguf(mpath)
    except BaseException:
        model.close()
        raise
    return LoadedGGUF(
        model=model,
        plan=plan,
        draft=draft_model,
        draft_plan=draft_plan,
        mmproj=mm_model,
        fp8_block=fp8_block or fp8_block_for_arch(model.arch),
        scale_fmt=scale_fmt,
        hparams=_names.hparams_from_metadata(model.metadata),
    )


def expert_bytes(n: int, k: int) -> int:
    """Bytes of one MXFP4 expert matrix [n, k] (nibbles + exponents)."""
    return n * k // 2 + n * math.ceil(k / 32)
