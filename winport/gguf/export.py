"""Write a DeepSeek-V4 checkpoint folder as a GGUF with llama.cpp's deepseek4 names and hparams.

The inverse of what :mod:`winport.gguf.to_checkpoint` reads: tensor names come from the name table
(deepseek4_names.toml) used backwards (the first GGUF alias of each target), hparams from the
same table's ``[hparams]`` section (see :mod:`winport.gguf.hparams`), the tokenizer as llama.cpp
stores a byte-level BPE (``tokenizer.ggml.*``) plus ``tokenizer.chat_template``. It exists so the
demo model can be served from a GGUF and compared with its safetensors form; it is not a general
quantizer. Tensors keep their stored type (BF16/F32/I32); ``dense_q8_0=True`` stores the dense
linear weights (the table's ``fp8`` role, the ones Unsloth ships as Q8_0) as Q8_0, quantized by
gguf-py. Routed experts per layer are stacked into one [E, N, K] tensor, as GGUF keeps them;
``experts_mxfp4=True`` stores those as MXFP4 (gguf-py's quantizer), the mix Unsloth's UD-Q4_K_XL
ships (Q8_0 dense + MXFP4 routed experts). The demo's bf16 experts are exact MXFP4 values
(winport.demo.quantize), so for the demo that re-quantization is lossless.

Tensors are written one at a time (gguf-py's streaming writer: infos first, then data), so at
most one GGUF tensor (for experts: one stacked layer) is in memory.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from kernels_triton.formats import GGML_BLOCKS, GGMLType

from . import hparams as _hp
from . import names as _names
from .reader import GGUFError

Q8_0_BLOCK, Q8_0_BYTES = GGML_BLOCKS[GGMLType.Q8_0]  # fp16 scale + 32 int8
MXFP4_BLOCK, MXFP4_BYTES = GGML_BLOCKS[GGMLType.MXFP4]  # one E8M0 exponent + 32 E2M1 codes (two per byte)
MXFP8_BLOCK, MXFP8_BYTES = GGML_BLOCKS[GGMLType.MXFP8]  # fork type 43: 8 E8M0 scales, then 256 e4m3 values
MXFP8_TYPE_ID = int(GGMLType.MXFP8)
# Checkpoint tensors and config keys of the V4.1 vision tower: written to the mmproj GGUF only.
_VISION_PREFIXES = ("vision.", "aligner.", "image_")
VISION_CONFIG_PREFIXES = ("vision_", "image_token_id")


@dataclass(frozen=True)
class _Reverse:
    regex: re.Pattern[str]
    gguf: str
    role: str


def _reverse_table() -> list[_Reverse]:
    """Checkpoint-name regexes -> first GGUF name of each table row (experts: per-expert names)."""
    entries, _ = _names.load_table()
    out = []
    for e in entries:
        pat = re.escape(e.target).replace(r"\{L\}", r"(?P<L>\d+)").replace(r"\{E\}", r"(?P<E>\d+)")
        if e.role == "experts":
            pat += r"\.weight"  # converters yield <target>.weight per expert
        elif e.role == "engram":
            # The checkpoint holds the table as two tensors (FP8 rows + E8M0 scales); the GGUF as one.
            pat += r"\.(?P<part>weight|scale)"
        out.append(_Reverse(re.compile("^" + pat + "$"), e.gguf[0], e.role))
    return out


def gguf_name(name: str) -> tuple[str, str, int | None]:
    """(GGUF tensor name, table role, expert index or None) of one checkpoint tensor name."""
    for r in _reverse_table():
        m = r.regex.match(name)
        if m:
            g = r.gguf.replace("{L}", m.group("L")) if "L" in r.regex.groupindex else r.gguf
            e = int(m.group("E")) if "E" in r.regex.groupindex else None
            return g, r.role, e
    raise GGUFError(f"tensor {name!r}: the name table has no GGUF name for it")


# --- tokenizer -------------------------------------------------------------------------------

TOKEN_NORMAL, TOKEN_CONTROL, TOKEN_USER_DEFINED = 1, 3, 4


def _pre_name(pre: dict[str, Any] | None) -> str:
    """llama.cpp's ``tokenizer.ggml.pre`` for a tokenizers pre-tokenizer we know how to rebuild."""
    if pre and pre.get("type") == "ByteLevel" and pre.get("use_regex", True):
        return "gpt2"  # ByteLevel's own regex is GPT-2's
    if pre and pre.get("type") == "Sequence":
        kinds = [p.get("type") for p in pre.get("pretokenizers", [])]
        if kinds and kinds[-1] == "ByteLevel" and all(k == "Split" for k in kinds[:-1]):
            return "deepseek-v3"
    raise GGUFError(f"tokenizer.json: pre-tokenizer {pre!r} has no llama.cpp 'tokenizer.ggml.pre' name here")


def tokenizer_metadata(folder: Path) -> dict[str, tuple[Any, str]]:
    """``tokenizer.ggml.*`` and ``tokenizer.chat_template`` of a HF byte-level BPE tokenizer folder."""
    tj = json.loads((folder / "tokenizer.json").read_text(encoding="utf-8"))
    tc_path = folder / "tokenizer_config.json"
    tc = json.loads(tc_path.read_text(encoding="utf-8")) if tc_path.exists() else {}
    model = tj.get("model", {})
    if model.get("type") != "BPE":
        raise GGUFError(f"{folder / 'tokenizer.json'}: model type {model.get('type')!r}, only BPE is exported")
    vocab: dict[str, int] = dict(model["vocab"])
    for t in tj.get("added_tokens", []):
        vocab[t["content"]] = t["id"]
    n = max(vocab.values()) + 1
    tokens = [""] * n
    for text, i in vocab.items():
        tokens[i] = text
    if any(t == "" for t in tokens):
        raise GGUFError(f"{folder / 'tokenizer.json'}: token ids have gaps")
    types = [TOKEN_NORMAL] * n
    for t in tj.get("added_tokens", []):
        types[t["id"]] = TOKEN_CONTROL if t.get("special") else TOKEN_USER_DEFINED
    merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges", [])]
    meta: dict[str, tuple[Any, str]] = {
        "tokenizer.ggml.model": ("gpt2", "STRING"),
        "tokenizer.ggml.pre": (_pre_name(tj.get("pre_tokenizer")), "STRING"),
        "tokenizer.ggml.tokens": (tokens, "ARRAY:STRING"),
        "tokenizer.ggml.token_type": (types, "ARRAY:INT32"),
        "tokenizer.ggml.merges": (merges, "ARRAY:STRING"),
        "tokenizer.ggml.add_bos_token": (bool(tc.get("add_bos_token", False)), "BOOL"),
        "tokenizer.ggml.add_eos_token": (bool(tc.get("add_eos_token", False)), "BOOL"),
    }

    def tok_text(v: Any) -> str | None:
        return v.get("content") if isinstance(v, dict) else v

    for field_name, key in (("bos_token", "bos_token_id"), ("eos_token", "eos_token_id"),
                            ("pad_token", "padding_token_id"), ("unk_token", "unknown_token_id")):
        text = tok_text(tc.get(field_name))
        if text is not None and text in vocab:
            meta[f"tokenizer.ggml.{key}"] = (vocab[text], "UINT32")
    template = tc.get("chat_template")
    if template is None and (folder / "chat_template.jinja").exists():
        template = (folder / "chat_template.jinja").read_text(encoding="utf-8")
    if isinstance(template, str):
        meta["tokenizer.chat_template"] = (template, "STRING")
    return meta


# --- tensors ---------------------------------------------------------------------------------


@dataclass
class _Planned:
    gguf: str
    role: str
    sources: list[tuple[str, str]]  # (safetensors file, tensor name); several = stacked experts
    shape: tuple[int, ...]  # numpy order, stacked
    dtype: str  # safetensors dtype string
    q8_0: bool = False
    mxfp4: bool = False  # stacked routed experts stored as GGML MXFP4


_ST_TO_NP = {"BF16": np.int16, "F32": np.float32, "F16": np.float16, "I32": np.int32, "I64": np.int64,
             "I16": np.int16, "I8": np.int8, "F64": np.float64}


def _model_name(name: str) -> str | None:
    """The model GGUF holds every checkpoint tensor but the bundled DSpark draft's ``mtp.*`` and the
    V4.1 vision tower's ``vision.*`` / ``aligner.*`` / ``image_*`` (those go to the mmproj GGUF,
    :func:`mmproj_to_gguf`, as llama.cpp splits them)."""
    return None if name.startswith(("mtp.", *_VISION_PREFIXES)) else name


def _draft_name(name: str) -> str | None:
    """The draft GGUF holds ``mtp.<stage>.*`` as stage ``blk.<stage>.*`` (``layers.<stage>.*`` targets)."""
    return "layers." + name[len("mtp."):] if name.startswith("mtp.") else None


def _plan_tensors(folder: Path, dense_q8_0: bool, rename: Any = _model_name,
                  experts_q8_0: bool = False, experts_mxfp4: bool = False) -> list[_Planned]:
    """Plan the GGUF tensors of ``folder``'s safetensors. ``rename``: checkpoint name -> table name
    (None: not in this file). ``dense_q8_0`` / ``experts_q8_0``: store the ``fp8`` role / stacked
    routed experts as Q8_0 (rows whose width is a multiple of 32; others keep their type).
    ``experts_mxfp4``: store the stacked routed experts as MXFP4; every expert row width must be a
    multiple of 32 (else GGUFError naming the tensor: a model whose experts silently stayed BF16
    would not be the quant mix asked for)."""
    from safetensors import safe_open

    if experts_q8_0 and experts_mxfp4:
        raise GGUFError("routed experts can be stored as Q8_0 or as MXFP4, not both")
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise GGUFError(f"{folder}: no *.safetensors files")
    plans: dict[str, _Planned] = {}
    experts: dict[str, dict[int, tuple[str, str, tuple[int, ...], str]]] = {}
    engram: dict[str, dict[str, tuple[str, str, tuple[int, ...], str]]] = {}
    for f in files:
        with safe_open(str(f), framework="pt") as st:
            for name in st.keys():  # noqa: SIM118 - safe_open is not a dict
                table_name = rename(name)
                if table_name is None:
                    continue
                sl = st.get_slice(name)
                shape, dtype = tuple(sl.get_shape()), sl.get_dtype()
                g, role, e = gguf_name(table_name)
                if role == "engram":
                    engram.setdefault(g, {})["scale" if name.endswith(".scale") else "weight"] = (
                        str(f), name, shape, dtype)
                    continue
                if dtype not in _ST_TO_NP:
                    raise GGUFError(f"{f}: tensor {name!r}: dtype {dtype} is not exported")
                if e is not None:
                    experts.setdefault(g, {})[e] = (str(f), name, shape, dtype)
                    continue
                if g in plans:
                    raise GGUFError(f"{f}: tensors {plans[g].sources[0][1]!r} and {name!r} both map to {g!r}")
                q8 = dense_q8_0 and role == "fp8" and len(shape) == 2 and shape[1] % Q8_0_BLOCK == 0
                plans[g] = _Planned(g, role, [(str(f), name)], shape, dtype, q8)
    for g, by_e in experts.items():
        if sorted(by_e) != list(range(len(by_e))):
            raise GGUFError(f"{folder}: experts of {g!r} are not numbered 0..{len(by_e) - 1}")
        first = by_e[0]
        if any(v[2] != first[2] or v[3] != first[3] for v in by_e.values()):
            raise GGUFError(f"{folder}: experts of {g!r} differ in shape or dtype")
        shape = (len(by_e), *first[2])
        if experts_mxfp4 and (len(shape) != 3 or shape[-1] % MXFP4_BLOCK):
            raise GGUFError(f"{folder}: tensor {g!r} (experts {first[1]!r}, ...) {list(shape)}: MXFP4 stores "
                            f"rows of whole {MXFP4_BLOCK}-value blocks, and {shape[-1]} values per row is not "
                            f"a multiple of {MXFP4_BLOCK}")
        plans[g] = _Planned(g, "experts", [(v[0], v[1]) for _, v in sorted(by_e.items())], shape, first[3],
                            experts_q8_0 and shape[-1] % Q8_0_BLOCK == 0, experts_mxfp4)
    for g, parts in engram.items():
        plans[g] = _plan_engram(folder, g, parts)

    def order(p: _Planned) -> tuple[int, int, str]:
        m = re.match(r"^blk\.(\d+)\.", p.gguf)
        return (1, int(m.group(1)), p.gguf) if m else (0, 0, p.gguf)

    return sorted(plans.values(), key=order)


def engram_gguf_shape(rows: int, dim: int) -> tuple[int, int]:
    """numpy-order shape of an engram table of ``rows`` x ``dim`` values stored as MXFP8.

    ggml needs whole 256-value MXFP8 blocks per GGUF row. V4.1-Flash's rows are 256 wide (one block
    each: the shape is [rows, dim]); narrower rows whose width divides 256 (the demo's 64) are
    packed back to back, ``256 // dim`` table rows per GGUF row, the last GGUF row zero-padded.
    Both layouts are the same byte stream of blocks (8 E8M0 scales, then 256 e4m3 values), so the
    reader splits them the same way and takes ``rows`` / ``dim`` from the engram hparams.
    """
    if dim % MXFP8_BLOCK == 0:
        return rows, dim
    if MXFP8_BLOCK % dim or dim % 32:
        raise GGUFError(f"engram row width {dim}: neither a multiple nor a divisor of the MXFP8 block "
                        f"({MXFP8_BLOCK}) in whole 32-value scale groups")
    return -(-rows * dim // MXFP8_BLOCK), MXFP8_BLOCK


def _plan_engram(folder: Path, g: str, parts: dict[str, tuple[str, str, tuple[int, ...], str]]) -> _Planned:
    if set(parts) != {"weight", "scale"}:
        missing = sorted({"weight", "scale"} - set(parts))
        raise GGUFError(f"{folder}: engram table {g!r} lacks its {', '.join(missing)} tensor")
    (fw, nw, sw, dw), (fs, ns, ss, ds) = parts["weight"], parts["scale"]
    if dw != "F8_E4M3" or ds != "F8_E8M0":
        raise GGUFError(f"{folder}: engram table {nw!r}/{ns!r} is {dw}/{ds}, exported only as F8_E4M3 + F8_E8M0")
    if len(sw) != 2 or tuple(ss) != (sw[0], sw[1] // 32):
        raise GGUFError(f"{folder}: engram table {nw!r} {list(sw)} with scales {list(ss)}: "
                        "want [rows, dim] and [rows, dim / 32]")
    return _Planned(g, "engram", [(fw, nw), (fs, ns)], engram_gguf_shape(sw[0], sw[1]), "MXFP8")


def _engram_blocks(p: _Planned) -> np.ndarray:
    """FP8 rows + E8M0 scales -> MXFP8 blocks uint8 [n_blocks, 264] (bytes copied, zero-padded)."""
    import torch
    from safetensors import safe_open

    (fw, nw), (fs, ns) = p.sources
    with safe_open(fw, framework="pt") as st:
        w = st.get_tensor(nw).view(torch.uint8).numpy().reshape(-1)
    with safe_open(fs, framework="pt") as st:
        s = st.get_tensor(ns).view(torch.uint8).numpy().reshape(-1)
    n_blocks = p.shape[0] * p.shape[1] // MXFP8_BLOCK
    out = np.zeros((n_blocks, MXFP8_BYTES), dtype=np.uint8)
    n_full = w.size // MXFP8_BLOCK
    out[:n_full, 8:] = w[: n_full * MXFP8_BLOCK].reshape(n_full, MXFP8_BLOCK)
    out[:n_full, :8] = s[: n_full * 8].reshape(n_full, 8)
    tail = w.size - n_full * MXFP8_BLOCK
    if tail:
        out[n_full, 8 : 8 + tail] = w[n_full * MXFP8_BLOCK :]
        out[n_full, : tail // 32] = s[n_full * 8 :]
    return out


def _load(p: _Planned) -> np.ndarray:
    """The planned tensor's stored bytes as numpy (bf16 as int16), experts stacked."""
    from safetensors import safe_open

    if p.role == "engram":
        return _engram_blocks(p)
    parts = []
    for f, name in p.sources:
        with safe_open(f, framework="pt") as st:
            t = st.get_tensor(name)
        if p.dtype == "BF16":
            import torch

            t = t.view(torch.int16)
        parts.append(t.numpy())
    return parts[0] if len(parts) == 1 else np.stack(parts)


def _as_float32(p: _Planned, arr: np.ndarray) -> np.ndarray:
    """The stored values of ``arr`` (bf16 arrives as int16 bit patterns) as float32 (exact)."""
    import torch

    return torch.from_numpy(arr).view(torch.bfloat16).float().numpy() if p.dtype == "BF16" else arr.astype(np.float32)


def _quantize_q8_0(p: _Planned, arr: np.ndarray) -> np.ndarray:
    import gguf

    return gguf.quants.quantize(_as_float32(p, arr), gguf.GGMLQuantizationType.Q8_0)


# Values per gguf-py MXFP4 quantizer call: its [blocks, 32, 16] float32 error table takes 64 bytes
# per value (~64 MB here), where a whole stacked layer of a real model would need hundreds of GB.
_MXFP4_CHUNK_VALUES = 1 << 20


def _quantize_mxfp4(p: _Planned, arr: np.ndarray) -> np.ndarray:
    """Stacked experts [E, N, K] -> MXFP4 blocks uint8 [E, N, K / 32 * 17], by gguf-py's quantizer
    (E8M0 exponent floor(log2 amax) - 2, nearest E2M1 code: the OCP MX rule winport.demo.quantize
    uses too), a chunk of rows at a time."""
    import gguf

    if not (arr.ndim == 3 and arr.shape[-1] % MXFP4_BLOCK == 0):  # _plan_tensors checked; a changed file
        raise GGUFError(f"tensor {p.gguf!r} ({p.sources[0][1]!r} ...): shape {list(arr.shape)} is not "
                        f"[experts, rows, a multiple of {MXFP4_BLOCK}]: cannot store it as MXFP4")
    k = arr.shape[-1]
    rows = arr.reshape(-1, k)
    out = np.empty((rows.shape[0], k // MXFP4_BLOCK * MXFP4_BYTES), dtype=np.uint8)
    step = max(1, _MXFP4_CHUNK_VALUES // k)
    for r0 in range(0, rows.shape[0], step):
        out[r0 : r0 + step] = gguf.quants.quantize(_as_float32(p, rows[r0 : r0 + step]),
                                                   gguf.GGMLQuantizationType.MXFP4)
    return out.reshape(*arr.shape[:-1], -1)


def _ggml_type(p: _Planned) -> Any:
    import gguf

    T = gguf.GGMLQuantizationType
    if p.q8_0:
        return T.Q8_0
    if p.mxfp4:
        return T.MXFP4
    if p.dtype == "MXFP8":
        return MXFP8_TYPE_ID  # a fork id gguf-py's enum lacks; its writer stores the number as is
    return {"BF16": T.BF16, "F32": T.F32, "F16": T.F16, "F64": T.F64, "I32": T.I32, "I64": T.I64,
            "I16": T.I16, "I8": T.I8}[p.dtype]


def _nbytes(p: _Planned) -> int:
    n = int(np.prod(p.shape, dtype=np.int64)) if p.shape else 1
    if p.q8_0:
        return n // Q8_0_BLOCK * Q8_0_BYTES
    if p.mxfp4:
        return n // MXFP4_BLOCK * MXFP4_BYTES
    if p.dtype == "MXFP8":
        return n // MXFP8_BLOCK * MXFP8_BYTES
    return n * np.dtype(_ST_TO_NP[p.dtype]).itemsize


def _add_kv(writer: Any, key: str, value: Any, vtype: str) -> None:
    import gguf

    V = gguf.GGUFValueType
    if vtype.startswith("ARRAY:"):
        writer.add_key_value(key, list(value), V.ARRAY, sub_type=V[vtype.split(":", 1)[1]])
    else:
        writer.add_key_value(key, value, V[vtype])


# config.json keys of a bundled DSpark draft (SGLang 0.5.23: speculative/dspark_components/dspark_config.py,
# models/deepseek_v4_dspark.py): written to the draft GGUF, not the model's.
DRAFT_CONFIG_KEYS = ("num_nextn_predict_layers", "dspark_block_size", "dspark_markov_rank", "dspark_target_layer_ids",
                     "dspark_noise_token_id", "dspark_n_routed_experts", "dspark_num_experts_per_tok",
                     "enable_confidence_head", "confidence_head_with_markov")


def _bundles_draft(config: dict[str, Any]) -> bool:
    return any(k.startswith("dspark_") for k in config)


def model_config(config: dict[str, Any]) -> dict[str, Any]:
    """config.json as the model GGUF carries it: without a bundled DSpark draft's keys (those go to
    the draft GGUF; the model file then says num_nextn_predict_layers 0, the table's default) and
    without the vision keys (``vision_*``, ``image_token_id``: the mmproj GGUF's) but vision_n_layers
    0: the model file alone is a text model (its vision tower comes with the projector)."""
    had_vision_key = "vision_n_layers" in config
    config = {k: v for k, v in config.items() if not k.startswith(VISION_CONFIG_PREFIXES)}
    if had_vision_key:
        config["vision_n_layers"] = 0
    if not _bundles_draft(config):
        return dict(config)
    out = {k: v for k, v in config.items() if k not in DRAFT_CONFIG_KEYS}
    out["num_nextn_predict_layers"] = 0
    return out


def _write_gguf(out: Path, arch: str, kv: dict[str, tuple[Any, str]], plans: list[_Planned], progress: bool) -> Path:
    """Write ``plans`` (streaming, one tensor at a time) under ``out``.partial; returns that path."""
    import gguf
    from tqdm import tqdm

    tmp = out.with_name(out.name + ".partial")
    out.parent.mkdir(parents=True, exist_ok=True)
    writer = gguf.GGUFWriter(tmp, arch)  # writes general.architecture itself
    for key, (value, vtype) in kv.items():
        _add_kv(writer, key, value, vtype)
    for p in plans:
        writer.add_tensor_info(p.gguf, p.shape, np.dtype(np.float32), _nbytes(p), raw_dtype=_ggml_type(p))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for p in tqdm(plans, desc=f"gguf export {out.name}", unit="tensor", disable=not progress):
        arr = _load(p)
        if p.q8_0:
            arr = _quantize_q8_0(p, arr)
        elif p.mxfp4:
            arr = _quantize_mxfp4(p, arr)
        writer.write_tensor_data(np.ascontiguousarray(arr))
    writer.close()
    return tmp


def checkpoint_to_gguf(
    checkpoint_dir: str | Path,
    out_path: str | Path,
    *,
    arch: str = "deepseek4",
    dense_q8_0: bool = False,
    name: str | None = None,
    progress: bool = False,
    draft_out: str | Path | None = None,
    experts_mxfp4: bool = False,
) -> Path:
    """Write ``checkpoint_dir`` (config.json, tokenizer files, *.safetensors) as one GGUF file.

    ``dense_q8_0``: the dense linear weights as Q8_0; ``experts_mxfp4``: the stacked routed experts
    as MXFP4 (a row width not a multiple of 32 is a GGUFError naming the tensor). Both: the quant
    mix of Unsloth's UD-Q4_K_XL.
    The file is written next to ``out_path`` under a temporary name and renamed when complete.
    A bundled DSpark draft (``mtp.*`` tensors, ``dspark_*`` config keys) is never put in the model
    file: with ``draft_out`` it is written there by :func:`draft_to_gguf` (Q8_0 when ``dense_q8_0``,
    else lossless), else left out (said so).
    Raises GGUFError when a tensor or config key has no GGUF spelling in the name table, or when
    the written hparams would not give the same config.json back.
    """
    import gguf

    folder = Path(checkpoint_dir)
    out = Path(out_path)
    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    mconfig = model_config(config)
    plans = _plan_tensors(folder, dense_q8_0, experts_mxfp4=experts_mxfp4)
    kv: dict[str, tuple[Any, str]] = {"general.name": (name or folder.name, "STRING")}
    kv.update(_hp.metadata_from_config(mconfig, arch))
    kv.update(tokenizer_metadata(folder))
    if experts_mxfp4:
        # llama.cpp's file type for MXFP4 experts next to other types (its gpt-oss conversions).
        kv["general.file_type"] = (int(gguf.LlamaFileType.MOSTLY_MXFP4_MOE), "UINT32")
    elif dense_q8_0:
        kv["general.file_type"] = (int(gguf.LlamaFileType.MOSTLY_Q8_0), "UINT32")
    kv["general.quantization_version"] = (gguf.GGML_QUANT_VERSION, "UINT32")
    tmp = _write_gguf(out, arch, kv, plans, progress)
    _check_config_round_trip(tmp, mconfig)
    tmp.replace(out)
    if draft_out is not None:
        draft_to_gguf(folder, draft_out, arch=arch, name=(name or folder.name) + "-DSpark", progress=progress,
                      q8_0=dense_q8_0)
    elif _bundles_draft(config):
        print(f"winport gguf export: {folder} bundles a DSpark draft (mtp.* tensors); not written "
              "(name a draft file to write it)", flush=True)
    return out


def draft_to_gguf(
    checkpoint_dir: str | Path,
    out_path: str | Path,
    *,
    arch: str = "deepseek41",
    name: str | None = None,
    progress: bool = False,
    q8_0: bool = True,
) -> Path:
    """Write the DSpark draft bundled in ``checkpoint_dir`` as a draft GGUF (what Unsloth ships as Q8_0).

    Stage ``s`` tensors ``mtp.<s>.*`` become ``blk.<s>.*`` (the name table's DSpark rows for the
    draft-only tensors: ``dspark_main_proj``, ``dspark_markov_embd``, ...), the inverse of
    winport.gguf.convert.LoadedGGUF.draft_weights. Dense linear weights and the stacked routed
    experts are stored as Q8_0 (gguf-py's quantizer; ``q8_0=False``: as stored, lossless), norms
    and other float tensors as stored.
    Metadata: ``{arch}.block_count`` = stages and the ``dspark_*`` / confidence-head keys under
    their ``{arch}.mtp.*`` spellings. Read back, the file must give the same draft config
    (LoadedGGUF.draft_config's keys) or this raises GGUFError.
    """
    folder = Path(checkpoint_dir)
    out = Path(out_path)
    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    if not _bundles_draft(config):
        raise GGUFError(f"{folder / 'config.json'}: no dspark_* keys: the checkpoint bundles no DSpark draft")
    plans = _plan_tensors(folder, q8_0, rename=_draft_name, experts_q8_0=q8_0)
    stages = int(config.get("num_nextn_predict_layers") or 0)
    if not plans or stages < 1:
        raise GGUFError(f"{folder}: config says {stages} DSpark stage(s) and there are {len(plans)} mtp.* tensors")
    found = {int(m.group(1)) for p in plans if (m := re.match(r"^blk\.(\d+)\.", p.gguf))}
    if found != set(range(stages)):
        raise GGUFError(f"{folder}: mtp.* tensors are for stages {sorted(found)}, config.json says {stages}")
    dconfig = {k: config[k] for k in DRAFT_CONFIG_KEYS if k in config}
    kv: dict[str, tuple[Any, str]] = {"general.name": (name or folder.name + "-DSpark", "STRING"),
                                      f"{arch}.block_count": (stages, "UINT32")}
    kv.update(_hp.metadata_from_config(dconfig, arch))
    if q8_0:
        kv["general.file_type"] = (_q8_0_file_type(), "UINT32")
    tmp = _write_gguf(out, arch, kv, plans, progress)
    from .reader import open_gguf

    with open_gguf(tmp) as m:
        back = _names.hparams_from_metadata(m.metadata)
    diff = sorted(k for k in dconfig if back.get(k) != dconfig[k])
    if diff:
        tmp.unlink()
        raise GGUFError(f"{tmp}: the draft hparams do not give the draft config back "
                        f"({', '.join(f'{k}: {dconfig[k]!r} -> {back.get(k)!r}' for k in diff)})")
    tmp.replace(out)
    return out


def _q8_0_file_type() -> int:
    import gguf

    return int(gguf.LlamaFileType.MOSTLY_Q8_0)


def _check_config_round_trip(path: Path, config: dict[str, Any]) -> None:
    """Read the written file back and require the same config.json (a key lost is a bug here)."""
    from .reader import open_gguf

    with open_gguf(path) as m:
        back = _hp.config_from_metadata(m.metadata, list(m.tensors))
    diff = sorted(k for k in set(config) | set(back) if config.get(k) != back.get(k))
    if diff:
        detail = ", ".join(f"{k}: {config.get(k)!r} -> {back.get(k)!r}" for k in diff)
        raise GGUFError(f"{path}: the GGUF hparams do not give config.json back ({detail})")


def export_demo_gguf(out_path: str | Path, *, dense_q8_0: bool = False, folder: str | Path | None = None,
                     variant: str = "v4", draft_out: str | Path | bool | None = None,
                     experts_mxfp4: bool = False) -> Path:
    """The demo model (built or cached by winport.demo.build) as a GGUF at ``out_path``.

    ``dense_q8_0`` / ``experts_mxfp4``: dense linear weights as Q8_0 / routed experts as MXFP4
    (both: UD-Q4_K_XL's mix). The demo's bf16 experts are MXFP4 values already, so MXFP4 experts
    hold exactly the demo's values (the same codes and exponents as its FP8 + MXFP4 checkpoint).

    ``variant`` "v4" is written as llama.cpp's ``deepseek4`` architecture, "v41" as ``deepseek41``
    (its engram table as MXFP8, fork type 43, see :func:`engram_gguf_shape`). A demo that bundles
    a DSpark draft gets its draft GGUF too: at ``draft_out``, or (None) next to the model as
    ``<stem>-DSpark.gguf`` where winport.gguf.convert finds sidecars; False: no draft file. A demo
    with a vision tower ("v41-vision") gets its projector next to the model as ``mmproj-<name>``
    (:func:`mmproj_to_gguf`), where `winport serve` finds it.
    """
    from winport.demo.build import ensure_demo

    archs = {"v4": "deepseek4", "v41": "deepseek41", "v41-vision": "deepseek41"}
    if variant not in archs:
        raise GGUFError(f"demo variant {variant!r}: no GGUF architecture for it ({', '.join(archs)})")
    # The plain bf16 form (the same values as the FP8 + MXFP4 demo): GGUF has no FP8 block type.
    src = ensure_demo(variant, Path(folder) if folder else None, quantized=False)
    out = Path(out_path)
    bundles = _bundles_draft(json.loads((src / "config.json").read_text(encoding="utf-8")))
    if draft_out is None and bundles:
        draft_out = out.with_name(out.stem + "-DSpark" + out.suffix)
    kind = ("-Q8_0" if dense_q8_0 else "-BF16") + ("-MXFP4" if experts_mxfp4 else "")
    path = checkpoint_to_gguf(src, out, arch=archs[variant], name=f"winport-demo-{variant}" + kind,
                              dense_q8_0=dense_q8_0, draft_out=draft_out or None, experts_mxfp4=experts_mxfp4)
    if json.loads((src / "config.json").read_text(encoding="utf-8")).get("vision_n_layers"):
        mmproj_to_gguf(src, out.with_name("mmproj-" + out.name), name=f"winport-demo-{variant}-mmproj")
    return path


# --- vision projector (mmproj) ---------------------------------------------------------------


def mmproj_to_gguf(checkpoint_dir: str | Path, out_path: str | Path, *, name: str | None = None) -> Path:
    """Write a checkpoint's V4.1 vision tower (``vision.*``, ``aligner.*``, ``image_*``) as an mmproj GGUF.

    The inverse of winport.gguf.convert.plan_mmproj through deepseek41_mmproj_names.toml: each
    target under the first GGUF name of its row (llama.cpp's clip spelling; a row with ``concat``
    (SGLang's MLP ``w1`` = [gate; up]) is split back into its GGUF parts, halves along rows),
    tensors as stored (BF16 / F32: "mmproj-BF16"), the vision config as ``clip.vision.*``
    hparams, architecture ``clip``. ``checkpoint_dir``: a folder with the tensors in
    ``*.safetensors`` and the ``vision_*`` keys in ``vision_config.json`` (what
    winport.gguf.to_checkpoint writes under ``<checkpoint>/mmproj``) or ``config.json``.
    Raises GGUFError naming what is missing or has no GGUF spelling.
    """
    import gguf
    import torch
    from safetensors import safe_open

    from .convert import _mmproj_table

    folder = Path(checkpoint_dir)
    out = Path(out_path)
    cfg_path = folder / "vision_config.json"
    if not cfg_path.exists():
        cfg_path = folder / "config.json"
    try:
        config = json.loads(cfg_path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise GGUFError(f"{cfg_path}: cannot read the vision config ({e})") from e
    n_layers = int(config.get("vision_n_layers") or 0)
    if n_layers < 1:
        raise GGUFError(f"{cfg_path}: vision_n_layers is {config.get('vision_n_layers')!r}: no vision tower")
    tensors: dict[str, tuple[str, str]] = {}  # target -> (file, name)
    for f in sorted(folder.glob("*.safetensors")):
        with safe_open(str(f), framework="pt") as st:
            for k in st.keys():  # noqa: SIM118 - safe_open is not a dict
                if k.startswith(_VISION_PREFIXES):
                    tensors[k] = (str(f), k)
    rows, hp_table = _mmproj_table()
    plan: list[tuple[str, str, int | None]] = []  # (gguf name, target, concat part or None)
    used: set[str] = set()
    missing: list[str] = []
    for row in rows:
        for layer in (range(n_layers) if "{L}" in row["target"] else [None]):
            def fill(x: str, layer: int | None = layer) -> str:
                return x.replace("{L}", str(layer)) if layer is not None else x

            target = fill(row["target"])
            if target not in tensors:
                if row.get("required"):
                    missing.append(target)
                continue
            used.add(target)
            parts = [fill(g) for g in row.get("concat", [])]
            if parts:
                plan += [(g, target, i) for i, g in enumerate(parts)]
            else:
                plan.append((fill(row["gguf"][0]), target, None))
    unknown = sorted(set(tensors) - used)
    if missing or unknown:
        raise GGUFError(f"{folder}: vision tensors missing: {', '.join(missing) or 'none'}; "
                        f"with no mmproj GGUF name: {', '.join(unknown) or 'none'}")
    tmp = out.with_name(out.name + ".partial")
    out.parent.mkdir(parents=True, exist_ok=True)
    writer = gguf.GGUFWriter(tmp, "clip")
    writer.add_string("general.name", name or folder.name)
    first_key: dict[str, str] = {}
    for gkey, target in hp_table.items():
        first_key.setdefault(target, gkey)
    for ckey, gkey in first_key.items():
        v = config.get(ckey)
        if v is None:
            continue
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise GGUFError(f"{cfg_path}: {ckey}={v!r} is not a number")
        _add_kv(writer, gkey, v, "FLOAT32" if isinstance(v, float) else "UINT32")

    def load(target: str, part: int | None) -> torch.Tensor:
        f, k = tensors[target]
        with safe_open(f, framework="pt") as st:
            t = st.get_tensor(k)
        if part is not None:  # halves checked with the infos
            t = t[part * t.shape[0] // 2 : (part + 1) * t.shape[0] // 2]
        return t.contiguous()

    types = {"BF16": (gguf.GGMLQuantizationType.BF16, 2), "F32": (gguf.GGMLQuantizationType.F32, 4),
             "F16": (gguf.GGMLQuantizationType.F16, 2)}
    for g, target, part in plan:  # infos first (shapes from the headers), then the data one tensor at a time
        f, k = tensors[target]
        with safe_open(f, framework="pt") as st:
            sl = st.get_slice(k)
            shape, dtype = list(sl.get_shape()), sl.get_dtype()
        if dtype not in types:
            raise GGUFError(f"{f}: tensor {k!r}: dtype {dtype} is not exported (BF16/F16/F32 only)")
        if part is not None:
            if shape[0] % 2:
                raise GGUFError(f"{f}: tensor {k!r} {shape}: an odd row count cannot be split into gate and up")
            shape[0] //= 2
        writer.add_tensor_info(g, tuple(shape), np.dtype(np.float32), int(np.prod(shape)) * types[dtype][1],
                               raw_dtype=types[dtype][0])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for _g, target, part in plan:
        t = load(target, part)
        writer.write_tensor_data(t.view(-1).view(torch.uint8).numpy())
    writer.close()
    tmp.replace(out)
    return out
