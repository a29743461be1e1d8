"""Tokenizer and chat template from GGUF metadata (``tokenizer.ggml.*``, ``tokenizer.chat_template``).

DeepSeek GGUFs carry a byte-level BPE ("gpt2" model): the token texts, the merges, token types
(3 = control, 4 = user defined) and the special token ids. This rebuilds a ``tokenizers``
Tokenizer from them and writes Hugging Face tokenizer files, so no separate download is needed.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

from .reader import GGUFError

# Pre-tokenizer split patterns by ``tokenizer.ggml.pre`` value. The DeepSeek-V3 family (which V4
# keeps) splits digits in runs of 1-3, CJK runs, then a GPT-style word/punctuation pattern.
_DEEPSEEK3_SPLITS = (
    r"\p{N}{1,3}",
    r"[一-龥぀-ゟ゠-ヿ]+",
    r"[!\"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
)
# GPT-2's split (what tokenizers' ByteLevel pre-tokenizer applies with use_regex=True).
_GPT2_SPLITS = (r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+",)
_PRE_SPLITS: dict[str, tuple[str, ...]] = {
    "gpt2": _GPT2_SPLITS,
    "deepseek-v3": _DEEPSEEK3_SPLITS,
    "deepseek-v4": _DEEPSEEK3_SPLITS,
    "joyai-llm": _DEEPSEEK3_SPLITS,
}

TOKEN_TYPE_CONTROL = 3
TOKEN_TYPE_USER_DEFINED = 4


def _strs(meta: dict[str, Any], key: str) -> list[str]:
    v = meta.get(key)
    if v is None:
        return []
    if not isinstance(v, list) or not all(isinstance(s, str) for s in v):
        raise GGUFError(f"metadata key {key!r}: expected an array of strings")
    return v


def build_tokenizer(meta: dict[str, Any]) -> Any:
    """A ``tokenizers.Tokenizer`` from GGUF metadata (byte-level BPE only)."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers

    model = meta.get("tokenizer.ggml.model")
    if model != "gpt2":
        raise GGUFError(f"metadata key 'tokenizer.ggml.model': {model!r} is not supported (only 'gpt2' byte-level BPE)")
    tokens = _strs(meta, "tokenizer.ggml.tokens")
    if not tokens:
        raise GGUFError("metadata key 'tokenizer.ggml.tokens': missing or empty")
    merges_raw = _strs(meta, "tokenizer.ggml.merges")
    merges: list[tuple[str, str]] = []
    for i, m in enumerate(merges_raw):
        parts = m.split(" ")
        if len(parts) != 2:
            raise GGUFError(f"metadata key 'tokenizer.ggml.merges'[{i}]: {m!r} is not 'a b'")
        merges.append((parts[0], parts[1]))
    vocab = {t: i for i, t in enumerate(tokens)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False))
    pre = meta.get("tokenizer.ggml.pre", "deepseek-v3")
    splits = _PRE_SPLITS.get(pre, _DEEPSEEK3_SPLITS)
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex(p), behavior="isolated") for p in splits]
        + [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
    )
    tok.decoder = decoders.ByteLevel()
    types = meta.get("tokenizer.ggml.token_type")
    if types is not None and len(types) == len(tokens):
        added = [
            AddedToken(tokens[i], special=int(t) == TOKEN_TYPE_CONTROL, normalized=False)
            for i, t in enumerate(types)
            if int(t) in (TOKEN_TYPE_CONTROL, TOKEN_TYPE_USER_DEFINED)
        ]
        if added:
            tok.add_tokens(added)
    return tok


def _token(meta: dict[str, Any], key: str) -> str | None:
    tokens = meta.get("tokenizer.ggml.tokens") or []
    i = meta.get(key)
    if isinstance(i, int) and 0 <= i < len(tokens):
        return tokens[i]
    return None


def write_hf_tokenizer(meta: dict[str, Any], out_dir: str | os.PathLike[str]) -> Path:
    """Write tokenizer.json, tokenizer_config.json (with the chat template) and special_tokens_map.json."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tok = build_tokenizer(meta)
    tok.save(str(out / "tokenizer.json"))
    cfg: dict[str, Any] = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": int(meta.get(f"{meta.get('general.architecture', '')}.context_length", 1 << 20)),
        "add_bos_token": bool(meta.get("tokenizer.ggml.add_bos_token", True)),
        "add_eos_token": bool(meta.get("tokenizer.ggml.add_eos_token", False)),
        "clean_up_tokenization_spaces": False,
        "legacy": True,
    }
    special: dict[str, str] = {}
    for field_name, key in (
        ("bos_token", "tokenizer.ggml.bos_token_id"),
        ("eos_token", "tokenizer.ggml.eos_token_id"),
        ("pad_token", "tokenizer.ggml.padding_token_id"),
        ("unk_token", "tokenizer.ggml.unknown_token_id"),
    ):
        t = _token(meta, key)
        if t is not None:
            cfg[field_name] = t
            special[field_name] = t
    template = meta.get("tokenizer.chat_template")
    if isinstance(template, str):
        cfg["chat_template"] = template
        # Newer transformers also read the template from its own file.
        (out / "chat_template.jinja").write_text(template, encoding="utf-8")
    (out / "tokenizer_config.json").write_text(json.dumps(cfg, indent=1, ensure_ascii=False), encoding="utf-8")
    (out / "special_tokens_map.json").write_text(json.dumps(special, indent=1, ensure_ascii=False), encoding="utf-8")
    return out


def tokenizer_cache_dir(meta: dict[str, Any], base: str | os.PathLike[str] | None = None) -> Path:
    """A cache directory keyed by a hash of the tokenizer metadata (so files are written once)."""
    h = hashlib.sha256()
    for key in sorted(k for k in meta if k.startswith("tokenizer.")):
        h.update(key.encode())
        v = meta[key]
        h.update(repr(v.tolist() if hasattr(v, "tolist") else v).encode("utf-8", "surrogateescape"))
    if base:
        root = Path(base)
    else:
        from winport.paths import cache_dir  # the one rule for the cache's root (WINPORT_CACHE, else per OS)

        root = cache_dir()
    return root / "gguf-tokenizers" / h.hexdigest()[:16]
