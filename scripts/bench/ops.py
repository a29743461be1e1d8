# ruff: noqa: B023  (each timing lambda is called inside the loop iteration that defines it)
"""Benchmark of winport's sgl_kernel / flashinfer / FA3 shims on CUDA at DeepSeek-V4.1-Flash sizes.

For each op and shape: max error vs the torch reference, time per call (eager: back-to-back Python
calls, which the launch path bounds for small ops; graph: replayed from a CUDA graph, the kernels'
own time; cold: the graph time with L2 flushed before each call, since working sets under the
50 MB L2 of an H100/H200 otherwise stay in L2 from one replay to the next), achieved GB/s (bytes the
op must move, over the graph time) and its share of the copy bandwidth measured in the same run
(torch copy of 1 GiB, which L2 cannot hold), for each timing.
Run on the GPU machine: PYTHONPATH=. python3 scripts/bench/ops.py [--sweep[=routing,softmax,bitmask]]
[--sweep-only]
--sweep first times block-size configs of the routing / softmax / bitmask kernels at the
prefill sizes (graph replay, warm and cold L2) and prints the best few of each next to the current
default; --sweep-only stops after the sweeps. Every max err is measured against the op's torch
reference in this run (sampling rows: the share of sampled tokens outside the top-k support).
"""

from __future__ import annotations

import importlib
import math
import sys
import traceback
from collections.abc import Callable

import flashinfer.sampling as fs
import sgl_kernel
import torch
import triton
import triton.language as tl
from roofline import copy_bandwidth, cuda_time, graph_time

from kernels_triton import (
    activation,
    bitmask,
    flash_attn,
    merge_state,
    moe_routing,
    moe_sum,
    norm,
    quant,
    rotary,
    sampling,
)


def _err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).abs().max())


def main() -> None:
    dev = "cuda"
    copy_bw = copy_bandwidth() / 1e9
    print(f"# {torch.cuda.get_device_name()}  torch {torch.__version__}  copy bandwidth {copy_bw:.0f} GB/s")
    parts = [a.split("=", 1)[1].split(",") if "=" in a else ["routing", "softmax", "bitmask"]
             for a in sys.argv[1:] if a.startswith("--sweep")]
    if parts:
        for part in parts[0]:
            try:
                {"routing": sweep_routing, "softmax": sweep_softmax, "bitmask": sweep_bitmask}[part](copy_bw)
            except Exception:  # the other sweeps and the table are still worth printing
                traceback.print_exc()
        if "--sweep-only" in sys.argv:
            return
    print("| op | shape | max err | eager (us) | graph (us) | cold (us) | GB/s (graph) | % copy graph | % copy cold "
          "| % copy eager |\n|---|---|---|---|---|---|---|---|---|---|")

    def row(op: str, shape: str, err: float | Callable[[], float], fn: Callable[[], object], nbytes: float,
            iters: int = 50) -> None:
        try:
            err = err() if callable(err) else err
            eager = cuda_time(fn, iters)
        except Exception as e:  # one broken op must not cost the rest of the table
            print(f"| {op} | {shape} | FAILED: {type(e).__name__}: {str(e)[:120]} |", flush=True)
            return
        try:
            graph = graph_time(fn, iters)
        except Exception as e:  # an op that cannot be captured still gets its eager row
            print(f"<!-- {op} {shape}: no CUDA graph ({type(e).__name__}: {e}) -->")
            graph = float("nan")
        cold = cold_time(fn, min(iters, 20)) if graph == graph else float("nan")
        bw = nbytes / graph / 1e9

        def pct(t: float) -> str:
            return f"{100 * nbytes / t / 1e9 / copy_bw:.0f}%"

        print(f"| {op} | {shape} | {err:.2e} | {eager * 1e6:.1f} | {graph * 1e6:.1f} | {cold * 1e6:.1f} | {bw:.0f} | "
              f"{pct(graph)} | {pct(cold)} | {pct(eager)} |", flush=True)

    bf = torch.bfloat16
    for tokens in (1, 64, 8192):
        x = torch.randn(tokens, 5120, dtype=bf, device=dev)
        w = torch.randn(5120, dtype=bf, device=dev)
        out = torch.empty_like(x)
        err = _err(sgl_kernel.rmsnorm(x, w, 1e-6, out=out), norm.rmsnorm_ref(x, w, 1e-6))
        row("rmsnorm", f"{tokens}x5120", err, lambda: sgl_kernel.rmsnorm(x, w, 1e-6, out=out), 2 * x.nbytes)
        r = torch.randn_like(x)
        row("fused_add_rmsnorm", f"{tokens}x5120", lambda: _fused_add_err(x, r, w),
            lambda: sgl_kernel.fused_add_rmsnorm(x, r, w, 1e-6), 4 * x.nbytes)
        g = torch.randn(tokens * 6, 2 * 2304, dtype=bf, device=dev)
        o = torch.empty(tokens * 6, 2304, dtype=bf, device=dev)
        sgl_kernel.silu_and_mul_clamp(g, o, 10.0)
        err = _err(o, activation.act_and_mul_ref(g, "silu", 10.0))
        row("silu_and_mul_clamp", f"{tokens * 6}x4608", err, lambda: sgl_kernel.silu_and_mul_clamp(g, o, 10.0),
            g.nbytes + o.nbytes)
        y = torch.randn(tokens, 6, 5120, dtype=bf, device=dev)
        err = _err(sgl_kernel.moe_sum_reduce(y, out, 1.5) or out, moe_sum.moe_sum_ref(y, 1.5))
        row("moe_sum_reduce", f"{tokens}x6x5120", err, lambda: sgl_kernel.moe_sum_reduce(y, out, 1.5),
            y.nbytes + out.nbytes)
        q = torch.empty(tokens, 5120, dtype=torch.float8_e4m3fn, device=dev)
        s = torch.empty(tokens, 40, device=dev)
        row("per_token_group_quant_fp8", f"{tokens}x5120/128", lambda: _quant_err(x, q, s),
            lambda: sgl_kernel.sgl_per_token_group_quant_fp8(x, q, s, 128, 1e-10, -448.0, 448.0),
            x.nbytes + q.nbytes + s.nbytes)
        pos = torch.randint(0, 65536, (tokens,), device=dev)
        cache = torch.randn(65536, 64, device=dev)
        qr = torch.randn(tokens, 64 * 512, dtype=bf, device=dev)
        kr = torch.randn(tokens, 512, dtype=bf, device=dev)
        ref = rotary.rope_ref(pos, qr, 512, cache, False)
        sgl_kernel.apply_rope_with_cos_sin_cache_inplace(pos, qr, kr, 512, cache, False)
        row("rope (64 of 512 dims)", f"{tokens}x65 heads", _err(qr, ref),
            lambda: sgl_kernel.apply_rope_with_cos_sin_cache_inplace(pos, qr, kr, 512, cache, False),
            2 * tokens * 65 * 64 * 2)
        # Rope's floor is not the contiguous copy: it reads and writes 128 of every 1024 bytes.
        row("rope's bytes only, read + write back (floor)", f"{tokens}x65 heads", 0.0, strided_touch(qr, kr),
            2 * tokens * 65 * 64 * 2)
        lg = torch.randn(tokens, 384, device=dev)
        bias = torch.randn(384, device=dev) * 0.1
        tw = torch.empty(tokens, 6, device=dev)
        ti = torch.empty(tokens, 6, dtype=torch.int32, device=dev)
        sgl_kernel.biased_topk(lg, bias, tw, ti, 6, "sqrtsoftplus", 0, True, 1.5, True)
        rw, ri = moe_routing.routing_ref(lg, bias, 6, "sqrtsoftplus", True, 1.5)
        # Weights in the reference's order; inf if the chosen experts differ (fp32 logits: no ties).
        err = _err(tw, rw) if torch.equal(ti, ri) else float("inf")
        row("biased_topk sqrtsoftplus", f"{tokens}x384 top6", err,
            lambda: sgl_kernel.biased_topk(lg, bias, tw, ti, 6, "sqrtsoftplus", 0, True, 1.5, True),
            lg.nbytes + tw.nbytes + ti.nbytes)
        va, vb = torch.randn(tokens, 64, 512, dtype=bf, device=dev), torch.randn(tokens, 64, 512, dtype=bf, device=dev)
        sa, sb = torch.randn(tokens, 64, device=dev), torch.randn(tokens, 64, device=dev)
        vo, so = torch.empty_like(va), torch.empty_like(sa)
        err = _err(sgl_kernel.merge_state_v2(va, sa, vb, sb, vo, so)[0], merge_state.merge_state_ref(va, sa, vb, sb)[0])
        row("merge_state_v2", f"{tokens}x64x512", err, lambda: sgl_kernel.merge_state_v2(va, sa, vb, sb, vo, so),
            3 * va.nbytes)
    for b in (1, 64):
        lg = torch.randn(b, 129280, device=dev)
        temp = torch.rand(b, device=dev) + 0.5
        err = _err(fs.softmax(lg, temp), torch.softmax(lg / temp[:, None], -1))
        row("softmax(temperature)", f"{b}x129280", err, lambda: fs.softmax(lg, temp), 2 * lg.nbytes)
        mask = torch.randint(-(2**31), 2**31 - 1, (b, 4040), dtype=torch.int32, device=dev)
        row("apply_token_bitmask (random mask)", f"{b}x129280", lambda: _bitmask_err(lg, mask),
            lambda: sgl_kernel.apply_token_bitmask_inplace_cuda(lg, mask), lg.nbytes + mask.nbytes)
        gmask = grammar_mask(b, 4040, dev)
        row("apply_token_bitmask (grammar-like mask)", f"{b}x129280", lambda: _bitmask_err(lg, gmask),
            lambda: sgl_kernel.apply_token_bitmask_inplace_cuda(lg, gmask), lg.nbytes + gmask.nbytes)
        lg = torch.randn(b, 129280, device=dev)
        p = torch.softmax(lg, -1)
        # The shim takes torch.topk candidates for k=50 when eager; under graph capture it cannot read
        # k back to the host and sorts (the graph column). The baseline is the reference filter.
        row("top_k_top_p_sampling (shim; graph: sort route)", f"{b}x129280", lambda: _sampling_err(p),
            lambda: fs.top_k_top_p_sampling_from_probs(p, 50, 0.9, filter_apply_order="joint"), p.nbytes, 10)
        row("top_k_top_p_sampling (reference: two sorts)", f"{b}x129280", 0.0,
            lambda: sampling.sample_from(sampling.filter_top_k_top_p(p, 50, 0.9, "joint"), None), p.nbytes, 10)
    sampling_routes(dev)
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


def _fused_add_err(x: torch.Tensor, r: torch.Tensor, w: torch.Tensor) -> float:
    xa, ra, xb, rb = x.clone(), r.clone(), x.clone(), r.clone()
    sgl_kernel.fused_add_rmsnorm(xa, ra, w, 1e-6)
    norm.fused_add_rmsnorm_ref(xb, rb, w, 1e-6)
    return max(_err(xa, xb), _err(ra, rb))


def _quant_err(x: torch.Tensor, q: torch.Tensor, s: torch.Tensor) -> float:
    """Max error of the dequantized output vs the reference's (fp8 values compared after scaling)."""
    sgl_kernel.sgl_per_token_group_quant_fp8(x, q, s, 128, 1e-10, -448.0, 448.0)
    rq, rs = quant.group_quant_ref(x, 128, 1e-10, -448.0, 448.0, torch.float8_e4m3fn)
    deq = q.float().view(x.shape[0], -1, 128) * s[..., None]
    rdeq = rq.float().view(x.shape[0], -1, 128) * rs[..., None]
    return max(_err(deq, rdeq), _err(s, rs))


def _bitmask_err(lg: torch.Tensor, mask: torch.Tensor) -> float:
    """0 when the shim equals the reference (-inf positions equal, the rest bit-equal), else inf."""
    a, b = lg.clone(), lg.clone()
    sgl_kernel.apply_token_bitmask_inplace_cuda(a, mask)
    bitmask.bitmask_ref(b, mask)
    return 0.0 if torch.equal(a, b) else float("inf")


def _sampling_err(p: torch.Tensor) -> float:
    """Share of 20 x batch sampled tokens outside the top-50 support (0 expected)."""
    keep = p >= p.topk(50, dim=-1).values[:, -1:]
    bad = 0
    for _ in range(20):
        s = fs.top_k_top_p_sampling_from_probs(p, 50, 0.9, filter_apply_order="joint")
        bad += int((~keep[torch.arange(p.shape[0], device=p.device), s.long()]).sum())
    return bad / (20 * p.shape[0])


@triton.jit
def _strided_touch_kernel(x_ptr, rows, row_stride, BLOCK_R: tl.constexpr, W: tl.constexpr):
    # Rope's memory traffic without its math: read the first W values of each row and write them back
    # changed, in place (bench-only baseline).
    r = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    c = tl.arange(0, W)
    p = x_ptr + r[:, None].to(tl.int64) * row_stride + c[None, :]
    m = (r < rows)[:, None]
    v = tl.load(p, mask=m, other=0.0)
    tl.store(p, (-v.to(tl.float32)).to(x_ptr.dtype.element_ty), mask=m)


def strided_touch(q: torch.Tensor, k: torch.Tensor) -> Callable[[], None]:
    """A call that only reads and writes back rope's bytes (the first 64 of every 512 bf16 values of
    q's 64 heads and k's one head), with the fastest of 12 tile shapes in graph time: the floor of
    that access pattern on this GPU, which rope's own % of copy is to be read against. (torch's
    strided copy_ of the same slices, tried first, reached half of this.)"""
    tokens = q.shape[0]
    qrows = q.view(tokens * 64, 512)

    def run(block_r: int, warps: int) -> None:
        _strided_touch_kernel[(triton.cdiv(tokens * 64, block_r),)](qrows, tokens * 64, 512, BLOCK_R=block_r, W=64,
                                                                   num_warps=warps)
        _strided_touch_kernel[(triton.cdiv(tokens, block_r),)](k, tokens, 512, BLOCK_R=block_r, W=64, num_warps=warps)

    cfgs = [(block_r, warps) for block_r in (16, 32, 64, 128) for warps in (2, 4, 8)]
    best = min(cfgs, key=lambda c: graph_time(lambda: run(*c), 50))
    return lambda: run(*best)


def sampling_routes(dev: str) -> None:
    """Eager top_k_top_p sampling (k=50, p=0.9) through each candidate route, per batch size: the data
    behind sampling.TOPK_CANDIDATES_MIN_ROWS (eager is how SGLang samples: outside the CUDA graph)."""
    keep = sampling.TOPK_CANDIDATES_MIN_ROWS
    print("\n| batch | topk route eager (us) | sort route eager (us) | reference eager (us) |\n|---|---|---|---|")
    try:
        for b in (1, 4, 16, 64):
            p = torch.softmax(torch.randn(b, 129280, device=dev), -1)
            times = []
            for rows in (0, 1 << 30):
                sampling.TOPK_CANDIDATES_MIN_ROWS = {"cuda": rows}
                times.append(cuda_time(lambda: fs.top_k_top_p_sampling_from_probs(p, 50, 0.9, filter_apply_order="joint"),
                                        20))
            ref = cuda_time(lambda: sampling.sample_from(sampling.filter_top_k_top_p(p, 50, 0.9, "joint"), None), 20)
            print(f"| {b} | {times[0] * 1e6:.1f} | {times[1] * 1e6:.1f} | {ref * 1e6:.1f} |", flush=True)
    finally:
        sampling.TOPK_CANDIDATES_MIN_ROWS = keep
    print()


def grammar_mask(b: int, words: int, dev: str) -> torch.Tensor:
    """A bitmask made of whole words as a grammar's mostly are, drawn per word: 85% 0 (tokens blocked,
    as at a structural position), 10% -1 (all allowed, as in a string body), 5% mixed (random bits)."""
    g = torch.Generator(device="cpu").manual_seed(0)
    kind = torch.rand(b, words, generator=g)
    rnd = torch.randint(-(2**31), 2**31 - 1, (b, words), dtype=torch.int32, generator=g)
    m = torch.where(kind < 0.85, torch.zeros_like(rnd), torch.where(kind < 0.95, torch.full_like(rnd, -1), rnd))
    return m.to(dev)


_FLUSH: list[torch.Tensor] = []


def cold_time(fn: Callable[[], object], iters: int = 20) -> float:
    """Graph-replay seconds of fn with L2 emptied first: time(read 256 MiB, fn) - time(read 256 MiB).

    The read evicts whatever fn left in L2 (its dirty lines are written back then, and counted)."""
    if not _FLUSH:
        _FLUSH.append(torch.zeros(256 << 20, dtype=torch.uint8, device="cuda"))
    buf = _FLUSH[0]
    both = graph_time(lambda: (buf.max(), fn()), iters)
    return max(both - graph_time(buf.max, iters), 1e-9)


def _sweep_one(name: str, nbytes: float, copy_bw: float, default: tuple, configs: list[tuple],
               run: Callable[[tuple], object], cold_top: int = 1) -> None:
    """Graph-time run(config) for each config; print the default and the best five (GB/s, % copy), and
    the cold-L2 time of the default and of the best cold_top configs."""
    res = []
    for cfg in dict.fromkeys([default, *configs]):
        try:
            run(cfg)
            torch.cuda.synchronize()
            res.append((graph_time(lambda: run(cfg)), cfg))
        except Exception as e:  # a config that does not compile (registers, shared memory) is skipped
            print(f"  {name} {cfg}: {type(e).__name__}: {str(e)[:80]}")
    res.sort()
    d = next((t for t, c in res if c == default), float("nan"))
    print(f"sweep {name}: default {default} {d * 1e6:.1f} us ({100 * nbytes / d / 1e9 / copy_bw:.0f}% copy); best:")
    for t, c in res[:6]:
        print(f"  {c}: {t * 1e6:.1f} us, {nbytes / t / 1e9:.0f} GB/s, {100 * nbytes / t / 1e9 / copy_bw:.0f}% copy")
    for c in dict.fromkeys([default, *[c for _, c in res[:cold_top]]]):
        if any(c == cc for _, cc in res):
            t = cold_time(lambda: run(c))
            print(f"  cold L2 {c}: {t * 1e6:.1f} us, {100 * nbytes / t / 1e9 / copy_bw:.0f}% copy", flush=True)


def sweep_routing(copy_bw: float) -> None:
    """biased_topk 8192x384 top-6: tokens per program, warps, chunks; earlier kernels for comparison
    when their bench-only copies (_routing_v0.py, _routing_v1.py) are present; top-1 and sigmoid
    variants to split the time into scoring and selection rounds."""
    dev = "cuda"
    n = 8192
    lg = torch.randn(n, 384, device=dev)
    bias = torch.randn(384, device=dev) * 0.1
    tw = torch.empty(n, 6, device=dev)
    ti = torch.empty(n, 6, dtype=torch.int32, device=dev)
    nb = lg.nbytes + tw.nbytes + ti.nbytes
    rt_cfgs = [(1, 1, 3), (2, 1, 3), (4, 4, 3), (8, 4, 3), (16, 8, 3), (4, 2, 1)]
    _sweep_one("biased_topk 8192x384 top6", nb, copy_bw, (moe_routing.routing_block_t(n, 384), 2), rt_cfgs,
               lambda c: moe_routing.routing_triton(lg, bias, tw, ti, 6, "sqrtsoftplus", True, 1.5, config=c),
               cold_top=2)
    for mod, cfgs in (("_routing_v0", [(4, 2)]), ("_routing_v1", [(4, 2), (2, 1, 3)])):
        try:  # an earlier kernel, if its bench-only copy is present
            old = importlib.import_module(mod)
        except ImportError:
            continue
        _sweep_one(f"biased_topk {mod} (earlier kernel)", nb, copy_bw, cfgs[0], cfgs[1:],
                   lambda c: old.routing_triton(lg, bias, tw, ti, 6, "sqrtsoftplus", True, 1.5, config=c))
    best = (moe_routing.routing_block_t(n, 384), 2)
    for label, k, score in (("top-1 sqrtsoftplus", 1, "sqrtsoftplus"), ("top-6 sigmoid", 6, "sigmoid"),
                            ("top-1 sigmoid", 1, "sigmoid")):
        t = graph_time(lambda: moe_routing.routing_triton(lg, bias, tw, ti, k, score, True, 1.5, config=best))
        print(f"  routing split {best} {label}: {t * 1e6:.1f} us")
    ref_out = torch.empty_like(lg)
    t = graph_time(lambda: ref_out.copy_(lg))
    print(f"  reference: copy of the 8192x384 fp32 logits {t * 1e6:.1f} us ({2 * lg.nbytes / t / 1e9:.0f} GB/s)",
          flush=True)


def sweep_softmax(copy_bw: float) -> None:
    """softmax 64x129280: splits, tile, warps, L2 eviction hints, row groups; warm and cold L2."""
    dev = "cuda"
    x = torch.randn(64, 129280, device=dev)
    temp = torch.rand(64, device=dev) + 0.5
    out = torch.empty_like(x)
    sm_cfgs = [(33, 2048, 4, True), (33, 2048, 4, False), (17, 4096, 8, True), (17, 4096, 8, False),
               (66, 1024, 4, True), (66, 1024, 4, False), (9, 2048, 4, True), (33, 1024, 2, True),
               (66, 2048, 4, True, 2), (66, 2048, 4, False, 2), (132, 1024, 4, True, 4), (132, 1024, 4, False, 4),
               (264, 512, 4, True, 8)]
    _sweep_one("softmax 64x129280", 2 * x.nbytes, copy_bw, sampling.softmax_config(64, 129280, x.device), sm_cfgs,
               lambda c: sampling.softmax_triton(x, temp, out, config=c), cold_top=len(sm_cfgs))


def sweep_bitmask(copy_bw: float) -> None:
    """apply_token_bitmask 64x129280: tile, variant, warps; random and grammar-like masks; warm and cold
    L2; copy and fill of the logits as references."""
    dev = "cuda"
    x = torch.randn(64, 129280, device=dev)
    out = torch.empty_like(x)
    mask = torch.randint(-(2**31), 2**31 - 1, (64, 4040), dtype=torch.int32, device=dev)
    gmask = grammar_mask(64, 4040, dev)
    bm_cfgs = [(128, 1, 4), (128, 2, 4), (128, 0, 4), (256, 1, 4), (256, 2, 4), (64, 1, 4), (64, 2, 4),
               (128, 1, 8), (128, 2, 8), (256, 2, 8)]
    for mname, m in (("random", mask), ("grammar-like", gmask)):
        _sweep_one(f"bitmask 64x129280 {mname} mask", x.nbytes + m.nbytes, copy_bw, bitmask.BITMASK_CONFIG, bm_cfgs,
                   lambda c: bitmask.bitmask_triton(x, m, None, config=c), cold_top=4)
    t_copy, t_cold = graph_time(lambda: out.copy_(x)), cold_time(lambda: out.copy_(x))
    print(f"reference: copy of the 64x129280 fp32 logits {t_copy * 1e6:.1f} us ({2 * x.nbytes / t_copy / 1e9:.0f} GB/s), "
          f"cold L2 {t_cold * 1e6:.1f} us ({2 * x.nbytes / t_cold / 1e9:.0f} GB/s); bitmask counts "
          f"{x.nbytes + mask.nbytes} bytes, softmax {2 * x.nbytes}", flush=True)
    t_fill = graph_time(lambda: out.fill_(0.0))
    print(f"reference: fill of the 64x129280 fp32 logits (write only) {t_fill * 1e6:.1f} us, cold "
          f"{cold_time(lambda: out.fill_(0.0)) * 1e6:.1f} us", flush=True)


def sgl_kernel_fa(q: torch.Tensor, cu: torch.Tensor, n: int) -> torch.Tensor:
    from sgl_kernel.flash_attn import flash_attn_varlen_func

    return flash_attn_varlen_func(q, q, q, cu, cu, n, n, softmax_scale=1 / math.sqrt(q.shape[-1]))


if __name__ == "__main__":
    main()
