"""GGUF load benchmark: load throughput vs a plain sequential read, and peak RSS while loading.

Writes (once) a synthetic DeepSeek-V4.1-named GGUF of about ``--gib`` GiB (Q8_0 dense, MXFP4
experts, F32 norms), warms the page cache and keeps it warm (WINPORT_GGUF_KEEP_PAGE_CACHE=1 unless
set: the server's loader drops the bytes it has copied into place), then in the same run measures
  1. a plain sequential read of the file (readinto a reused buffer): the I/O roofline, before
     and after the load (the machine may be shared), and a read into fresh buffers that are all
     kept (what producing that many resident bytes costs with no conversion at all);
  2. winport.gguf.load_gguf_model(...).weights() converting everything and keeping every output
     tensor (the "final resident weights"), timed per role;
  3. peak RSS during 2 (VmHWM, reset before the load) against final resident weights + the largest
     output tensor; the goal is <= 1.2x.
  4. per conversion kernel (outputs preallocated), GB/s at each of ``--threads`` conversion threads
     (torch intra-op threads 1, so "1" is really one thread) and the speedup over one thread, next
     to a GIL-free reference workload (sha256 of 4 MiB buffers, which releases the GIL) run the same
     way in the same run: its speedup is what the machine's free cores allow right now, so
     kernel speedup / reference speedup is the kernel's thread-scaling efficiency. With
     ``--baseline REV`` the conversion code of git revision REV (winport/gguf/mxfp4_repack.py and
     convert.py) is timed interleaved with the current code: before/after from one run.
With ``--cold`` every read and the load start from a dropped page cache (posix_fadvise DONTNEED on
the file, no privileges needed; the bytes left resident are printed).
Usage: python scripts/bench/gguf_load.py [--gib 3] [--path /tmp/winport_bench.gguf] [--cold]
           [--threads 1,2,4,8,16] [--baseline REV] [--kernels-only] [--reps 9]
"""

from __future__ import annotations

import argparse
import os
import platform
import struct
import sys
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from winport.gguf.reader import drop_file_page_cache  # noqa: E402
from winport.gguf.types import GGML_TYPES_BY_NAME  # noqa: E402

H, QL, OL, E, IM = 2048, 512, 1024, 32, 1024  # hidden, q_lora, o_lora, experts, moe inter


def _chunk(mr) -> int:  # noqa: ANN001 - the current or a --baseline revision's mxfp4_repack module
    """The repack work-item size of ``mr`` (revisions before chunk_blocks() kept a constant)."""
    return mr.chunk_blocks() if hasattr(mr, "chunk_blocks") else mr._CHUNK_BLOCKS


def _layer_tensors(i: int) -> list[tuple[str, str, tuple[int, ...]]]:
    b = f"blk.{i}."
    return [
        (b + "attn_norm.weight", "F32", (H,)),
        (b + "attn_sinks.weight", "F32", (16,)),
        (b + "attn_q_a.weight", "Q8_0", (QL, H)),
        (b + "attn_q_a_norm.weight", "F32", (QL,)),
        (b + "attn_q_b.weight", "Q8_0", (16 * 256, QL)),
        (b + "attn_kv.weight", "Q8_0", (256, H)),
        (b + "attn_kv_a_norm.weight", "F32", (256,)),
        (b + "attn_output_a.weight", "Q8_0", (OL, 2048)),
        (b + "attn_output_b.weight", "Q8_0", (H, OL)),
        (b + "hc_attn_fn.weight", "F32", (24, 4 * H)),
        (b + "hc_attn_base.weight", "F32", (24,)),
        (b + "hc_attn_scale.weight", "F32", (3,)),
        (b + "hc_ffn_fn.weight", "F32", (24, 4 * H)),
        (b + "hc_ffn_base.weight", "F32", (24,)),
        (b + "hc_ffn_scale.weight", "F32", (3,)),
        (b + "ffn_norm.weight", "F32", (H,)),
        (b + "ffn_gate_inp.weight", "F32", (E, H)),
        (b + "ffn_gate_exps.weight", "MXFP4", (E, IM, H)),
        (b + "ffn_up_exps.weight", "MXFP4", (E, IM, H)),
        (b + "ffn_down_exps.weight", "MXFP4", (E, H, IM)),
        (b + "ffn_gate_shexp.weight", "Q8_0", (IM, H)),
        (b + "ffn_up_shexp.weight", "Q8_0", (IM, H)),
        (b + "ffn_down_shexp.weight", "Q8_0", (H, IM)),
    ]


def _nbytes(tname: str, shape: tuple[int, ...]) -> int:
    info = GGML_TYPES_BY_NAME[tname]
    return int(np.prod(shape)) // info.block_size * info.type_size


def write_bench_gguf(path: Path, gib: float) -> None:
    """Stream a synthetic V4.1-named GGUF to ``path`` (never more than one chunk in memory)."""
    per_layer = sum(_nbytes(t, s) for _, t, s in _layer_tensors(0))
    n_layers = max(1, int(gib * 2**30 // per_layer))
    tensors = [("token_embd.weight", "Q8_0", (32768, H)), ("output_norm.weight", "F32", (H,)),
               ("output.weight", "Q8_0", (32768, H))]
    for i in range(n_layers):
        tensors += _layer_tensors(i)
    kv = {"general.architecture": "deepseek41", "deepseek41.block_count": n_layers}
    head = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(kv))
    for k, v in kv.items():
        kb = k.encode()
        head += struct.pack("<Q", len(kb)) + kb
        if isinstance(v, str):
            vb = v.encode()
            head += struct.pack("<IQ", 8, len(vb)) + vb
        else:
            head += struct.pack("<II", 4, v)
    off = 0
    for name, tname, shape in tensors:
        nb = name.encode()
        dims = tuple(reversed(shape))
        head += struct.pack("<Q", len(nb)) + nb + struct.pack("<I", len(dims)) + struct.pack(f"<{len(dims)}Q", *dims)
        head += struct.pack("<IQ", GGML_TYPES_BY_NAME[tname].id, off)
        off += -(-_nbytes(tname, shape) // 32) * 32
    head += b"\0" * ((-len(head)) % 32)
    rng = np.random.default_rng(0)
    pool = {}
    for tname in ("F32", "Q8_0", "MXFP4"):
        info = GGML_TYPES_BY_NAME[tname]
        nblk = (16 << 20) // info.type_size
        if tname == "F32":
            pool[tname] = rng.standard_normal(nblk).astype(np.float32).view(np.uint8)
            continue
        raw = rng.integers(0, 256, (nblk, info.type_size), dtype=np.uint8)
        if tname == "Q8_0":
            raw[:, 0:2] = np.full(nblk, 0.01, np.float16).view(np.uint8).reshape(nblk, 2)
        else:
            raw[:, 0] = rng.integers(115, 130, nblk, dtype=np.uint8)
        pool[tname] = raw.reshape(-1)
    tmp = path.with_suffix(".tmp")
    with open(tmp, "wb") as fh:
        fh.write(head)
        for _name, tname, shape in tensors:
            n = _nbytes(tname, shape)
            src = pool[tname]
            left = n
            while left:
                k = min(left, src.size)
                fh.write(src[:k].tobytes())
                left -= k
            fh.write(b"\0" * ((-n) % 32))
    tmp.replace(path)


def _status(key: str) -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    return 0


def sequential_read(path: Path, chunk: int = 16 << 20) -> tuple[int, float]:
    """Plain read of the whole file into one reused buffer: (bytes, seconds)."""
    buf = bytearray(chunk)
    mv = memoryview(buf)
    n = 0
    t0 = time.perf_counter()
    with open(path, "rb", buffering=0) as fh:
        while True:
            k = fh.readinto(mv)
            if not k:
                break
            n += k
    return n, time.perf_counter() - t0


def resident_bytes(path: Path) -> int:
    """Bytes of the file in the page cache now (mincore over a fresh read-only mapping)."""
    import ctypes
    import mmap

    size = path.stat().st_size
    page = mmap.PAGESIZE
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]
    with open(path, "rb") as fh:
        addr = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fh.fileno(), 0)
        if addr in (None, ctypes.c_void_p(-1).value):
            raise OSError(ctypes.get_errno(), f"mmap of {path} failed")
        try:
            vec = ctypes.create_string_buffer(-(-size // page))
            if libc.mincore(ctypes.c_void_p(addr), size, vec) != 0:
                raise OSError(ctypes.get_errno(), f"mincore of {path} failed")
            return sum(b & 1 for b in vec.raw) * page
        finally:
            libc.munmap(ctypes.c_void_p(addr), size)


def read_into_fresh(path: Path, chunk: int = 16 << 20) -> tuple[int, float]:
    """Read the whole file into newly allocated buffers that are all kept until the end: the cost of
    producing as many resident output bytes without any conversion (first-touch page faults
    included, which a loader cannot avoid and a plain read into one reused buffer does not pay)."""
    n = 0
    kept = []
    t0 = time.perf_counter()
    with open(path, "rb", buffering=0) as fh:
        while True:
            buf = np.empty(chunk, dtype=np.uint8)
            k = fh.readinto(memoryview(buf))
            if not k:
                break
            kept.append(buf)
            n += k
    dt = time.perf_counter() - t0
    del kept
    return n, dt


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gib", type=float, default=3.0)
    ap.add_argument("--path", default="/tmp/winport_bench_v41.gguf")
    ap.add_argument("--threads", default="1,2", help="conversion thread counts for the scaling table")
    ap.add_argument("--baseline", default=None, help="git revision whose conversion code to time as 'before'")
    ap.add_argument("--kernels-only", action="store_true", help="skip the full load; only the kernel tables")
    ap.add_argument("--reps", type=int, default=9, help="interleaved repetitions per cell")
    ap.add_argument("--cold", action="store_true",
                    help="drop the file's pages from the page cache before each read and before the load")
    args = ap.parse_args()
    threads = [int(x) for x in args.threads.split(",")]
    path = Path(args.path)
    from winport import envs

    # The kernel tables re-read the same tensors from a warm page cache; the server's loader drops
    # what it has copied into place (winport.gguf.reader), which would make their reps cold.
    envs.set_default(envs.WINPORT_GGUF_KEEP_PAGE_CACHE, "1")
    if not path.exists():
        t0 = time.perf_counter()
        write_bench_gguf(path, args.gib)
        print(f"wrote {path} ({path.stat().st_size / 2**30:.2f} GiB) in {time.perf_counter() - t0:.1f}s")
    size = path.stat().st_size
    cache = "cold" if args.cold else "warm"
    left = 0
    if args.cold:
        drop_file_page_cache(path)
        left = resident_bytes(path)
    else:
        sequential_read(path)  # warm the page cache
    nbytes, t_read = sequential_read(path)
    read_gbs = nbytes / t_read / 1e9
    if args.cold:
        drop_file_page_cache(path)
    nfresh, t_fresh = read_into_fresh(path)
    fresh_gbs = nfresh / t_fresh / 1e9
    if args.cold:
        drop_file_page_cache(path)

    import torch  # noqa: F401  (imported before the baseline so its RSS is not counted)

    from winport.gguf import load_gguf_model
    from winport.gguf.mxfp4_repack import conversion_threads

    lm = load_gguf_model(path, draft=False, mmproj=False)
    if args.kernels_only:
        print(f"machine: {platform.node()} {platform.machine()} cpus={os.cpu_count()} python={platform.python_version()} "
              f"numpy={np.__version__} torch={torch.__version__} loadavg={os.getloadavg()[0]:.2f}")
        print(f"sequential read (page cache): {read_gbs:.2f} GB/s")
        thread_scaling(lm, threads, args.baseline, args.reps)
        lm.close()
        return 0
    t_load, role_time, src_bytes, peak, final, largest = timed_load(lm)
    if args.cold:  # the same load without the loader's prefetch (GGUFTensor.prefetch), same run
        lm.close()
        drop_file_page_cache(path)
        from winport.gguf import reader as _reader

        prefetch = _reader.GGUFTensor.prefetch
        _reader.GGUFTensor.prefetch = lambda self: None  # type: ignore[method-assign]
        lm = load_gguf_model(path, draft=False, mmproj=False)
        t_nopf = timed_load(lm)[0]
        _reader.GGUFTensor.prefetch = prefetch  # type: ignore[method-assign]
    loaded_src = lm.total_bytes()
    if args.cold:
        drop_file_page_cache(path)
    nbytes2, t_read2 = sequential_read(path)  # again after the load: the machine is shared, show drift
    read2_gbs = nbytes2 / t_read2 / 1e9
    print(f"machine: {platform.node()} {platform.machine()} cpus={os.cpu_count()} python={platform.python_version()} "
          f"torch={torch.__version__} threads={conversion_threads()} loadavg={os.getloadavg()[0]:.2f}")
    print(f"file: {size / 1e9:.2f} GB, {len(lm.model)} tensors")
    print(f"page cache {cache}: " + (f"the file's pages dropped before each read and the load, "
          f"{left / 1e6:.0f} MB of it resident after the first drop" if args.cold else
          "the file read once before"))
    print(f"sequential read ({cache}): {read_gbs:.2f} GB/s before the load, {read2_gbs:.2f} GB/s after; "
          f"read into fresh kept buffers (first-touch faults, no conversion): {fresh_gbs:.2f} GB/s")
    print(f"load+convert all: {loaded_src / t_load / 1e9:.2f} GB/s of GGUF bytes ({t_load:.1f} s), "
          f"{loaded_src / t_load / 1e9 / read_gbs * 100:.0f}% of sequential read")
    if args.cold:
        print(f"  the same cold load without the loader's prefetch: {loaded_src / t_nopf / 1e9:.2f} GB/s "
              f"({t_nopf:.1f} s; prefetch {t_nopf / t_load:.2f}x)")
    for role, t in sorted(role_time.items()):
        gbs = src_bytes.get(role, 0) / max(t, 1e-9) / 1e9
        print(f"  {role:8s} {src_bytes.get(role, 0) / 1e9:6.2f} GB in {t:6.1f} s = {gbs:.2f} GB/s "
              f"({gbs / read_gbs * 100:.0f}% of sequential read)")
    print(f"peak RSS during load (above baseline): {peak / 1e9:.2f} GB; final resident weights {final / 1e9:.2f} GB; "
          f"largest tensor {largest / 1e6:.1f} MB; ratio {peak / (final + largest):.3f} (goal <= 1.2)")
    kernels_only(lm, read_gbs)
    thread_scaling(lm, threads, args.baseline, args.reps)
    lm.close()
    return 0


def timed_load(lm: object) -> tuple[float, dict[str, float], dict[str, int], int, int, int]:
    """Convert every weight of ``lm`` and keep it all: (seconds, seconds by role, GGUF bytes by role,
    peak RSS above the start, final resident bytes, largest output tensor's bytes)."""
    base_rss = _status("VmRSS")
    try:  # reset the peak-RSS counter (Linux >= 4.0)
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
    except OSError:
        pass
    kept: dict[str, object] = {}
    role_of = {m.target: m.role for m in lm.plan.mapped.values()}
    role_time: dict[str, float] = defaultdict(float)
    src_bytes = {m.role: 0 for m in lm.plan.mapped.values()}
    for g, m in lm.plan.mapped.items():
        src_bytes[m.role] += lm.model[g].nbytes
    largest = 0
    t0 = time.perf_counter()
    t_prev = t0
    for name, tensor in lm.weights(progress=False):
        now = time.perf_counter()
        base = name.rsplit(".", 1)[0]
        role = role_of.get(name) or role_of.get(base + ".weight") or ("experts" if ".experts." in name else "fp8")
        role_time[role] += now - t_prev
        kept[name] = tensor
        largest = max(largest, tensor.numel() * tensor.element_size())
        t_prev = time.perf_counter()
    t_load = time.perf_counter() - t0
    peak = _status("VmHWM") - base_rss
    final = sum(t.numel() * t.element_size() for t in kept.values())
    return t_load, role_time, src_bytes, peak, final, largest


def load_baseline(rev: str) -> tuple[object, object]:
    """(mxfp4_repack, convert) modules as of git revision ``rev``, importable next to the current ones.

    Their relative imports of the other winport.gguf modules resolve to the current files; the old
    convert is pointed at the old mxfp4_repack (its pool and work-item sizes are part of "before").
    """
    import subprocess
    import types

    root = Path(__file__).resolve().parents[2]
    mods = []
    for name in ("mxfp4_repack", "convert"):
        src = subprocess.check_output(["git", "-C", str(root), "show", f"{rev}:winport/gguf/{name}.py"], text=True)
        src = src.replace("from .mxfp4_repack import", "from ._baseline_mxfp4_repack import")
        src = src.replace("from . import mxfp4_repack\n", "from . import _baseline_mxfp4_repack as mxfp4_repack\n")
        full = f"winport.gguf._baseline_{name}"
        mod = types.ModuleType(full)
        mod.__package__ = "winport.gguf"
        mod.__file__ = str(root / "winport" / "gguf" / f"{name}.py")  # its data files are the current ones
        sys.modules[full] = mod
        exec(compile(src, f"{rev}:winport/gguf/{name}.py", "exec"), mod.__dict__)  # noqa: S102 - our own git history
        mods.append(mod)
    return mods[0], mods[1]


def _gil_free_reference(n_threads: int, data: bytes, per_thread: int) -> float:
    """sha256 over ``per_thread`` x len(data) bytes on each of n threads (hashlib drops the GIL): GB/s."""
    import hashlib
    import threading

    def work() -> None:
        for _ in range(per_thread):
            hashlib.sha256(data).digest()

    ts = [threading.Thread(target=work) for _ in range(n_threads)]
    t0 = time.perf_counter()
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return n_threads * per_thread * len(data) / (time.perf_counter() - t0) / 1e9


def thread_scaling(lm, threads: list[int], baseline: str | None, reps: int) -> None:  # noqa: ANN001
    """Per-kernel GB/s at each conversion thread count, current code (and ``baseline``), interleaved."""
    import torch

    from winport.gguf import convert as cv
    from winport.gguf import mxfp4_repack as rp

    impls = {"current": (rp, cv)}
    if baseline:
        impls = {f"baseline {baseline}": load_baseline(baseline), **impls}
    torch.set_num_threads(1)  # each conversion thread single-threaded: "1" means one core
    ts = [lm.model[g] for g, m in lm.plan.mapped.items()]
    ex = max((t for t in ts if t.type.name == "MXFP4"), key=lambda t: t.nbytes)
    q8s = [t for t in ts if t.type.name == "Q8_0" and len(t.shape) == 2 and "token_embd" not in t.name
           and t.name != "output.weight"][:6]
    emb = next(t for t in ts if t.type.name == "Q8_0" and t.name == "output.weight")
    e, n, k = ex.shape
    packed = np.ones((e, n, k // 2), dtype=np.uint8)
    scales = np.ones((e, n, k // 32), dtype=np.uint8)
    rows = ex.raw_rows()
    fp8_out = {}
    for t in q8s:
        r, c = t.shape
        bn, bk = lm.fp8_block
        fp8_out[t.name] = (torch.ones((r, c), dtype=torch.float8_e4m3fn),
                           torch.ones((-(-r // bn), -(-c // bk)), dtype=torch.float32))
    bf16_out = torch.ones(tuple(emb.shape), dtype=torch.bfloat16)

    def mxfp4_whole(mr, _cv) -> None:  # noqa: ANN001 - one call over the whole [E, N, K] tensor
        mr.gguf_mxfp4_into(ex.raw(), packed, scales)

    def mxfp4_experts(mr, _cv) -> None:  # noqa: ANN001 - as the loader calls it: expert by expert
        many = getattr(mr, "gguf_mxfp4_into_many", None)
        if many is None:  # the old loader: one pool call per expert
            for i in range(e):
                mr.gguf_mxfp4_into(rows[i * n : (i + 1) * n], packed[i], scales[i])
            return
        group = max(1, -(-2 * mr.conversion_threads() * _chunk(mr) // (n * k // 32)))
        for g0 in range(0, e, group):
            g1 = min(e, g0 + group)
            many([(rows[i * n : (i + 1) * n], packed[i], scales[i]) for i in range(g0, g1)])

    def q8_fp8(_mr, c) -> None:  # noqa: ANN001 - several dense Q8_0 tensors, as to_fp8_blocks runs each
        bn, bk = lm.fp8_block
        tile_cols = max(bk, (c._TILE_VALUES // bn) // bk * bk)
        for t in q8s:
            w, sc = fp8_out[t.name]
            c._fp8_rows_parallel(c._q8_0_rows(t, 0, t.shape[0]), w, sc, 0, t.shape[0], tile_cols,
                                 lm.fp8_block, lm.scale_fmt)

    def q8_bf16(_mr, c) -> None:  # noqa: ANN001
        c._bf16_rows_parallel(*c._q8_0_rows(emb, 0, emb.shape[0]), bf16_out, max(1, c._TILE_VALUES // emb.shape[1]))

    kernels = {
        f"MXFP4 -> kt repack, whole tensor ({ex.name}, {ex.nbytes / 1e6:.0f} MB)": (mxfp4_whole, ex.nbytes),
        f"MXFP4 -> kt repack, expert by expert ({e} x [{n}, {k}])": (mxfp4_experts, ex.nbytes),
        f"Q8_0 -> FP8 {list(lm.fp8_block)} ({len(q8s)} tensors, {sum(t.nbytes for t in q8s) / 1e6:.0f} MB)":
            (q8_fp8, sum(t.nbytes for t in q8s)),
        f"Q8_0 -> bf16 ({emb.name}, {emb.nbytes / 1e6:.0f} MB)": (q8_bf16, emb.nbytes),
    }
    data = os.urandom(4 << 20)
    samples: dict[tuple[str, str, int], list[float]] = defaultdict(list)
    env_prev = os.environ.get("WINPORT_GGUF_THREADS")
    try:
        for _ in range(reps):  # interleaved: drift from other processes hits every cell alike
            for nt in threads:
                samples[("GIL-free reference (sha256)", "", nt)].append(_gil_free_reference(nt, data, 4))
            for kname, (fn, nbytes) in kernels.items():
                for iname, (mr, c) in impls.items():
                    for nt in threads:
                        os.environ["WINPORT_GGUF_THREADS"] = str(nt)
                        t0 = time.perf_counter()
                        fn(mr, c)
                        samples[(kname, iname, nt)].append(nbytes / (time.perf_counter() - t0) / 1e9)
    finally:
        if env_prev is None:
            os.environ.pop("WINPORT_GGUF_THREADS", None)
        else:
            os.environ["WINPORT_GGUF_THREADS"] = env_prev
    # GB/s: best sample. Speedup: median over repetitions of (t threads / 1 thread) measured back to
    # back in the same repetition, so that a shared machine's load drift cancels out of the ratio.
    def cells(key: tuple[str, str]) -> tuple[list[str], dict[int, float]]:
        base = samples[(*key, threads[0])]
        sp = {nt: float(np.median([a / b for a, b in zip(samples[(*key, nt)], base, strict=True)])) for nt in threads}
        return [f"{nt}t {max(samples[(*key, nt)]):6.3f} ({sp[nt]:.2f}x" for nt in threads], sp

    print(f"thread scaling ({reps} interleaved repetitions; GB/s of GGUF bytes = best sample, x = median paired "
          f"speedup over {threads[0]} thread, eff = speedup / reference speedup; loadavg now {os.getloadavg()[0]:.2f}):")
    ref_cells, ref = cells(("GIL-free reference (sha256)", ""))
    print(f"  {'GIL-free reference (sha256)':40s} " + "  ".join(c + ")" for c in ref_cells))
    for kname in kernels:
        print(f"  {kname}")
        for iname in impls:
            cs, sp = cells((kname, iname))
            print(f"    {iname:18s} " + "  ".join(f"{c}, eff {sp[nt] / ref[nt]:.2f})" for c, nt in zip(cs, threads, strict=True)))
    serial_share(impls, lm, reps)


def serial_share(impls: dict, lm, reps: int) -> None:  # noqa: ANN001
    """Per work item: the fixed cost of its Python-level calls (timed on a tiny item, where it is all
    there is; an upper bound on the time the item holds the GIL) against the time of a default-size
    item on one thread. Their ratio is the serial share s, and 1 / (s + (1 - s) / 16) the most that
    16 threads could give (Amdahl): a machine-load-independent view of the GIL problem."""
    import torch

    torch.set_num_threads(1)

    def best_time(fn, inner: int) -> float:  # noqa: ANN001
        out = []
        for _ in range(max(3, reps)):
            t0 = time.perf_counter()
            for _ in range(inner):
                fn()
            out.append((time.perf_counter() - t0) / inner)
        return min(out)

    q8 = max((lm.model[g] for g, m in lm.plan.mapped.items() if lm.model[g].type.name == "Q8_0"
              and len(lm.model[g].shape) == 2 and lm.model[g].shape[1] >= 512), key=lambda t: t.shape[0])
    print("serial share per work item (fixed per-item cost / default item time, one thread; Amdahl bound at 16 threads):")
    for iname, (mr, c) in impls.items():
        _share_of(iname, mr, c, lm, q8, best_time)


def _share_of(iname: str, mr, c, lm, q8, best_time) -> None:  # noqa: ANN001
    """One implementation's serial-share lines (see serial_share)."""
    import torch

    def line(what: str, tiny: float, full: float) -> None:
        sh = tiny / full
        print(f"  {iname:18s} {what}: {tiny * 1e6:.1f} us fixed / {full * 1e6:.0f} us = {sh * 100:.1f}% "
              f"-> at most {1 / (sh + (1 - sh) / 16):.1f}x on 16 threads")

    m = _chunk(mr)
    raw = np.random.default_rng(0).integers(0, 256, m * 17 + 1, dtype=np.uint8)[1:]
    p = np.empty(m * 16, np.uint8)
    sc = np.empty(m, np.uint8)
    tiny = best_time(lambda: mr._repack_blocks(raw[: 16 * 17], p[: 16 * 16].view(np.uint64).reshape(16, 2), sc[:16]), 200)
    full = best_time(lambda: mr._repack_blocks(raw, p.view(np.uint64).reshape(m, 2), sc), 3)
    line(f"MXFP4 item of {m} blocks", tiny, full)
    bn, bk = lm.fp8_block
    cols = min(q8.shape[1], max(bk, (c._TILE_VALUES // bn) // bk * bk))
    tile_rows = bn * max(1, c._TILE_VALUES // (bn * cols))
    w = torch.empty((tile_rows, cols), dtype=torch.float8_e4m3fn)
    s_ = torch.empty((tile_rows // bn, cols // bk), dtype=torch.float32)
    src_t = tuple(x[:, : cols // 32] for x in c._q8_0_rows(q8, 0, tile_rows))
    src_1 = tuple(x[:, : bk // 32] for x in c._q8_0_rows(q8, 0, bn))
    w1 = torch.empty((bn, bk), dtype=torch.float8_e4m3fn)
    s1 = torch.empty((1, 1), dtype=torch.float32)
    os.environ["WINPORT_GGUF_THREADS"] = "1"
    try:
        tiny = best_time(lambda: c._fp8_rows_parallel(src_1, w1, s1, 0, bn, bk, lm.fp8_block, lm.scale_fmt), 50)
        full = best_time(lambda: c._fp8_rows_parallel(src_t, w, s_, 0, tile_rows, cols, lm.fp8_block, lm.scale_fmt), 3)
    finally:
        os.environ.pop("WINPORT_GGUF_THREADS", None)
    line(f"Q8_0 -> FP8 item of {tile_rows} x {cols} values", tiny, full)


def kernels_only(lm, read_gbs: float) -> None:  # noqa: ANN001
    """The conversion kernels alone: outputs preallocated and touched once, best of 3 (page faults
    of fresh output memory excluded, which on a VM can cost more than the conversion)."""
    import torch

    from winport.gguf import convert as cv
    from winport.gguf.mxfp4_repack import gguf_mxfp4_into

    ts = [lm.model[g] for g, m in lm.plan.mapped.items()]
    ex = max((t for t in ts if t.type.name == "MXFP4"), key=lambda t: t.nbytes)
    q8 = max((t for t in ts if t.type.name == "Q8_0" and len(t.shape) == 2 and "token_embd" not in t.name
              and t.name != "output.weight"), key=lambda t: t.nbytes)
    e, n, k = ex.shape
    packed = np.ones((e * n, k // 2), dtype=np.uint8)
    scales = np.ones((e * n, k // 32), dtype=np.uint8)

    def best(fn) -> float:  # noqa: ANN001
        times = []
        for _ in range(3):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        return min(times)

    # The slow references of tests/gguf/test_fast_convert.py (the loader's previous numpy code),
    # timed in the same run: a speedup ratio that the machine's load cannot skew much.
    from tests.gguf.test_fast_convert import ref_fp8_blocks, ref_mxfp4_to_kt, ref_q8_0_values

    t = best(lambda: gguf_mxfp4_into(ex.raw(), packed, scales))
    t_ref = best(lambda: ref_mxfp4_to_kt(ex.raw(), e * n, k))
    print(f"kernel only, MXFP4 -> kt repack ({ex.name}, {ex.nbytes / 1e6:.0f} MB): {ex.nbytes / t / 1e9:.2f} GB/s "
          f"({ex.nbytes / t / 1e9 / read_gbs * 100:.0f}% of sequential read); slow reference "
          f"{ex.nbytes / t_ref / 1e9:.2f} GB/s: {t_ref / t:.1f}x")
    rows, cols = q8.shape
    bn, bk = lm.fp8_block
    weight = torch.ones((rows, cols), dtype=torch.float8_e4m3fn)
    scale = torch.ones((-(-rows // bn), -(-cols // bk)), dtype=torch.float32)
    tile_cols = max(bk, (cv._TILE_VALUES // bn) // bk * bk)
    t = best(lambda: cv._fp8_rows_parallel(cv._q8_0_rows(q8, 0, rows), weight, scale, 0, rows, tile_cols,
                                           lm.fp8_block, lm.scale_fmt))
    t_ref = best(lambda: ref_fp8_blocks(ref_q8_0_values(q8.raw(), rows, cols), lm.fp8_block, lm.scale_fmt))
    print(f"kernel only, Q8_0 -> FP8 {list(lm.fp8_block)} blocks ({q8.name}, {q8.nbytes / 1e6:.0f} MB): "
          f"{q8.nbytes / t / 1e9:.2f} GB/s ({q8.nbytes / t / 1e9 / read_gbs * 100:.0f}% of sequential read); "
          f"slow reference {q8.nbytes / t_ref / 1e9:.2f} GB/s: {t_ref / t:.1f}x")


if __name__ == "__main__":
    raise SystemExit(main())
