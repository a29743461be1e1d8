"""DeepSeek-V4's index/metadata Triton kernels on CPU in torch instead of Triton's interpreter.

Targets three kernels of sglang 0.5.23 that the DSV4 attention backend launches for every batch:
- `kernels/ops/attention/dsv4/metadata_kernel.py:_init_compressed_attn_metadata_kernel`
  (per request: ratio-4 and ratio-128 compressed-cache slots, positions and lengths, and the
  ratio-128 page indices), launched by `_init_compressed_attn_metadata_triton` at every step;
- `kernels/ops/attention/dsv4/sparse_prefill_kernels.py:_combine_topk_swa_indices_kernel`
  (per prefill token: its top-k compressed indices and sliding-window indices as one -1 padded
  row for sparse attention), launched by `combine_topk_swa_indices`;
- `sparse_prefill_kernels.py:_build_swa_token_ids_kernel` (the SWA-cache ids of each request's
  window), launched by `build_swa_token_ids`;
- `dequant_k_cache.py:_dequantize_k_cache_paged_kernel` (V4's FP8 paged K cache to bf16 rows for
  sparse prefill), launched by `dequantize_k_cache_paged_dsv4`.
On CPU they run in Triton's interpreter (TRITON_INTERPRET=1): the combine kernel alone was ~40%
of a 78-token prefill (scripts/bench/cpu_serve.py with py-spy). Each is index arithmetic (and one exact FP8 dequantization).

Only the launch is replaced: the module attribute holding each kernel becomes a launcher that,
for CPU tensors, calls a torch function taking the kernel's own arguments (kernels_triton.dsv4_cpu_ops),
so upstream's Python wrappers (argument checks, output allocation, grid) stay in use. Other devices
launch the original kernel. The torch functions carry over the kernels' semantics (not their code);
the tests compare them with the kernels under the interpreter.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

import torch

from kernels_triton.dsv4_cpu_ops import (  # noqa: F401  (the torch functions; their tests import them here)
    build_swa_token_ids,
    combine_topk_swa_indices,
    dequantize_k_cache_paged,
    init_compressed_attn_metadata,
)
from winport import envs
from winport.patches._base import UpstreamChangedError, require_source

# WINPORT_CPU_TORCH_KERNELS=0 leaves the Triton kernels (interpreted on CPU) in place.
SWITCH = envs.WINPORT_CPU_TORCH_KERNELS.name

METADATA = "sglang.kernels.ops.attention.dsv4.metadata_kernel"
SPARSE_PREFILL = "sglang.kernels.ops.attention.dsv4.sparse_prefill_kernels"
DEQUANT = "sglang.kernels.ops.attention.dsv4.dequant_k_cache"


class CpuLauncher:
    """Stands where a Triton kernel was: `kernel[grid](...)` runs `torch_impl(...)` for CPU tensors."""

    def __init__(self, kernel: Any, torch_impl: Callable[..., None]) -> None:
        """Wrap `kernel`; CPU launches go to `torch_impl`, called with the launch's arguments."""
        self.kernel = kernel
        self.torch_impl = torch_impl

    def __getitem__(self, grid: Any) -> Callable[..., None]:
        """The launch for `grid` (ignored on CPU: the torch function covers the whole problem)."""
        def launch(*args: Any, **kwargs: Any) -> None:
            first = next(a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor))
            if first.device.type == "cpu":
                return self.torch_impl(*args, **kwargs)
            return self.kernel[grid](*args, **kwargs)

        return launch


# module -> {kernel attribute: torch function}
KERNELS: dict[str, dict[str, Callable[..., None]]] = {
    METADATA: {"_init_compressed_attn_metadata_kernel": init_compressed_attn_metadata},
    SPARSE_PREFILL: {"_combine_topk_swa_indices_kernel": combine_topk_swa_indices,
                     "_build_swa_token_ids_kernel": build_swa_token_ids},
    DEQUANT: {"_dequantize_k_cache_paged_kernel": dequantize_k_cache_paged},
}


def apply() -> None:
    """Put the launchers in place (idempotent)."""
    for module_name, kernels in KERNELS.items():
        module = importlib.import_module(module_name)
        for attr, impl in kernels.items():
            current = getattr(module, attr, None)
            if current is None:
                raise UpstreamChangedError(f"{module_name}.{attr} no longer exists upstream")
            if not isinstance(current, CpuLauncher):
                setattr(module, attr, CpuLauncher(current, impl))


def register_patch() -> None:
    """Check that the kernels still compute what the torch functions do, then apply."""
    # The kernels are triton JITFunctions (no inspectable function): their modules' source is checked.
    require_source(
        METADATA,
        "c4_should_compress = (seq_len % 4) == 0",
        "c4_positions = position & (~3)",
        "c128_out_loc = tl.where(c128_should_compress, raw_out_loc // 128, 0)",
        "c128_seq_lens_clamp1 = tl.maximum(c128_seq_lens_raw, 1)",
        "c_page_indices_vals = page_table_vals * c128_page_size + offset_in_page",
        "c_page_indices_vals = tl.where(valid_mask, c_page_indices_vals, -1)",
        "_init_compressed_attn_metadata_kernel[grid](",
    )
    require_source(
        SPARSE_PREFILL,
        "topk_len = tl.where(owned, tl.minimum((pos + 1) // COMPRESS_RATIO, top_k), 0)",
        "swa_len = tl.where(owned, tl.minimum(pos + 1, WINDOW_SIZE), 0)",
        "swa_vals = tl.where(swa_vals >= 0, swa_base[:, None] + swa_vals, -1)",
        "swa_start = swa_base + pos - swa_len + 1 - gather_start",
        "tl.where(topk_vals >= 0, topk_vals + compressed_base[:, None], -1)",
        "swa_id = tl.load(full_to_swa_ptr + full_id).to(tl.int32)",
        "_combine_topk_swa_indices_kernel[(triton.cdiv(num_tokens, block_t),)](",
        "_build_swa_token_ids_kernel[(num_reqs, NUM_WORKERS)](",
    )
    require_source(
        DEQUANT,
        "page_idx = loc // PAGE_SIZE",
        "token_data_base = page_byte_base + in_page * NOPE_ROPE_BYTES",
        "page_byte_base + S_OFFSET_BYTES + in_page * PADDED_SCALE_PER_TOKEN",
        "scale_pow2 = tl.exp2((scale_u8 - 127).to(tl.float32))",
        "bf16_off = (token_data_base[:, None] + DIM_NOPE) // 2 + rope_offs[None, :]",
        "_dequantize_k_cache_paged_kernel[(triton.cdiv(num_tokens, tokens_per_prog),)](",
    )
    if not envs.WINPORT_CPU_TORCH_KERNELS.get():  # benchmarks compare with the interpreted kernels
        return
    apply()
