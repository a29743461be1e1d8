"""Hybrid MoE: kt-kernel runs the routed experts on the CPU, the GPU runs the resident ones.

- settings: thread, pool and GPU-expert defaults (and where SGLang's --kt-* flags come in);
- slots: the per-layer placement (kt-kernel's in-place GPU mask, the logical id -> GPU slot map);
- kt_experts: the kt-kernel wrapper's lifecycle and the expert-weight hand-off from memory;
- layer: one MoE layer's forward (CPU submit, GPU experts, CPU sync, one scaling of the sum).
winport.patches.kt_hybrid_moe wires these into SGLang 0.5.23's FusedMoE.
"""
