"""Test support: record what SGLang's V4.1 vision tower computes in a served model.

Loaded into every process of a test server through a generated `sitecustomize.py` (see
tests/serve/test_vision_live.py) when WINPORT_VISION_CAPTURE_DIR is set; never imported by winport.
Each call of DeepseekV4ForCausalLM.get_image_feature saves `image{n}.pt` (n counts per process)
with, per image, the patches it was given (bf16 [n_vit_h * n_vit_w, 3, p, p]), the patch grid and
the span it returned ([tokens, hidden]: image_start, aligner rows and newlines, image_end).
"""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import Any

import torch

_count = {"n": 0}


def _patch_model(module: Any) -> None:
    cls = module.DeepseekV4ForCausalLM
    original = cls.get_image_feature

    @functools.wraps(original)
    def capturing(self: Any, items: Any) -> Any:
        spans = original(self, items)
        records = [{"patches": torch.as_tensor(item.feature).detach().clone().cpu(), "h": int(item.n_vit_h),
                    "w": int(item.n_vit_w), "span": span.detach().clone().cpu()}
                   for item, span in zip(items, spans, strict=True)]
        out = Path(os.environ["WINPORT_VISION_CAPTURE_DIR"]) / f"image{os.getpid()}-{_count['n']}.pt"
        _count["n"] += 1
        torch.save(records, out)
        return spans

    cls.get_image_feature = capturing


def install() -> None:
    """Patch SGLang's model module as it is imported (no effect unless the capture dir is set)."""
    if not os.environ.get("WINPORT_VISION_CAPTURE_DIR"):
        return
    from winport.importhooks import on_import

    on_import("sglang.srt.models.deepseek_v4", _patch_model)
