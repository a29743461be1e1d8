# ruff: noqa: B023  (each timing lambda is called inside the loop iteration that defines it)
"""Benchmark of winport's sgl_kernel / flashinfer / FA3 shims on CUDA at DeepSeek-V4.1-Flash sizes.

For each op and shape: max error vs the torch reference, time per call, achieved GB/s (bytes the op
must move) and its share of the copy bandwidth measured in the same run (torch copy of 1 GiB).
Run on the GPU machine: PYTHONPATH=. python3 scripts/bench/ops.py
"""

from __future__ import annotations

import math

import flashinfer.sampling as fs
import sgl_kernel
import torch
from roofline import copy_bandwidth, cuda_time

from kernels_triton import activation, flash_attn, merge_state, moe_routing, moe_sum, norm, rotary


def _err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).abs().max())


def main() -> None:
    dev = "cuda"
    copy_bw = copy_bandwidth() / 1e9
    print(f"# {torch.cuda.get_device_name()}  torch {torch.__version__}  copy bandwidth {copy_bw:.0f} GB/s")
    print("| op | shape | max err | time (us) | GB/s | % copy |\n|---|---|---|---|---|---|")
    rows = []

    def row(op: str, shape: str, err: float, secs: float, nbytes: float) -> None:
        bw = nbytes / secs / 1e9
        rows.append((op, shape, err, secs, bw))
        print(f"| {op} | {shape} | {err:.2e} | {secs * 1e6:.1f} | {bw:.0f} | {100 * bw / copy_bw:.0f}% |")

    bf = torch.bfloat16
    for tokens in (1, 64, 8192):
        x = torch.randn(tokens, 5120, dtype=bf, device=dev)
        w = torch.randn(5120, dtype=bf, device=dev)
        out = torch.empty_like(x)
        err = _err(sgl_kernel.rmsnorm(x, w, 1e-6, out=out), norm.rmsnorm_ref(x, w, 1e-6))
        row("rmsnorm", f"{tokens}x5120", err, cuda_time(lambda: sgl_kernel.rmsnorm(x, w, 1e-6, out=out)), 2 * x.nbytes)
        r = torch.randn_like(x)
        row("fused_add_rmsnorm", f"{tokens}x5120", 0.0, cuda_time(lambda: sgl_kernel.fused_add_rmsnorm(x, r, w, 1e-6)),
            4 * x.nbytes)
        g = torch.randn(tokens * 6, 2 * 2304, dtype=bf, device=dev)
        o = torch.empty(tokens * 6, 2304, dtype=bf, device=dev)
        err = _err(sgl_kernel.silu_and_mul(g, o), activation.act_and_mul_ref(g, "silu"))
        row("silu_and_mul", f"{tokens * 6}x4608", err, cuda_time(lambda: sgl_kernel.silu_and_mul_clamp(g, o, 10.0)),
            g.nbytes + o.nbytes)
        y = torch.randn(tokens, 6, 5120, dtype=bf, device=dev)
        err = _err(sgl_kernel.moe_sum_reduce(y, out, 1.5) or out, moe_sum.moe_sum_ref(y, 1.5))
        row("moe_sum_reduce", f"{tokens}x6x5120", err, cuda_time(lambda: sgl_kernel.moe_sum_reduce(y, out, 1.5)),
            y.nbytes + out.nbytes)
        q = torch.empty(tokens, 5120, dtype=torch.float8_e4m3fn, device=dev)
        s = torch.empty(tokens, 40, device=dev)
        row("per_token_group_quant_fp8", f"{tokens}x5120/128", 0.0,
            cuda_time(lambda: sgl_kernel.sgl_per_token_group_quant_fp8(x, q, s, 128, 1e-10, -448.0, 448.0)),
            x.nbytes + q.nbytes + s.nbytes)
        pos = torch.randint(0, 65536, (tokens,), device=dev)
        cache = torch.randn(65536, 64, device=dev)
        qr = torch.randn(tokens, 64 * 512, dtype=bf, device=dev)
        kr = torch.randn(tokens, 512, dtype=bf, device=dev)
        ref = rotary.rope_ref(pos, qr, 512, cache, False)
        sgl_kernel.apply_rope_with_cos_sin_cache_inplace(pos, qr, kr, 512, cache, False)
        row("rope (64 of 512 dims)", f"{tokens}x65 heads", _err(qr, ref),
            cuda_time(lambda: sgl_kernel.apply_rope_with_cos_sin_cache_inplace(pos, qr, kr, 512, cache, False)),
            2 * tokens * 65 * 64 * 2)
        lg = torch.randn(tokens, 384, device=dev)
        bias = torch.randn(384, device=dev) * 0.1
        tw = torch.empty(tokens, 6, device=dev)
        ti = torch.empty(tokens, 6, dtype=torch.int32, device=dev)
        sgl_kernel.biased_topk(lg, bias, tw, ti, 6, "sqrtsoftplus", 0, True, 1.5, True)
        rw, _ = moe_routing.routing_ref(lg, bias, 6, "sqrtsoftplus", True, 1.5)
        row("biased_topk sqrtsoftplus", f"{tokens}x384 top6", _err(tw.sort(-1).values, rw.sort(-1).values),
            cuda_time(lambda: sgl_kernel.biased_topk(lg, bias, tw, ti, 6, "sqrtsoftplus", 0, True, 1.5, True)),
            lg.nbytes + tw.nbytes + ti.nbytes)
        va, vb = torch.randn(tokens, 64, 512, dtype=bf, device=dev), torch.randn(tokens, 64, 512, dtype=bf, device=dev)
        sa, sb = torch.randn(tokens, 64, device=dev), torch.randn(tokens, 64, device=dev)
        vo, so = torch.empty_like(va), torch.empty_like(sa)
        err = _err(sgl_kernel.merge_state_v2(va, sa, vb, sb, vo, so)[0], merge_state.merge_state_ref(va, sa, vb, sb)[0])
        row("merge_state_v2", f"{tokens}x64x512", err, cuda_time(lambda: sgl_kernel.merge_state_v2(va, sa, vb, sb, vo, so)),
            3 * va.nbytes)
    for b in (1, 64):
        lg = torch.randn(b, 129280, device=dev)
        temp = torch.rand(b, device=dev) + 0.5
        err = _err(fs.softmax(lg, temp), torch.softmax(lg / temp[:, None], -1))
        row("softmax(temperature)", f"{b}x129280", err, cuda_time(lambda: fs.softmax(lg, temp)), 2 * lg.nbytes)
        mask = torch.randint(-(2**31), 2**31 - 1, (b, 4040), dtype=torch.int32, device=dev)
        row("apply_token_bitmask", f"{b}x129280", 0.0,
            cuda_time(lambda: sgl_kernel.apply_token_bitmask_inplace_cuda(lg, mask)), lg.nbytes + mask.nbytes)
        p = torch.softmax(lg, -1)
        row("top_k_top_p_sampling (torch)", f"{b}x129280", 0.0,
            cuda_time(lambda: fs.top_k_top_p_sampling_from_probs(p, 50, 0.9, filter_apply_order="joint"), 10), p.nbytes)
    for n, hd in ((4096, 80), (16384, 128)):
        q = torch.randn(n, 16, hd, dtype=bf, device=dev)
        cu = torch.tensor([0, n], dtype=torch.int32, device=dev)
        fn = lambda: sgl_kernel_fa(q, cu, n)  # noqa: E731
        fa_out = fn()
        ref, _ = flash_attn.attention_ref(q[:2048], q[:2048], q[:2048], torch.tensor([0, 2048], device=dev),
                                          cu_seqlens_k=torch.tensor([0, 2048], device=dev))
        err = _err(sgl_kernel_fa(q[:2048], torch.tensor([0, 2048], dtype=torch.int32, device=dev), 2048), ref)
        secs = cuda_time(fn, 10)
        flops = 4 * n * n * 16 * hd
        print(f"| flash_attn_varlen (vision, non-causal) | {n}x16x{hd} | {err:.2e} | {secs * 1e6:.1f} | "
              f"{flops / secs / 1e12:.1f} TFLOP/s | - |")
        del fa_out


def sgl_kernel_fa(q: torch.Tensor, cu: torch.Tensor, n: int) -> torch.Tensor:
    from sgl_kernel.flash_attn import flash_attn_varlen_func

    return flash_attn_varlen_func(q, q, q, cu, cu, n, n, softmax_scale=1 / math.sqrt(q.shape[-1]))


if __name__ == "__main__":
    main()
