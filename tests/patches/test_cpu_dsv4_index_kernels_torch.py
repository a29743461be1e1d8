"""winport.patches.cpu_dsv4_index_kernels_torch: DeepSeek-V4's index kernels in torch, against SGLang's
Triton kernels under the interpreter."""

from __future__ import annotations

from tests.helpers import run_python

INDEX_KERNELS_CHECK = r"""
import torch
from sglang.kernels.ops.attention.dsv4 import metadata_kernel as M, sparse_prefill_kernels as S, dequant_k_cache as D
from winport.patches import cpu_dsv4_index_kernels_torch as P
g = torch.Generator().manual_seed(1129)
def ri(lo, hi, shape, dtype=torch.int32):
    return torch.randint(lo, hi, shape, generator=g).to(dtype)

def metadata_cases():
    for bs, w, pos_dtype, page in ((5, 5, torch.int64, True), (7, 4, torch.int32, True), (3, 3, torch.int64, False)):
        seq = ri(1, 2000, (bs,)); seq[0] = 128; seq[1] = 4  # exact multiples compress
        pos = (seq - 1).to(pos_dtype)
        raw = ri(0, 100000, (w,), torch.int64)
        table = ri(0, 500, (bs, 9))
        yield (seq, pos, raw, table if page else None, 256 if page else 0, page)

def combine_cases():
    for topk, W, ratio, explicit, pad in ((16, 8, 4, False, 3), (16, 8, 4, True, 0), (0, 8, 4, False, 2), (24, 8, 128, False, 0)):
        R = 3
        ext = ri(1, 9, (R,)); prior = ri(0, 300, (R,))
        seq = ext + prior
        base = 5
        qsl = torch.cat([torch.zeros(1, dtype=torch.int32), ext.cumsum(0).int()]) + base
        pos = torch.cat([torch.arange(int(p), int(s)) for p, s in zip(prior, seq)]).int()
        T = int(ext.sum()) + pad
        pos = torch.cat([pos, torch.zeros(pad, dtype=torch.int32)])
        gl = torch.minimum(seq, ext + W - 1).int()
        cb = ri(0, 1000, (R,)); sb = ri(0, 1000, (R,))
        width = max(topk, 1) + 3
        tk = ri(-1, 60, (T, width))
        tk[tk % 7 == 0] = -1
        swa_i = ri(-1, 50, (T, W)) if explicit else None
        swa_l = ri(0, W + 1, (T,)) if explicit else None
        yield dict(topk_indices=tk, query_start_loc=qsl, query_pos=pos, seq_lens=seq.int(), gather_lens=gl,
                   compressed_base=cb, swa_base=sb, window_size=W, compress_ratio=ratio, topk=topk,
                   swa_indices=swa_i, swa_lengths=swa_l)

def swa_cases():
    R = 4
    seq = ri(1, 400, (R,)); ext = torch.minimum(seq, ri(1, 50, (R,)))
    rpi = torch.randperm(6, generator=g)[:R].int()
    r2t = ri(0, 5000, (6, 512))
    f2s = torch.randint(0, 3000, (5001,), generator=g)
    gl = torch.minimum(seq, ext + 127)
    yield (seq.int(), ext.int(), rpi, r2t, f2s, 128, int(gl.sum()))

def dequant_cases():
    page, pages = 16, 5
    per_page = -(-(page * 584) // 576) * 576
    cache = torch.randint(0, 256, (pages, per_page), generator=g, dtype=torch.uint8)
    cache[(cache & 0x7F) == 0x7F] = 0  # no e4m3 NaN codes: outputs compare exactly
    for p_ in range(pages):
        cache[p_, page * 576: page * 584] = torch.randint(100, 150, (page * 8,), generator=g, dtype=torch.uint8)
    ids = torch.randint(0, pages * page, (11,), generator=g)
    yield cache, ids, page

def run_all():
    out = []
    for c in metadata_cases():
        out.append(M._init_compressed_attn_metadata_triton(*c))
    for c in combine_cases():
        T = c["topk_indices"].shape[0]
        width = S.combined_topk_width(c["topk"], c["window_size"])
        poison = torch.full((T, width), 777, dtype=torch.int32)
        out.append(S.combine_topk_swa_indices(**c, out_indices=poison, out_lens=torch.full((T,), 777, dtype=torch.int32)))
    for c in swa_cases():
        out.append(S.build_swa_token_ids(*c))
    for cache, ids, page in dequant_cases():
        for id_dtype in (torch.int64, torch.int32):
            work = torch.full((ids.numel(), 2, 512), 777.0, dtype=torch.bfloat16)
            D.dequantize_k_cache_paged_dsv4(cache, ids.to(id_dtype), page, out=work[:, :1])
            out.append((work[:, 0].view(torch.int16), work[:, 1]))
    return out

state = g.get_state()
kernel = run_all()
g.set_state(state)
P.apply()
assert isinstance(S._combine_topk_swa_indices_kernel, P.CpuLauncher)
ours = run_all()
n = 0
for a, b in zip(kernel, ours, strict=True):
    for x, y in zip(a, b, strict=True):
        if x is None and y is None: continue
        assert x.dtype == y.dtype and x.shape == y.shape, (x.dtype, y.dtype, x.shape, y.shape)
        assert torch.equal(x, y), (n, x, y)
        if y.dtype != torch.bfloat16:
            assert not (y == 777).any()
        n += 1
print("index kernels ok", n)
"""


def test_cpu_index_kernels_match_the_triton_kernels_under_the_interpreter() -> None:
    # Upstream's wrappers run twice on the same random inputs (metadata with and without page
    # indices, combine with implicit/explicit SWA, SWA-only and padding rows, SWA token ids, FP8 K
    # cache dequantization into a strided, poisoned workspace):
    # first launching the Triton kernels in the interpreter, then through the torch launchers.
    proc = run_python(INDEX_KERNELS_CHECK, env={"TRITON_INTERPRET": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().splitlines()[-1] == "index kernels ok 42"
