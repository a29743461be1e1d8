"""Named patches to SGLang 0.5.23. Each module fixes one thing, names the upstream file it targets,
asserts that the upstream code still looks as expected (failing loudly otherwise) and has a test."""

from __future__ import annotations

# Module names under winport.patches, applied in this order by register_all().
PATCHES: tuple[str, ...] = (
    "windows_signals",
    "zmq_tcp_endpoints",
    "loopback_distributed",
    "quiet_stop",
    "cpu_topology_without_lscpu",
    "cpu_pin_memory",
    "cpu_rope_without_scaling",
    "cpu_dsv4_fp8_kv",
    "dsv4_generic_device",
    "cuda_jit_quant",
    "fused_op_without_jit",
    "dsv4_fused_store",
    "dsv41_cuda_without_jit",
    "cuda_router_gemm_without_jit",
    "dsv41_cpu_swa_layout_flag",
    "dsv41_cpu_index_k_store",
    "cpu_mhc_combine",
    "engram_host_table_file_map",
    "engram_rows_from_gguf",
    "gguf_direct_weights",
    "chat_template_without_recipe",
    "chat_images_in_string_template",
    "cpu_fp8_block_linear",
    "cpu_mxfp4_moe",
    "cuda_fp4_dequant_block_shape",
    "cuda_mxfp4_moe",
    "kt_hybrid_moe",
    "kt_hot_experts",
    "cpu_tp_dsv4_single_kv_head",
    "cpu_tp_embedding_eager",
    "cpu_tp_thread_binding",
    "cpu_dsv4_rope_torch",
    "cpu_dsv4_index_kernels_torch",
    "dsv41_vision_hash_routing",
    "request_limits",
)


def register_all() -> None:
    """Register every patch with SGLang's HookRegistry.

    A patch whose upstream target changed stops the process (SystemExit): SGLang swallows
    ordinary exceptions from plugins, and running with half the patches would fail later and
    far from the cause.
    """
    import importlib

    from winport.patches._base import UpstreamChangedError

    for name in PATCHES:
        try:
            importlib.import_module(f"winport.patches.{name}").register_patch()
        except UpstreamChangedError as exc:
            raise SystemExit(f"winport patch {name!r} cannot be applied: {exc}") from exc
