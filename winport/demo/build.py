"""Write the demo checkpoint folder: config.json, tokenizer files, model.safetensors."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

from winport.demo.config import demo_config
from winport.demo.tokenizer import CHAT_TEMPLATE, IMAGE_CHAT_TEMPLATE, write_tokenizer
from winport.demo.vision import IMAGE_TOKEN
from winport.demo.weights import demo_state_dict

STAMP = "winport-demo.json"
# Bump when the generator changes what it writes (2: FP8 dense + MXFP4 experts; 3: V4.1 in FP8
# [32, 32] + MXFP4 too, with DSpark stages; 4: one safetensors metadata key, byte-identical builds;
# 5: V4.1 engram over 2- to 4-grams, which SGLang's CUDA hash kernel accepts).
FORMAT_VERSION = 5


def default_quantized(variant: str) -> bool:
    """Whether a variant is written in DeepSeek's FP8 + MXFP4 format by default (both are; `--bf16`
    writes the same values plainly)."""
    return variant in ("v4", "v41", "v41-vision")


def default_dir(variant: str = "v4", quantized: bool | None = None) -> Path:
    """Where `winport serve --demo` keeps the demo model (the bf16 form in its own folder)."""
    from winport.paths import cache_dir

    plain = quantized is False and default_quantized(variant)
    return cache_dir() / (f"demo-{variant}-bf16" if plain else f"demo-{variant}")


def _digest(folder: Path, names: list[str]) -> str:
    h = hashlib.sha256()
    for name in names:
        h.update(name.encode())
        h.update(hashlib.sha256((folder / name).read_bytes()).digest())
    return h.hexdigest()


def is_current(folder: Path, variant: str = "v4", quantized: bool | None = None) -> bool:
    """Whether folder holds a complete demo model of this generator version (and storage form)."""
    stamp = folder / STAMP
    if not stamp.exists():
        return False
    want = default_quantized(variant) if quantized is None else quantized
    try:
        info = json.loads(stamp.read_text())
        return info.get("format") == FORMAT_VERSION and info.get("variant") == variant and \
            info.get("quantized") == want and _digest(folder, info["files"]) == info["sha256"]
    except (OSError, ValueError, KeyError):
        return False


def _stamp_digest(folder: Path) -> str | None:
    try:
        return json.loads((folder / STAMP).read_text()).get("sha256")
    except (OSError, ValueError):
        return None


def build_demo(folder: Path, variant: str = "v4", seed: int = 0, *, quiet: bool = False,
               quantized: bool | None = None) -> Path:
    """Write the demo model into folder (atomically: a partial folder is never left as current).

    quantized (default: default_quantized(variant)): DeepSeek's FP8 block dense + MXFP4 expert
    checkpoint (winport.demo.quantize); False writes the same values as plain bf16.
    """
    from safetensors.torch import save_file

    from winport.demo import quantize

    quantized = default_quantized(variant) if quantized is None else quantized

    say = (lambda *_: None) if quiet else (lambda msg: print(f"winport demo-model: {msg}", flush=True))
    folder = Path(folder)
    # One partial folder per process: two servers started at once (a test, a user's second terminal)
    # both build the demo, and a shared partial folder let one rename it under the other's writes.
    tmp = folder.with_name(f"{folder.name}.partial-{os.getpid()}")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    config = demo_config(variant)
    say("training the tokenizer")
    # The vision variant's image token is added after training: the trained vocabulary stays the V4.1 demo's.
    extra = [IMAGE_TOKEN] if variant == "v41-vision" else []
    vocab = write_tokenizer(tmp, config["vocab_size"] - len(extra), extra_special=extra,
                            chat_template=IMAGE_CHAT_TEMPLATE if extra else CHAT_TEMPLATE)
    if vocab != config["vocab_size"]:
        raise RuntimeError(f"tokenizer has {vocab} tokens, config says {config['vocab_size']}")
    # quantization_config only in the file: the generator below works on the plain architecture.
    block = quantize.block_for(variant)
    written = {**config, "quantization_config": quantize.quantization_config(block)} if quantized else config
    (tmp / "config.json").write_text(json.dumps(written, indent=1, sort_keys=True) + "\n")
    (tmp / "generation_config.json").write_text(
        json.dumps({"bos_token_id": 0, "eos_token_id": 1, "do_sample": False}, indent=1) + "\n")
    say("generating weights")
    if variant.startswith("v41"):
        from winport.demo.weights_v41 import demo_state_dict_v41

        tensors = demo_state_dict_v41(config, seed=seed)
        if variant == "v41-vision":
            from winport.demo.vision import vision_tensors

            tensors = dict(sorted({**tensors, **vision_tensors(config, seed)}.items()))
    else:
        tensors = demo_state_dict(config, seed=seed)
    # The bf16 form of a quantized variant holds the quantize-dequantize values: the same model.
    if quantized:
        tensors = quantize.quantize_state_dict(tensors, block)
    elif default_quantized(variant):
        tensors = quantize.quantized_values(tensors, block)
    # One metadata key only: safetensors writes the metadata map in hash order, which changes from
    # run to run with two keys or more (seen: the same build gave {"format", "winport"} in either
    # order), and the file must be the same bytes every time. The variant is in the stamp file.
    save_file(tensors, str(tmp / "model.safetensors"), metadata={"format": "pt"})
    files = sorted(p.name for p in tmp.iterdir() if p.name != STAMP)
    stamp = {"format": FORMAT_VERSION, "variant": variant, "seed": seed, "quantized": quantized, "files": files,
             "sha256": _digest(tmp, files)}
    (tmp / STAMP).write_text(json.dumps(stamp, indent=1) + "\n")
    if is_current(folder, variant, quantized) and _stamp_digest(folder) == stamp["sha256"]:
        shutil.rmtree(tmp)  # another process finished the same build first: keep the folder it wrote
    else:
        if folder.exists():
            shutil.rmtree(folder)
        tmp.rename(folder)
    say(f"wrote {folder} ({sum(t.numel() for t in tensors.values()) / 1e6:.1f}M parameters)")
    return folder


def ensure_demo(variant: str = "v4", folder: Path | None = None, quantized: bool | None = None) -> Path:
    """Return the demo folder, building it first when missing or stale."""
    folder = folder or default_dir(variant, quantized)
    if not is_current(folder, variant, quantized):
        build_demo(folder, variant, quantized=quantized)
    return folder
