"""The full-width proxy of DeepSeek-V4.1-Flash: its real layer shapes, random weights, 2-4 layers.

What the performance work measures on (`winport demo-model --variant v41 --full-width --layers N`):
every decoder layer has V4.1-Flash's shapes (hidden 5120; 64 heads x 512 with q_lora 1280 and
o_lora 1024 x 8 groups; 384 routed experts of 2304, top-6, plus one shared expert; an indexer of
32 heads x 128; the ratio-1/2 compressors; engram rows of the real width 256, FP8 + one E8M0 scale
per 32), stored as DeepSeek ships them: dense FP8 in [32, 32] blocks, experts MXFP4. The layers
follow the V4.1 demo's pattern (winport.demo.config_v41), cut to N:

    layer  ratio  role
    0      0      hash-routed MoE (tid2eid); engram when N < 4
    1      2      kv and index source (owns the ratio-2 latents and index keys)
    2      2      engram, reads layer 1's latents and top-k (N = 4 only)
    3      1      kv and index source of ratio 1 (layer 2 when N = 3)

Not real, on purpose, so that the proxy fits the H200 machine (128 GiB RAM, 64 GiB disk) and
loads in minutes: the vocabulary is the demo tokenizer's 1024 tokens (the real 129280-row
embedding and LM head are 2 x 1.3 GB of bf16; the LM head's read per token is added to any
projection separately), the engram table has ~0.4M rows instead of ~384M (row width and format
are the real ones; the hash spreads tokens over whatever rows there are), and there is no DSpark
draft. Each layer's experts take 7.2 GB (384 x 18.8 MB).

Values: dense tensors are drawn as the demo's are (winport.demo.weights: seeded by tensor name,
then quantized with the demo's quantizers); the experts are drawn directly as MXFP4, uniform
random E2M1 codes with E8M0 scales 2^-8 or 2^-7 (a weight RMS near 1/sqrt(fan-in) at K = 5120 and
2304), because drawing and quantizing 13.6 G bf16 values a layer would take minutes for numbers
that only need to be fresh. Tensors are written one shard a layer as they are made (peak RAM about
one layer), with the index file SGLang reads for sharded checkpoints.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

from winport.demo import quantize
from winport.demo.config import demo_config
from winport.demo.weights import _EXPERTS, _generator, _storage_dtype, _value, hf_shapes, original_name
from winport.demo.weights_v41 import v4_base_config, v41_only_tensors

MIN_LAYERS, MAX_LAYERS = 2, 4
EXPERT_SCALE_BYTES = (119, 121)  # E8M0 bytes drawn from [119, 121): scales 2^-8 and 2^-7
INDEX_FILE = "model.safetensors.index.json"
STAMP = "winport-proxy.json"

# V4.1-Flash's layer shapes (shared/FACTS.md; SGLang 0.5.23 configs/deepseek_v41.py reads these keys).
FULL_WIDTH = {
    "hidden_size": 5120,
    "num_attention_heads": 64,
    "q_lora_rank": 1280,
    "o_lora_rank": 1024,
    "o_groups": 8,
    "n_routed_experts": 384,
    "num_experts_per_tok": 6,
    "moe_intermediate_size": 2304,
    "intermediate_size": 2304,
    "index_n_heads": 32,
    "index_head_dim": 128,
    "index_topk": 512,
    "rms_norm_eps": 1e-20,
    "engram_head_dim": 256,
}
PROXY_ENGRAM_VOCAB = 65521  # bucket primes start here: ~0.4M rows of 264 bytes (~100 MB)
_PATTERN = [0, 2, 2, 1]
_SOURCES = (1, 3)  # the pattern layers that own their latents and index keys
# Which pattern layers an N-layer proxy keeps. SGLang's CUDA path (decoder SWA bounded replay,
# DeepseekV4Model.__init__ in 0.5.23) needs: no engram on the last kv source, that source also an
# index source, and no layer after it compressing on its own (ratio 0 or 1 only); so 3 layers skip
# pattern layer 2, and without it the engram moves to layer 0.
_LAYERS_OF = {2: (0, 1), 3: (0, 1, 3), 4: (0, 1, 2, 3)}
_DSPARK_KEYS = ("dspark_", "enable_confidence_head", "confidence_head_with_markov")


def full_width_config(layers: int) -> dict[str, Any]:
    """config.json of the proxy with `layers` decoder layers (module docstring)."""
    from winport.demo.config_v41 import engram_primes

    if not MIN_LAYERS <= layers <= MAX_LAYERS:
        raise ValueError(f"--layers {layers}: the full-width proxy has {MIN_LAYERS} to {MAX_LAYERS} layers "
                         f"(each takes ~7 GB of MXFP4 experts)")
    cfg = {k: v for k, v in demo_config("v41").items() if not k.startswith(_DSPARK_KEYS)}
    cfg.update(FULL_WIDTH)
    pattern = _LAYERS_OF[layers]
    sources = [i for i, p in enumerate(pattern) if p in _SOURCES]
    primes = engram_primes(1, cfg["engram_max_ngram_size"], cfg["engram_n_heads"], PROXY_ENGRAM_VOCAB)
    cfg.update({
        "num_hidden_layers": layers,
        "compress_ratios": [_PATTERN[p] for p in pattern],
        "kv_source_layer_ids": sources,
        "index_source_layer_ids": sources,
        "engram_layer_ids": [pattern.index(2) if 2 in pattern else 0],
        "engram_vocab_size": PROXY_ENGRAM_VOCAB,
        "engram_num_embeddings": [sum(sum(r) for r in layer) for layer in primes],
        "num_nextn_predict_layers": 0,
        # 32K positions (prefill work measures 16-24K prompts); YaRN's factor keeps the ratio to
        # the original 4096 consistent, as transformers checks
        "max_position_embeddings": 32768,
        "rope_scaling": {**cfg["rope_scaling"], "factor": 8},
    })
    return cfg


def _expert_tensors(name: str, rows: int, cols: int, seed: int) -> dict[str, torch.Tensor]:
    """One expert matrix drawn as MXFP4: packed codes int8 [rows, cols / 2], E8M0 [rows, cols / 32]."""
    g = _generator(name, seed)
    codes = torch.randint(0, 256, (rows, cols // 2), dtype=torch.uint8, generator=g)
    scale = torch.randint(*EXPERT_SCALE_BYTES, (rows, cols // quantize.MXFP4_BLOCK), dtype=torch.uint8, generator=g)
    return {name: codes.view(torch.int8), name[: -len("weight")] + "scale": scale.view(torch.float8_e8m0fnu)}


def _layer_of(name: str) -> int | None:
    parts = name.split(".")
    return int(parts[1]) if parts[0] == "layers" else None


def planned_tensors(config: dict[str, Any]) -> dict[str | None, list[tuple[str, tuple[int, ...]]]]:
    """Dense tensor names and shapes per shard (None: the embedding, head and final norm; an int:
    that layer), from transformers' DeepseekV4 on the meta device; experts are listed per
    expert and projection as `<prefix>.<e>.<w>.weight` with their bf16 shape."""
    plan: dict[str | None, list[tuple[str, tuple[int, ...]]]] = {}
    for hf_name, (shape, _dtype) in hf_shapes(v4_base_config(config)).items():
        name = original_name(hf_name)
        if name.startswith("hc_head_"):
            continue  # V4.1 builds no LM-head mixer (winport.demo.weights_v41)
        key = _layer_of(name)
        match = _EXPERTS.match(name)
        entries = plan.setdefault(key, [])
        if match:
            prefix, kind = match.groups()
            n_exp, rows, cols = shape
            for e in range(n_exp):
                if kind == "gate_up_proj":
                    entries += [(f"{prefix}.{e}.w1.weight", (rows // 2, cols)),
                                (f"{prefix}.{e}.w3.weight", (rows // 2, cols))]
                else:
                    entries.append((f"{prefix}.{e}.w2.weight", (rows, cols)))
        else:
            entries.append((name, shape))
    return plan


def _shard(key: int | None, entries: list[tuple[str, tuple[int, ...]]], v41: dict[str, torch.Tensor],
           config: dict[str, Any], seed: int) -> dict[str, torch.Tensor]:
    block = quantize.V41_BLOCK
    dense: dict[str, torch.Tensor] = {}
    experts: dict[str, torch.Tensor] = {}
    for name, shape in entries:
        if quantize.MXFP4_EXPERT.match(name):
            experts.update(_expert_tensors(name, shape[0], shape[1], seed))
            continue
        value = _value(name, shape, config, seed)
        dense[name] = value if value.dtype == torch.int32 else value.to(_storage_dtype(name))
    dense.update({k: v for k, v in v41.items() if _layer_of(k) == key})
    return dict(sorted({**quantize.quantize_state_dict(dense, block), **experts}.items()))


def iter_shards(config: dict[str, Any], seed: int = 0) -> Iterator[tuple[str, dict[str, torch.Tensor]]]:
    """(file name, tensors) for each shard, one decoder layer at a time, then the rest."""
    v41 = v41_only_tensors(config, seed)
    plan = planned_tensors(config)
    layers = sorted(k for k in plan if k is not None)
    for layer in layers:
        yield f"model-layer-{layer:02d}.safetensors", _shard(layer, plan[layer], v41, config, seed)
    yield "model-embed-head.safetensors", _shard(None, plan.get(None, []), v41, config, seed)


def write_checkpoint(folder: Path, config: dict[str, Any], seed: int = 0,
                     say: Callable[[str], None] = print) -> Path:
    """Write config, tokenizer, shards and their index into folder (atomically, like the demo)."""
    from safetensors.torch import save_file

    from winport.demo.tokenizer import CHAT_TEMPLATE, write_tokenizer

    folder = Path(folder)
    tmp = folder.with_name(f"{folder.name}.partial-{os.getpid()}")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    vocab = write_tokenizer(tmp, config["vocab_size"], chat_template=CHAT_TEMPLATE)
    if vocab != config["vocab_size"]:
        raise RuntimeError(f"tokenizer has {vocab} tokens, config says {config['vocab_size']}")
    written = {**config, "quantization_config": quantize.quantization_config(quantize.V41_BLOCK)}
    (tmp / "config.json").write_text(json.dumps(written, indent=1, sort_keys=True) + "\n")
    (tmp / "generation_config.json").write_text(
        json.dumps({"bos_token_id": 0, "eos_token_id": 1, "do_sample": False}, indent=1) + "\n")
    weight_map: dict[str, str] = {}
    total = 0
    for file, tensors in iter_shards(config, seed):
        save_file(tensors, str(tmp / file), metadata={"format": "pt"})
        size = sum(t.numel() * t.element_size() for t in tensors.values())
        total += size
        weight_map.update(dict.fromkeys(tensors, file))
        say(f"wrote {file} ({size / 2**30:.2f} GiB, {len(tensors)} tensors)")
        del tensors
    (tmp / INDEX_FILE).write_text(json.dumps({"metadata": {"total_size": total},
                                              "weight_map": dict(sorted(weight_map.items()))}, indent=1) + "\n")
    (tmp / STAMP).write_text(json.dumps({"layers": config["num_hidden_layers"], "seed": seed}) + "\n")
    if folder.exists():
        shutil.rmtree(folder)
    tmp.rename(folder)
    say(f"wrote {folder} ({total / 2**30:.1f} GiB)")
    return folder


def build_full_width(folder: Path, layers: int, seed: int = 0, *, quiet: bool = False) -> Path:
    """`winport demo-model --variant v41 --full-width --layers N`."""
    say = (lambda *_: None) if quiet else (lambda msg: print(f"winport demo-model: {msg}", flush=True))
    return write_checkpoint(folder, full_width_config(layers), seed, say)


__all__ = ["build_full_width", "full_width_config", "iter_shards", "planned_tensors", "write_checkpoint"]
