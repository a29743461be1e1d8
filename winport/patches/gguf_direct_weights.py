"""SGLang loads a GGUF's weights straight from the GGUF (winport.gguf.direct): no safetensors copy.

Targets sglang 0.5.23 `srt/model_loader/loader.py:DefaultModelLoader` and
`srt/configs/deepseek_v4.py:try_detect_fp4_experts`, for a checkpoint folder that holds
winport.gguf.direct.SIDECAR (written by `winport serve --model X.gguf`) and no weight files:
- `_prepare_weights` would glob the folder for `*.safetensors` and raise on finding none: it
  returns the folder with no files instead (SGLang's start-up prefetch resolves sources this way);
- `_get_weights_iterator` yields the GGUF's tensors, converted as the copying route converts them,
  then ends the way upstream's does: the DSpark draft runner's MTP filter when it has a draft index,
  the load timer, the source prefix;
- the DeepSeek-V4 routed-expert layout probe, which reads one expert's dtype from a safetensors
  header, answers from the sidecar (MXFP4 experts or not).
Every other folder takes upstream's code unchanged.
"""

from __future__ import annotations

import time
from typing import Any

from winport.patches._base import register, require_source

PREPARE = "sglang.srt.model_loader.loader.DefaultModelLoader._prepare_weights"
ITERATOR = "sglang.srt.model_loader.loader.DefaultModelLoader._get_weights_iterator"
PROBE = "sglang.srt.configs.deepseek_v4.try_detect_fp4_experts"


def _direct(path: Any) -> dict[str, Any] | None:
    from winport.gguf.direct import read_sidecar

    return read_sidecar(path) if isinstance(path, str) else None


def _prepare(original: Any, self: Any, model_name_or_path: str, *args: Any, **kwargs: Any) -> Any:
    if _direct(model_name_or_path) is None:
        return original(self, model_name_or_path, *args, **kwargs)
    return model_name_or_path, [], True


def _iterator(original: Any, self: Any, source: Any, *args: Any, **kwargs: Any) -> Any:
    if _direct(source.model_or_path) is None:
        return original(self, source, *args, **kwargs)
    from winport.gguf import direct
    from winport.hybrid import hot_registry

    # Hot-expert swaps read the same GGUF: the stream leaves it open for them (one open a process).
    weights = direct.weights(source.model_or_path, keep_open=hot_registry.enabled())
    # upstream's tail of _get_weights_iterator (checked in register_patch)
    if self.load_config.draft_model_idx is not None:
        return self._filter_mtp_weights(weights, source.prefix, self.load_config.draft_model_idx)
    if self.counter_before_loading_weights == 0.0:
        self.counter_before_loading_weights = time.perf_counter()
    return ((source.prefix + name, tensor) for name, tensor in weights)


def _probe(original: Any, model_path: str, *args: Any, **kwargs: Any) -> Any:
    info = _direct(model_path)
    if info is None:
        return original(model_path, *args, **kwargs)
    return bool(info["fp4_experts"])


def register_patch() -> None:
    """Check the three upstream functions and register the hooks."""
    require_source(PREPARE, "allow_patterns = [\"*.safetensors\", \"*.bin\"]", "return hf_folder, hf_weights_files, use_safetensors")
    require_source(ITERATOR, "hf_folder, hf_weights_files, use_safetensors = self._prepare_weights(",
                   "if self.load_config.draft_model_idx is not None:",
                   "return self._filter_mtp_weights(\n                weights_iterator, source.prefix, self.load_config.draft_model_idx",
                   "if self.counter_before_loading_weights == 0.0:",
                   "return ((source.prefix + name, tensor) for (name, tensor) in weights_iterator)")
    require_source(PROBE, "probe_routed_expert_weight_dtype(local_path)", 'if dtype in ("U8", "I8", "F4"):')
    require_source("sglang.srt.configs.model_config.ModelConfig.__init__",
                   "from sglang.srt.configs.deepseek_v4 import try_detect_fp4_experts")
    register(PREPARE, _prepare)
    register(ITERATOR, _iterator)
    register(PROBE, _probe)
