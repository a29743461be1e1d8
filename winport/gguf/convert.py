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
- ``engram`` role: never loaded; :class:`EngramTable` reads rows through the memory map.

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

from . import names as _names
from .dequant import E4M3FN_VALUES, dequantize
from .mxfp4_repack import gguf_mxfp4_into
from .reader import GGUFError, GGUFModel, GGUFTensor, open_gguf, shard_paths, to_torch

FP8_E4M3_MAX = 448.0
FP8_BLOCK_V4 = (128, 128)
FP8_BLOCK_V41 = (32, 32)
# Rows converted per numpy/torch step: bounds temporaries to ~64 MB of float32.
_CHUNK_BYTES = 64 << 20


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
    nblk = cols // 32
    raw = to_torch(t.raw_rows()[r0:r1])  # uint8 [R, nblk * 34], read-only: never written
    blocks = raw.view(r1 - r0, nblk, 34)
    d = raw.view(torch.float16).view(r1 - r0, nblk, 17)[:, :, 0]
    q = blocks.view(torch.int8)[:, :, 2:]
    return d, q


def _q8_0_values(d: Any, q: Any) -> Any:
    """float32 [R, nblk, 32] = d * q, exactly as ggml (and dequant._dq_q8_0) computes it."""
    x = q.float()
    x.mul_(d.float().unsqueeze(-1))
    return x


def _ue8m0_scales(amax: np.ndarray) -> np.ndarray:
    return np.exp2(np.ceil(np.log2(np.maximum(amax, np.float32(2.0**-126))))).astype(np.float32)


def _block_scales(amax: np.ndarray, scale_fmt: str) -> np.ndarray:
    """Per-block scale from the block's max |value| (float32 [rb, cb]); the formula every path uses.

    amax / 448, rounded up to a power of two for "ue8m0"; blocks whose max is 0 (or NaN) get 1.
    """
    s = amax / np.float32(FP8_E4M3_MAX)
    if scale_fmt == "ue8m0":
        s = _ue8m0_scales(s)
    return np.where(amax > 0, s, np.float32(1.0)).astype(np.float32)


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
    """float32 rows [R, K] (R a multiple of bn except at the end) -> (float32 values / scale, clamped;
    scales [ceil(R/bn), ceil(K/bk)]). Works for any input values, NaN and inf included."""
    torch = _torch()
    bn, bk = block
    rows, k = x.shape
    xp = _pad_blocks(x, bn, bk)
    rp, kp = xp.shape
    blocks = xp.view(rp // bn, bn, kp // bk, bk)
    amax = torch.amax(blocks.abs(), dim=(1, 3)).numpy()  # amax propagates NaN, as numpy's max
    s = _block_scales(amax, scale_fmt)
    blocks.div_(torch.from_numpy(s)[:, None, :, None])
    xp.clamp_(-FP8_E4M3_MAX, FP8_E4M3_MAX)
    return (xp[:rows, :k] if xp is not x else xp), s


def _fp8_chunk_q8_ue8m0(d: Any, q: Any, block: tuple[int, int]) -> tuple[Any, np.ndarray] | None:
    """Q8_0 rows -> (float32 values / scale, scales) for power-of-two scales, or None to fall back.

    Exact shortcut, valid when every d is finite: d * q is exact in float32 (11 x 8 significant
    bits), so the block max is |d| x max|q| per Q8_0 block, and with s = 2^e both (d*q)/s and
    q * (d/s) are exact: the same float32 value the general path computes, in two cheap passes
    over the values instead of five. Non-finite d (NaN/inf scales in a damaged file) take the
    general path, which reproduces NaN propagation exactly.
    """
    torch = _torch()
    bn, bk = block
    if bk % 32:
        return None
    df = d.float()
    if not bool(torch.isfinite(df).all()):
        return None
    rows, nblk = df.shape
    qmin, qmax = torch.aminmax(q, dim=-1)
    amax_q8 = df.abs() * torch.maximum(qmax.float(), qmin.float().neg())  # exact, per Q8_0 block
    per = bk // 32
    amax = torch.amax(_pad_blocks(amax_q8, bn, per).view(-(-rows // bn), bn, -(-nblk // per), per), dim=(1, 3))
    amax_np = amax.numpy()
    s = _block_scales(amax_np, "ue8m0")
    st = torch.from_numpy(s)
    f = df / st.repeat_interleave(bn, 0)[:rows].repeat_interleave(per, 1)[:, :nblk]  # exact: s = 2^e
    x = q.float()
    x.mul_(f.unsqueeze(-1))
    if not bool(np.all(s * np.float32(FP8_E4M3_MAX) >= amax_np)):
        # log2 rounding put a scale below amax / 448: clip as the general path does.
        x.clamp_(-FP8_E4M3_MAX, FP8_E4M3_MAX)
    return x.view(rows, nblk * 32), s


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

    Streaming: rows are converted in chunks of whole row blocks straight from the memory map
    (torch ops, intra-op threads), each chunk's source pages dropped afterwards, so the only
    full-size allocation is the output.
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
    q8 = t.type.name == "Q8_0"
    for r0 in range(0, n, rows_per_step):
        r1 = min(n, r0 + rows_per_step)
        res = None
        if q8:
            d, q = _q8_0_rows(t, r0, r1)
            if scale_fmt == "ue8m0":
                res = _fp8_chunk_q8_ue8m0(d, q, block)
            if res is None:
                res = _fp8_chunk_general(_q8_0_values(d, q).view(r1 - r0, k), block, scale_fmt)
        else:
            res = _fp8_chunk_general(torch.from_numpy(_rows_dequant(t, r0, r1)), block, scale_fmt)
        x, s = res
        weight[r0:r1] = x
        scale[r0 // bn : r0 // bn + s.shape[0]] = torch.from_numpy(s)
        _release_rows(t, r0, r1)
    return weight.reshape(t.shape), scale


def fp8_blocks_dequant(weight: Any, scale: Any, block: tuple[int, int]) -> np.ndarray:
    """Float64 reference: FP8 weight x block scales -> values (for tests and checks)."""
    bn, bk = block
    w = E4M3FN_VALUES[weight.view(_torch().uint8).numpy()].astype(np.float64)
    s = scale.numpy().astype(np.float64)
    s_full = np.repeat(np.repeat(s, bn, axis=0), bk, axis=1)[: w.shape[0], : w.shape[1]]
    return w * s_full


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
        for r0 in range(0, n, step):
            r1 = min(n, r0 + step)
            if name == "Q8_0":
                out[r0:r1] = _q8_0_values(*_q8_0_rows(t, r0, r1)).view(r1 - r0, k)
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


def iter_mxfp4_experts(t: GGUFTensor) -> Iterator[tuple[int, np.ndarray, np.ndarray]]:
    """(expert, packed uint8 [N, K/2], E8M0 uint8 [N, K/32]) per expert of an MXFP4 [E, N, K].

    Each expert is repacked straight from the memory map into its own output arrays (threaded,
    winport.gguf.mxfp4_repack) and its source pages are dropped before the next one.
    """
    if t.type.name != "MXFP4" or len(t.ggml_dims) != 3:
        raise GGUFError(f"{t.path}: tensor {t.name!r}: expected 3-D MXFP4 experts, got {t.type.name} {t.shape}")
    e_count, n, k = t.shape
    rows = t.raw_rows()
    for e in range(e_count):
        packed = np.empty((n, k // 2), dtype=np.uint8)
        scales = np.empty((n, k // 32), dtype=np.uint8)
        gguf_mxfp4_into(rows[e * n : (e + 1) * n], packed, scales)
        _release_rows(t, e * n, (e + 1) * n)
        yield e, packed, scales
    t.release()


@dataclass
class EngramTable:
    """Memory-mapped engram hash table: rows are read on demand, the table is never loaded whole.

    For MXFP8 (and F8_E4M3_B128) rows the FP8 values and E8M0 scales are split without any
    arithmetic, giving SGLang's EngramEmbedding layout: weight float8_e4m3fn [rows, dim], scale
    E8M0 [rows, dim/32].
    """

    name: str
    tensor: GGUFTensor

    @property
    def num_rows(self) -> int:
        """Number of rows (hash buckets)."""
        return self.tensor.shape[0] if self.tensor.shape else 0

    @property
    def dim(self) -> int:
        """Values per row."""
        return self.tensor.ggml_dims[0]

    def raw_rows(self, idx: Any) -> np.ndarray:
        """Stored bytes of the selected rows (slice or index array): uint8 [n, row_bytes]."""
        return self.tensor.raw_rows()[idx]

    def rows(self, idx: Any) -> np.ndarray:
        """Selected rows dequantized to float32 [n, dim]."""
        raw = np.ascontiguousarray(self.raw_rows(idx))
        n = raw.shape[0] if raw.ndim == 2 else 1
        return dequantize(raw, self.tensor.type.id, (n, self.dim), name=self.name, path=self.tensor.path)

    def fp8_rows(self, idx: Any) -> tuple[np.ndarray, np.ndarray]:
        """(e4m3 bytes uint8 [n, dim], E8M0 bytes uint8 [n, dim/32]) of the selected rows."""
        raw = np.atleast_2d(self.raw_rows(idx))
        tname = self.tensor.type.name
        n = raw.shape[0]
        if tname == "MXFP8":
            b = raw.reshape(n, -1, 264)
            return (
                np.ascontiguousarray(b[:, :, 8:]).reshape(n, self.dim),
                np.ascontiguousarray(b[:, :, :8]).reshape(n, self.dim // 32),
            )
        if tname == "F8_E4M3_B128":
            # One exponent per 128 values: repeat it for each 32-value group.
            b = raw.reshape(n, -1, 129)
            return (
                np.ascontiguousarray(b[:, :, 1:]).reshape(n, self.dim),
                np.repeat(b[:, :, 0], 4, axis=1),
            )
        raise GGUFError(f"{self.tensor.path}: tensor {self.name!r}: {tname} rows are not FP8 + E8M0")

    def iter_chunks(self, rows_per_chunk: int = 1 << 20) -> Iterator[tuple[int, Any, Any]]:
        """(first row, weight float8_e4m3fn, scale E8M0) chunks for a row-sharded weight loader."""
        torch = _torch()
        for r0 in range(0, self.num_rows, rows_per_chunk):
            r1 = min(self.num_rows, r0 + rows_per_chunk)
            w, s = self.fp8_rows(slice(r0, r1))
            yield r0, torch.from_numpy(w).view(torch.float8_e4m3fn), e8m0_tensor(s)
            row_bytes = self.tensor.type.row_bytes(self.dim)
            self.tensor._file._release(self.tensor.offset + r0 * row_bytes, (r1 - r0) * row_bytes)


_SKIP_SUFFIX = re.compile(r"\.weight$")


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

    def engram_tables(self) -> dict[str, EngramTable]:
        """Engram hash tables by target name (``layers.N.engram.embed``), memory-mapped."""
        return {
            m.target: EngramTable(m.target, self.model[g])
            for g, m in self.plan.mapped.items()
            if m.role == "engram"
        }

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
        """Yield the DSpark draft's tensors as ``mtp.<stage>.*`` names (SGLang's DSpark loader)."""
        if self.draft is None or self.draft_plan is None:
            return
        yield from _stream(self.draft, self.draft_plan, self, progress, dense_fp8, None, True, prefix="mtp.")

    def mmproj_weights(self, *, copy: bool = True) -> Iterator[tuple[str, Any]]:
        """Yield the vision projector's tensors under their GGUF names (mapping still to do)."""
        if self.mmproj is None:
            return
        for t in self.mmproj:
            yield t.name, to_float(t, copy=copy)

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
    try:
        for t, m in items:
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
                    for e, packed, scales in iter_mxfp4_experts(t):
                        if expert_filter is None or expert_filter(m.layer or 0, e):
                            base = target.replace("{E}", str(e))
                            yield base + ".weight", torch.from_numpy(packed)
                            yield base + ".scale", e8m0_tensor(scales)
                else:
                    # Non-MXFP4 experts (other quant mixes): dequantize one expert at a time.
                    e_count = t.shape[0]
                    n = t.shape[1]
                    for e in range(e_count):
                        if expert_filter is None or expert_filter(m.layer or 0, e):
                            x = _rows_dequant(t, e * n, (e + 1) * n)
                            yield target.replace("{E}", str(e)) + ".weight", torch.from_numpy(x).to(torch.bfloat16)
                    t.release()
            bar.update(t.nbytes)
    finally:
        bar.close()


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
        n_layers = _names.n_layers_from_metadata(model.metadata, model.tensors)
        plan = _names.plan_names(model.tensors, n_layers)
        if require:
            plan.check(main)
        draft_model = draft_plan = mm_model = None
        if draft is not False:
            dpath = Path(draft) if draft not in (None, True) else _find_sidecar(model.paths, _DRAFT_RE, "draft")
            if dpath is not None:
                draft_model = open_gguf(dpath)
                dn = _names.n_layers_from_metadata(draft_model.metadata, draft_model.tensors)
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
