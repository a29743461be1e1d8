"""Benchmark: kt-kernel's LLAMAFILE backend (GGUF MXFP4 blocks read as they are, Q8_0 activations)
against its native MXFP4 backend (winport's path: experts handed over from memory), same weights.

One layer of `--experts` random experts at DeepSeek-V4.1-Flash shapes (hidden 5120, intermediate
2304) is drawn as llama.cpp MXFP4 blocks (one E8M0 byte + 16 bytes of E2M1 pairs per 32 values,
scales 2^-8 or 2^-7) and written as a GGUF the LLAMAFILE backend maps; the same blocks, split
into DeepSeek's layout by winport.gguf.mxfp4_repack, go to the native backend through
winport.hybrid.KTExperts. Both run in one process (one kt-kernel thread pool), synchronously on
CPU tensors (KT_FORCE_SYNC_SUBMIT=1), with DeepSeek's SwiGLU clamp at 10.

Printed: per batch, the median ms of a forward with random top-6 routing and the GB/s of the
distinct experts' MXFP4 bytes; then, for `--check` tokens, each backend's error against a float64
reference computed from gguf-py's own MXFP4 dequantization (RMS of the difference over the RMS
of the reference, and the largest |difference| over the reference's largest |value|).

Usage: python scripts/bench/kt_llamafile.py [--experts 96] [--threads 2] [--batches 1,2,4,8]
       [--iters 20] [--check 4] [--dir /tmp] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

os.environ.setdefault("KT_FORCE_SYNC_SUBMIT", "1")  # kt-kernel's only path that computes on CPU tensors
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

HIDDEN, INTER, TOP_K, LIMIT = 5120, 2304, 6, 10.0
EXPERT_BYTES = 3 * HIDDEN * INTER // 2 + 3 * HIDDEN * INTER // 32
PROJS = (("gate", "w1", INTER, HIDDEN), ("up", "w3", INTER, HIDDEN), ("down", "w2", HIDDEN, INTER))


def draw_blocks(rng, experts: int, rows: int, cols: int):  # noqa: ANN001, ANN201
    """[experts, rows, cols / 32 * 17] uint8 llama.cpp MXFP4 blocks with scale bytes 119 or 120."""
    import numpy as np

    b = rng.integers(0, 256, size=(experts, rows, cols // 32, 17), dtype=np.uint8)
    b[..., 0] = rng.integers(119, 121, size=(experts, rows, cols // 32), dtype=np.uint8)
    return b.reshape(experts, rows, cols // 32 * 17)


def main() -> None:
    """Draw, write, load both backends, time them, check them."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--experts", type=int, default=96)
    ap.add_argument("--threads", type=int, default=None, help="kt-kernel threads (default: physical cores - 1)")
    ap.add_argument("--batches", default="1,2,4,8")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--check", type=int, default=4, help="tokens checked against float64")
    ap.add_argument("--dir", default=tempfile.gettempdir())
    ap.add_argument("--json", default=None)
    a = ap.parse_args()

    import gguf
    import numpy as np

    from winport.gguf.mxfp4_repack import gguf_mxfp4_to_kt
    from winport.hybrid.kt_experts import KTExperts, import_kt
    from winport.hybrid.settings import KTSettings, default_cpu_threads

    import_kt()
    import torch
    from kt_kernel.utils.llamafile import LlamafileMoEWrapper

    threads = a.threads or default_cpu_threads()
    e = a.experts
    rng = np.random.default_rng(0)
    blocks = {name: draw_blocks(rng, e, rows, cols) for name, _w, rows, cols in PROJS}
    path = os.path.join(a.dir, f"kt_llamafile_{os.getpid()}.gguf")
    w = gguf.GGUFWriter(path, "deepseek41")
    for name, _w, _rows, _cols in PROJS:
        w.add_tensor(f"blk.0.ffn_{name}_exps.weight", blocks[name], raw_shape=blocks[name].shape,
                     raw_dtype=gguf.GGMLQuantizationType.MXFP4)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    try:
        llama = LlamafileMoEWrapper(0, e, TOP_K, HIDDEN, INTER, torch.zeros(e, dtype=torch.bool), threads, 1, path,
                                    64, method="LLAMAFILE", swiglu_limit=LIMIT)
        llama.load_weights()
        native = KTExperts(1, e, TOP_K, HIDDEN, INTER, KTSettings(cpu_threads=threads, threadpool_count=1, chunk=64),
                           LIMIT)
        for x in range(e):
            for name, proj, rows, cols in PROJS:
                packed, scales = gguf_mxfp4_to_kt(blocks[name][x], rows, cols)
                native.stage(x, proj, "weight", torch.from_numpy(packed).view(torch.int8))
                native.stage(x, proj, "scale", torch.from_numpy(scales).view(torch.float8_e8m0fnu))
        assert native.loaded, native.missing()

        def run_llama(xs, ids, wts):  # noqa: ANN001, ANN202
            return llama.forward(xs, ids.long(), wts, None)

        def run_native(xs, ids, wts):  # noqa: ANN001, ANN202
            return native.forward(xs, ids.long(), wts)

        gen = torch.Generator().manual_seed(1)
        rows = []
        for t in (int(b) for b in a.batches.split(",")):
            xs = torch.randn(t, HIDDEN, generator=gen).bfloat16()
            ids = torch.stack([torch.randperm(e, generator=gen)[:TOP_K] for _ in range(t)])
            wts = torch.rand(t, TOP_K, generator=gen) + 0.1
            distinct = len(set(ids.flatten().tolist()))
            row = {"batch": t, "distinct": distinct}
            for label, fn in (("llamafile", run_llama), ("native", run_native)):
                fn(xs, ids, wts)
                times = []
                for _ in range(a.iters):
                    t0 = time.perf_counter()
                    fn(xs, ids, wts)
                    times.append(time.perf_counter() - t0)
                ms = sorted(times)[len(times) // 2] * 1e3
                row[label] = {"ms": ms, "gbps": distinct * EXPERT_BYTES / (ms / 1e3) / 1e9}
            rows.append(row)
            print(f"batch {t} ({distinct} experts): LLAMAFILE {row['llamafile']['ms']:.2f} ms "
                  f"({row['llamafile']['gbps']:.2f} GB/s), native MXFP4 {row['native']['ms']:.2f} ms "
                  f"({row['native']['gbps']:.2f} GB/s)", flush=True)

        # float64 reference from gguf-py's dequantization, for `check` tokens
        xs = torch.randn(a.check, HIDDEN, generator=gen).bfloat16()
        ids = torch.stack([torch.randperm(e, generator=gen)[:TOP_K] for _ in range(a.check)])
        wts = torch.rand(a.check, TOP_K, generator=gen) + 0.1
        deq: dict[tuple[str, int], np.ndarray] = {}

        def weight(name: str, x: int) -> np.ndarray:
            if (name, x) not in deq:
                deq[(name, x)] = gguf.quants.dequantize(blocks[name][x], gguf.GGMLQuantizationType.MXFP4).astype(np.float64)
            return deq[(name, x)]

        ref = np.zeros((a.check, HIDDEN))
        xd = xs.double().numpy()
        for ti in range(a.check):
            for k in range(TOP_K):
                x = int(ids[ti, k])
                g = np.minimum(weight("gate", x) @ xd[ti], LIMIT)
                v = np.clip(weight("up", x) @ xd[ti], -LIMIT, LIMIT)
                ref[ti] += float(wts[ti, k]) * (weight("down", x) @ (g / (1 + np.exp(-g)) * v))
        errors = {}
        for label, fn in (("llamafile", run_llama), ("native", run_native)):
            out = fn(xs, ids, wts).double().numpy()
            d = out - ref
            errors[label] = {"rel_rms": float(np.sqrt((d ** 2).mean() / (ref ** 2).mean())),
                             "max_over_max": float(np.abs(d).max() / np.abs(ref).max()),
                             "finite": bool(np.isfinite(out).all())}
            print(f"{label}: error vs float64 over {a.check} tokens: relative RMS {errors[label]['rel_rms']:.2e}, "
                  f"max |diff| / max |ref| {errors[label]['max_over_max']:.2e}", flush=True)
        print("| backend | " + " | ".join(f"batch {r['batch']} ms (GB/s)" for r in rows) + " | rel. RMS error |")
        print("|---|" + "---|" * (len(rows) + 1))
        for label, title in (("llamafile", "LLAMAFILE (GGUF blocks, Q8_0 activations)"), ("native", "native MXFP4")):
            cells = " | ".join(f"{r[label]['ms']:.2f} ({r[label]['gbps']:.2f})" for r in rows)
            print(f"| {title} | {cells} | {errors[label]['rel_rms']:.2e} |")
        if a.json:
            with open(a.json, "w") as fh:
                json.dump({"threads": threads, "experts": e, "rows": rows, "errors": errors,
                           "backend": native.backend, "variant": native.variant}, fh, indent=1)
        print(f"threads {threads}; native backend {native.backend} ({native.variant} build)")
    finally:
        os.unlink(path)


if __name__ == "__main__":
    main()
