"""config.json <-> GGUF hparams for DeepSeek-V4, both directions driven by deepseek4_names.toml.

``[hparams]`` maps ``{arch}.<key>`` to config keys (dotted targets are nested dicts, e.g.
``rope_scaling.factor``); ``[hparam_enums]`` translates llama.cpp's enum numbers to config names;
``[architectures]``, ``[config_defaults]`` and ``[config_aliases]`` fill the config keys a GGUF has
no hparam for. Export writes, for each config key, the first GGUF key of the table that maps to it;
import reads every alias. :func:`config_from_metadata` is the exact inverse of
:func:`metadata_from_config` for every key the table covers (export checks that, so a key a GGUF
cannot carry is reported instead of silently lost).
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

import numpy as np

from . import names as _names
from .reader import GGUFError

try:
    import tomllib
except ImportError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

# config.json keys taken from the tokenizer metadata rather than {arch}.* hparams.
TOKEN_ID_KEYS = {
    "bos_token_id": "tokenizer.ggml.bos_token_id",
    "eos_token_id": "tokenizer.ggml.eos_token_id",
    "pad_token_id": "tokenizer.ggml.padding_token_id",
}


@lru_cache(maxsize=1)
def config_tables() -> dict[str, Any]:
    """The table's config sections: hparam_enums, architectures, config_defaults, config_aliases."""
    with open(_names.TABLE_PATH, "rb") as fh:
        data = tomllib.load(fh)
    return {k: data.get(k, {}) for k in ("hparam_enums", "architectures", "config_defaults", "config_aliases")}


def _flatten(config: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in config.items():
        if isinstance(v, dict):
            for k2, v2 in v.items():
                out[f"{k}.{k2}"] = v2
        else:
            out[k] = v
    return out


def _nest(flat: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in flat.items():
        if "." in k:
            head, tail = k.split(".", 1)
            out.setdefault(head, {})[tail] = v
        else:
            out[k] = v
    return out


def _f32_value(v: float) -> float:
    """A float read from a FLOAT32 field, as the shortest decimal that gives the same float32.

    config.json said 1e-06; float32 holds 9.99999997e-07. Giving back 1e-06 makes the round trip
    exact, so SGLang computes with the number the checkpoint had.
    """
    f = np.float32(v)
    return float(str(f)) if float(f) == v else v  # not float32-exact: a FLOAT64 field, keep it


def metadata_from_config(config: dict[str, Any], arch: str) -> dict[str, tuple[Any, str]]:
    """``{gguf key: (value, gguf-py value type name)}`` for every config key the table maps.

    Types follow llama.cpp: integers UINT32 (INT32 when negative), floats FLOAT32, booleans BOOL,
    lists ARRAY of UINT32/FLOAT32, strings STRING; enum names become their numbers.
    """
    _, table = _names.load_table()
    enums = config_tables()["hparam_enums"]
    first_key: dict[str, str] = {}
    for gkey, target in table.items():
        first_key.setdefault(target, gkey)
    out: dict[str, tuple[Any, str]] = {}
    for ckey, value in _flatten(config).items():
        gkey = first_key.get(ckey)
        if gkey is None or value is None:
            continue
        if ckey in enums and isinstance(value, str):
            if value not in enums[ckey]:
                raise GGUFError(f"config {ckey}={value!r}: no GGUF number for it in the name table")
            value = enums[ckey][value]
        out[f"{arch}.{gkey}"] = (value, _vtype(value, ckey))
    return out


def _vtype(value: Any, what: str) -> str:
    if isinstance(value, bool):
        return "BOOL"
    if isinstance(value, int):
        return "INT32" if value < 0 else "UINT32"
    if isinstance(value, float):
        return "FLOAT32"
    if isinstance(value, str):
        return "STRING"
    if isinstance(value, list) and value:
        if all(isinstance(x, int) and not isinstance(x, bool) for x in value):
            return "ARRAY:INT32" if min(value) < 0 else "ARRAY:UINT32"
        if all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in value):
            return "ARRAY:FLOAT32"
    raise GGUFError(f"config {what}={value!r}: no GGUF value type for it")


def _plain(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        if value.dtype.kind == "f":
            return [_f32_value(x) if value.dtype == np.float32 else float(x) for x in value.tolist()]
        return value.tolist()
    if isinstance(value, float):
        return _f32_value(value)
    return value


def config_from_metadata(metadata: dict[str, Any], tensor_names: list[str] | set[str]) -> dict[str, Any]:
    """A config.json dict for SGLang from GGUF metadata (the inverse of :func:`metadata_from_config`)."""
    tables = config_tables()
    arch = metadata.get("general.architecture")
    if arch not in tables["architectures"]:
        raise GGUFError(f"general.architecture {arch!r} is not a DeepSeek-V4 architecture "
                        f"({', '.join(tables['architectures'])})")
    flat: dict[str, Any] = {}
    _, table = _names.load_table()
    prefix = f"{arch}."
    # Table order, first alias present wins (the same rule as for tensor names).
    for gkey, target in table.items():
        if target not in flat and prefix + gkey in metadata:
            flat[target] = _plain(metadata[prefix + gkey])
    for ckey, mapping in tables["hparam_enums"].items():
        v = flat.get(ckey)
        if isinstance(v, int) and not isinstance(v, bool):
            names = [n for n, num in mapping.items() if num == v]
            if not names:
                raise GGUFError(f"metadata key {prefix}...{ckey}: unknown enum number {v}")
            flat[ckey] = names[0]
    # llama.cpp may store the SwiGLU clamp per layer; SGLang takes one number.
    lim = flat.get("swiglu_limit")
    if isinstance(lim, list):
        if len(set(lim)) > 1:
            raise GGUFError(f"metadata key {prefix}swiglu_clamp_exp: per-layer values differ ({lim}); "
                            "SGLang takes one swiglu_limit")
        flat["swiglu_limit"] = lim[0] if lim else None
    for ckey, mkey in TOKEN_ID_KEYS.items():
        if mkey in metadata:
            flat.setdefault(ckey, int(metadata[mkey]))
    # Derived by the architecture: the single KV head is the whole latent (kv_lora_rank = head_dim),
    # values are head_dim wide, and the non-rotary part is the rest of the head.
    if "head_dim" in flat:
        flat.setdefault("v_head_dim", flat["head_dim"])
        flat.setdefault("kv_lora_rank", flat["head_dim"])
        if "qk_rope_head_dim" in flat:
            flat.setdefault("qk_nope_head_dim", flat["head_dim"] - flat["qk_rope_head_dim"])
    if "moe_intermediate_size" in flat:
        flat.setdefault("intermediate_size", flat["moe_intermediate_size"])
    flat.setdefault("tie_word_embeddings", "output.weight" not in set(tensor_names))
    has_rope_scaling = any(k.startswith("rope_scaling.") for k in flat)
    for ckey, value in tables["config_defaults"].items():
        if ckey.startswith("rope_scaling.") and not has_rope_scaling:
            continue
        flat.setdefault(ckey, value)
    for ckey, source in tables["config_aliases"].items():
        if source in flat:
            flat.setdefault(ckey, flat[source])
    flat.update(tables["architectures"][arch])
    return _nest(flat)
