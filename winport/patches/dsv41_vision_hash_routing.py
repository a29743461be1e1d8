"""V4.1 vision routing on hash-routed MoE layers: hash routing, as for text.

Targets sglang 0.5.23 `srt/models/deepseek_v2.py` `vision_topk` (imported there from
`srt/multimodal/dsv41/vl_routing.py`). With a vision tower, every V4.1 MoE gate gets a VL
correction bias (`MoEGate(vl_correction_bias=True)`, hash layers included), and
`DeepseekV2MoE.forward_normal` then routes through `vision_topk` whenever that bias exists. On a
hash-routed layer (layer_id < num_hash_layers: `HashTopK`, experts picked by token id through
tid2eid, no score correction bias at all) `vision_topk` reads `moe.topk.topk_config`, which
HashTopK does not have: the first image request kills the scheduler (AttributeError), on every
device. A correction bias has nothing to correct on a hash layer, so this patch routes such a
layer exactly as without vision: `moe.topk(...)` with the token ids (image positions carry
image_token_id there; SGLang's prepare_language_model_inputs puts it in place of the hashes).
Score-routed layers keep SGLang's vision_topk.
"""

from __future__ import annotations

from typing import Any

from winport.patches._base import register, require_source

TARGET = "sglang.srt.models.deepseek_v2.vision_topk"


def _vision_topk(original: Any, moe: Any, logits: Any, input_ids: Any, *args: Any, **kwargs: Any) -> Any:
    if getattr(moe, "is_hash", False):
        # HashTopK reads only the row count of hidden_states (a shape assertion); the router logits
        # have the same rows, so they stand in for the hidden states vision_topk is not given.
        return moe.topk(logits, logits, input_ids, *args, **kwargs)
    return original(moe, logits, input_ids, *args, **kwargs)


def register_patch() -> None:
    """Check upstream and register the hook."""
    require_source(TARGET, "config = moe.topk.topk_config")
    require_source("sglang.srt.models.deepseek_v2.DeepseekV2MoE.forward_normal",
                   "topk_output = vision_topk(")
    require_source("sglang.srt.layers.moe.hash_topk.HashTopK.forward",
                   "assert input_ids.shape[0] == hidden_states.shape[0] == router_logits.shape[0]")
    register(TARGET, _vision_topk)
