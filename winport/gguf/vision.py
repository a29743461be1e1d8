"""A V4.1 vision projector (mmproj GGUF) joined to its model: vision config keys and fit checks.

SGLang 0.5.23 builds DeepSeek-V4.1's vision tower from the model checkpoint itself (config.json
with model_type deepseek_v41 and vision_n_layers > 0; tensors vision.*, aligner.*, image_*), so a
converted GGUF checkpoint gets the projector's tensors in its own shards and these config keys:

- from the mmproj's ``clip.vision.*`` hparams (deepseek41_mmproj_names.toml [hparams]);
- else from the tensor shapes where they fix the value (vision_dim, vision_inter_dim,
  vision_patch_size, vision_downsample_ratio, vision_n_layers);
- else a default, printed: SGLang's own config defaults (configs/deepseek_v4.py) for the keys
  with no known llama.cpp spelling (vision_min_pixels, vision_max_wh_ratio, ...), and for
  image_token_id the id of DeepSeek's image placeholder in the model GGUF's tokenizer when the
  vocabulary has it, else SGLang's default.

Checked before any tensor is converted (GGUFError naming the file and tensor): the projector's
shapes against each other and against the model (aligner output == the model's hidden size), a
model that is V4.1 at all, the image token inside the vocabulary, and the VL routing biases
(exp_probs_b_vl) SGLang reads for image rows in every non-hash MoE layer.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .reader import GGUFError

# SGLang 0.5.23 configs/deepseek_v4.py defaults for the V4.1 vision keys (vision_n_layers aside).
SGLANG_DEFAULTS: dict[str, Any] = {
    "vision_dim": 1024, "vision_n_heads": 16, "vision_inter_dim": 2816, "vision_patch_size": 14,
    "vision_rope_theta": 10000.0, "vision_downsample_ratio": 3, "vision_max_n_token": 1024,
    "vision_min_pixels": 295936, "vision_max_wh_ratio": None, "image_token_id": 129264,
}
# DeepSeek's image placeholder (SGLang's parser/deepseek_recipe_renderer.py IMAGE_TOKEN); the
# recipe's bundled tokenizer spells it <｜image｜>.
IMAGE_TOKENS = ("<｜deepseek_image｜>", "<｜image｜>")
# Biases SGLang's vision modules always have (nn.Linear defaults, VisionAttention qkv/proj bias):
# a projector without one is taken to have a zero bias, as llama.cpp treats an absent bias.
ZERO_IF_ABSENT = ("vision.patch_embed.proj.bias", "vision.blocks.{L}.attn.wqkv.bias",
                  "vision.blocks.{L}.attn.wo.bias", "aligner.w1.bias", "aligner.w2.bias")


def _shape(model: Any, plan: Any, target: str) -> tuple[int, ...]:
    """Shape [rows, cols] (PyTorch order) of a mapped target; stacked parts add their rows."""
    parts = [model[g] for g in plan.tensors[target]]
    shapes = [tuple(int(x) for x in t.shape) for t in parts]
    return (sum(s[0] for s in shapes), *shapes[0][1:])


def _image_token_id(metadata: dict[str, Any]) -> int | None:
    tokens = metadata.get("tokenizer.ggml.tokens")
    if tokens is None:
        return None
    tokens = list(tokens)
    for t in IMAGE_TOKENS:
        if t in tokens:
            return tokens.index(t)
    return None


def mmproj_config(loaded: Any, plan: Any, config: dict[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
    """The vision keys for config.json, and {key: where its value came from} for the ones the
    projector's metadata did not give. GGUFError (naming the file and tensor) when the projector
    does not fit the model."""
    mm, path = loaded.mmproj, loaded.mmproj.paths[0]
    model_path = loaded.model.paths[0]
    if config.get("model_type") != "deepseek_v41":
        raise GGUFError(f"{path}: a DeepSeek-V4.1 vision projector, but {model_path} is a "
                        f"{config.get('model_type')} model: SGLang 0.5.23 builds the vision tower for "
                        "model_type deepseek_v41 only")
    cfg = dict(plan.config)
    source: dict[str, str] = {}
    pe = _shape(mm, plan, "vision.patch_embed.proj.weight")
    w1 = _shape(mm, plan, "aligner.w1.weight")
    derived = {"vision_dim": pe[0], "vision_inter_dim": _shape(mm, plan, "vision.blocks.0.mlp.w2.weight")[1]}
    if pe[1] % 3 == 0 and round((pe[1] // 3) ** 0.5) ** 2 == pe[1] // 3:
        derived["vision_patch_size"] = round((pe[1] // 3) ** 0.5)
    if w1[1] % pe[0] == 0 and round((w1[1] // pe[0]) ** 0.5) ** 2 == w1[1] // pe[0]:
        derived["vision_downsample_ratio"] = round((w1[1] // pe[0]) ** 0.5)
    for key, value in derived.items():
        if key not in cfg:
            cfg[key] = value
            source[key] = "from the tensor shapes"
    if "image_token_id" not in cfg:
        tid = _image_token_id(loaded.metadata)
        if tid is not None:
            cfg["image_token_id"] = tid
            source["image_token_id"] = f"the id of {IMAGE_TOKENS[0]} in the model's tokenizer"
    for key, value in SGLANG_DEFAULTS.items():
        if key not in cfg:
            # Written even when None: SGLang's V4.1 image processor reads these off the HF config
            # object (DeepseekV41Config), which has no class default for them (AttributeError).
            source[key] = "SGLang's default"
            cfg[key] = value
    # The vocabulary: config.json's, else the GGUF tokenizer's size (a file without the hparam).
    vocab = config.get("vocab_size") or len(loaded.metadata.get("tokenizer.ggml.tokens") or [])
    _check_fit(mm, plan, cfg, {**config, "vocab_size": vocab}, path, model_path)
    return cfg, source


def _check_fit(mm: Any, plan: Any, cfg: dict[str, Any], config: dict[str, Any], path: Path,
               model_path: Path) -> None:
    hidden, d = int(config["hidden_size"]), int(cfg["vision_dim"])
    inter, p, r = int(cfg["vision_inter_dim"]), int(cfg["vision_patch_size"]), int(cfg["vision_downsample_ratio"])
    heads = int(cfg["vision_n_heads"])
    want: dict[str, tuple[int, ...]] = {
        "vision.patch_embed.proj.weight": (d, 3 * p * p), "vision.norm.weight": (d,),
        "aligner.w1.weight": (hidden, d * r * r), "aligner.w2.weight": (hidden, hidden),
        "aligner.w1.bias": (hidden,), "aligner.w2.bias": (hidden,), "vision.patch_embed.proj.bias": (d,),
        "image_start": (hidden,), "image_end": (hidden,), "image_newline": (hidden,),
    }
    for layer in range(int(cfg["vision_n_layers"])):
        b = f"vision.blocks.{layer}."
        want.update({b + "norm1.weight": (d,), b + "norm2.weight": (d,), b + "attn.wqkv.weight": (3 * d, d),
                     b + "attn.wqkv.bias": (3 * d,), b + "attn.wo.weight": (d, d), b + "attn.wo.bias": (d,),
                     b + "mlp.w1.weight": (2 * inter, d), b + "mlp.w2.weight": (d, inter)})
    problems = []
    if d % heads or (d // heads) % 4:
        problems.append(f"vision_dim {d} over {heads} heads is not a head size divisible by 4 (2-D rope halves)")
    for target, shape in want.items():
        if target not in plan.tensors:
            continue  # required ones were checked by plan_mmproj; absent biases are zeros
        got = _shape(mm, plan, target)
        if got != shape:
            why = f" (the model's hidden size is {hidden}, {model_path})" if hidden in shape else ""
            problems.append(f"tensor {'+'.join(plan.tensors[target])} has shape {list(got)}, "
                            f"expected {list(shape)}{why}")
    tid = cfg.get("image_token_id")
    if tid is not None and not 0 <= int(tid) < int(config["vocab_size"]):
        problems.append(f"image_token_id {tid} is outside the model's vocabulary of {config['vocab_size']} "
                        f"(its tokenizer has no {IMAGE_TOKENS[0]})")
    if problems:
        raise GGUFError(f"{path}: this vision projector does not fit the model {model_path}: " + "; ".join(problems))


def check_vl_biases(loaded: Any, config: dict[str, Any]) -> None:
    """Every non-hash MoE layer of the model must carry exp_probs_b_vl: SGLang routes image rows
    with it (gate.e_score_correction_bias_vl, left uninitialised when absent)."""
    names = set(loaded.model.tensors)
    n_hash = int(config.get("n_hash_layers", config.get("num_hash_layers", 0)) or 0)
    missing = [f"blk.{L}.exp_probs_b_vl.bias" for L in range(n_hash, int(config["num_hidden_layers"]))
               if not {f"blk.{L}.exp_probs_b_vl.bias", f"blk.{L}.exp_probs_b_vl"} & names]
    if missing:
        raise GGUFError(f"{loaded.model.paths[0]}: served with a vision projector, but the model has no VL routing "
                        f"bias for image tokens: {', '.join(missing[:8])}{' ...' if len(missing) > 8 else ''} "
                        "missing (a text-only conversion of a V4.1 model?)")


def zero_biases(plan: Any, n_layers: int) -> list[str]:
    """Targets of ZERO_IF_ABSENT that the projector does not carry (written as zeros)."""
    out = []
    for row in ZERO_IF_ABSENT:
        for layer in (range(n_layers) if "{L}" in row else [None]):
            target = row.replace("{L}", str(layer)) if layer is not None else row
            if target not in plan.tensors:
                out.append(target)
    return out


__all__ = ["IMAGE_TOKENS", "SGLANG_DEFAULTS", "check_vl_biases", "mmproj_config", "zero_biases"]
