"""Each winport patch to SGLang: it applies to the installed SGLang, does what it says, and refuses
to apply blindly when the upstream code it targets has changed."""

from __future__ import annotations

import dataclasses
import signal
import types

import pytest

from tests.helpers import run_python
from winport import patches
from winport.patches import _base


def test_every_patch_matches_the_installed_sglang() -> None:
    # register_patch() checks each upstream fingerprint first; a changed SGLang stops here. In a
    # fresh interpreter, because the patches change module state for the rest of the process.
    proc = run_python("from winport import patches; patches.register_all(); print('applied', len(patches.PATCHES))")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip() == f"applied {len(patches.PATCHES)}"


def test_require_source_fails_loudly_on_changed_upstream() -> None:
    with pytest.raises(_base.UpstreamChangedError, match="changed upstream"):
        _base.require_source("sglang.srt.utils.common.parse_lscpu_topology", "this text is not there")
    with pytest.raises(_base.UpstreamChangedError, match="no longer exists"):
        _base.require_source("sglang.srt.utils.common.no_such_function_anywhere")


def test_register_all_turns_a_changed_upstream_into_exit(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken() -> None:
        raise _base.UpstreamChangedError("fake change")

    fake = types.ModuleType("winport.patches.fake_broken")
    fake.register_patch = broken  # type: ignore[attr-defined]
    monkeypatch.setitem(__import__("sys").modules, "winport.patches.fake_broken", fake)
    monkeypatch.setattr(patches, "PATCHES", ("fake_broken",))
    with pytest.raises(SystemExit, match="winport patch 'fake_broken' cannot be applied: fake change"):
        patches.register_all()


def test_zmq_endpoints_become_loopback_tcp() -> None:
    from winport.patches.zmq_tcp_endpoints import tcp_instead_of_ipc

    @dataclasses.dataclass
    class FakePortArgs:
        tokenizer_ipc_name: str
        scheduler_input_ipc_name: str
        detokenizer_ipc_name: str
        rpc_ipc_name: str
        metrics_ipc_name: str
        tokenizer_worker_ipc_name: str | None
        nccl_port: int

    args = FakePortArgs("ipc:///tmp/a", "ipc:///tmp/b", "ipc:///tmp/c", "ipc:///tmp/d", "ipc:///tmp/e", None, 5)
    out = tcp_instead_of_ipc(args)
    names = [out.tokenizer_ipc_name, out.scheduler_input_ipc_name, out.detokenizer_ipc_name,
             out.rpc_ipc_name, out.metrics_ipc_name]
    assert all(n.startswith("tcp://127.0.0.1:") for n in names)
    assert len(set(names)) == 5 and out.tokenizer_worker_ipc_name is None and out.nccl_port == 5
    already = FakePortArgs(*(["tcp://127.0.0.1:1"] * 5), None, 5)
    assert tcp_instead_of_ipc(already) is already


def test_sigquit_becomes_sigterm_only_where_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    from winport.patches import windows_signals

    assert windows_signals.apply() is False  # Linux has SIGQUIT: untouched
    monkeypatch.delattr(signal, "SIGQUIT")
    assert windows_signals.apply() is True
    assert signal.SIGQUIT == signal.SIGTERM


def test_topology_without_lscpu(monkeypatch: pytest.MonkeyPatch) -> None:
    import psutil

    from winport.patches import cpu_topology_without_lscpu as topo

    rows = topo.topology_from_psutil()
    assert [r[0] for r in rows] == list(range(psutil.cpu_count(logical=True)))
    assert {r[3] for r in rows} == {0}
    monkeypatch.setattr(topo.shutil, "which", lambda name: None)
    assert topo._parse(lambda: pytest.fail("lscpu must not run")) == rows
    monkeypatch.setattr(topo.shutil, "which", lambda name: "/usr/bin/lscpu")
    assert topo._parse(lambda: "upstream") == "upstream"


def test_chat_template_replaces_the_recipe_only_when_it_is_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    from winport.patches import chat_template_without_recipe as chat

    with_template = types.SimpleNamespace(chat_template="{{ x }}")
    without = types.SimpleNamespace(chat_template=None)
    monkeypatch.setattr(chat, "recipe_available", lambda: False)
    assert chat._resolve(lambda **kw: "dsv4", tokenizer=with_template) is None
    assert chat._resolve(lambda **kw: "dsv32", tokenizer=with_template) == "dsv32"
    with pytest.raises(RuntimeError, match="deepseek-recipe package .* or a chat template"):
        chat._resolve(lambda **kw: "dsv41", tokenizer=without)
    monkeypatch.setattr(chat, "recipe_available", lambda: True)
    assert chat._resolve(lambda **kw: "dsv4", tokenizer=with_template) == "dsv4"


def test_pin_memory_is_a_no_op_without_cuda() -> None:
    import torch

    from winport.patches import cpu_pin_memory

    if torch.cuda.is_available():
        pytest.skip("only meaningful without CUDA")
    assert cpu_pin_memory.apply() is True
    t = torch.empty(4, pin_memory=True)
    assert t.shape == (4,) and not t.is_pinned()
    assert torch.zeros(2, pin_memory=True).pin_memory() is not None


def test_dsv4_modules_take_the_xpu_route_with_shim_functions() -> None:
    code = (
        "import sglang.kernels.ops.attention.dsv4.compress as c, sglang.kernels.ops.attention.dsv4.topk as t\n"
        "import sglang.srt.models.deepseek_v4 as m\n"
        "assert m._is_xpu is False and c._is_xpu is False\n"
        "from winport.patches import dsv4_generic_device; dsv4_generic_device.apply()\n"
        "print(m._is_xpu, c._is_xpu, t.is_xpu(), c.plan_compress_prefill.__qualname__, sorted(c._XPU_COMPRESS_FNS))\n"
    )
    proc = run_python(code)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split("\n")[-2] == "True True True sgl_kernel.plan_compress_prefill [4, 128]"


def test_fp8_kv_check_is_relaxed_for_deepseek_v4_only() -> None:
    from sglang.srt.mem_cache import kv_cache_configurator as mod

    from winport.patches.cpu_dsv4_fp8_kv import _configure

    seen = {}

    def original(self):  # type: ignore[no-untyped-def]
        seen["amx"] = mod.cpu_has_amx_support()
        seen["backends"] = list(mod.attention_backends())
        return "configured"

    class DeepseekV4ForCausalLM:  # the class name is what the patch checks
        pass

    dsv4 = types.SimpleNamespace(model=DeepseekV4ForCausalLM())
    assert _configure(original, dsv4) == "configured"
    assert seen == {"amx": True, "backends": ["intel_amx"]}
    assert mod.cpu_has_amx_support.__name__ != "<lambda>"  # restored after the call


def test_windows_compat_fills_what_windows_lacks() -> None:
    from winport.platform import windows_compat

    fake_mmap = types.ModuleType("mmap")
    env: dict[str, str] = {}
    changed = windows_compat.apply(fake_mmap, env)
    assert fake_mmap.PROT_READ == 1 and fake_mmap.MAP_SHARED == 1  # type: ignore[attr-defined]
    assert env["SGLANG_DISAGGREGATION_ZMQ_MAX_SOCKETS"] == "8192"
    assert "mmap.PROT_READ" in changed
    env2 = {"SGLANG_DISAGGREGATION_ZMQ_MAX_SOCKETS": "4096"}
    windows_compat.apply(fake_mmap, env2)
    assert env2["SGLANG_DISAGGREGATION_ZMQ_MAX_SOCKETS"] == "4096"  # a user's choice is kept


def _demo_model_config(tmp_path):  # type: ignore[no-untyped-def]
    import json

    from sglang.srt.configs.model_config import ModelConfig

    from winport.demo.config import demo_config

    (tmp_path / "config.json").write_text(json.dumps(demo_config("v4")))
    return ModelConfig(str(tmp_path), trust_remote_code=True)


def test_cpu_tp_keeps_deepseek_v4_single_kv_head(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from sglang.srt.configs.load_config import LoadConfig
    from sglang.srt.configs.update_config import adjust_config_with_unaligned_cpu_tp as upstream

    from winport.patches.cpu_tp_dsv4_single_kv_head import adjust

    # Upstream alone pads the single KV head to 2 and doubles the query heads (the bug).
    padded = upstream(_demo_model_config(tmp_path), LoadConfig(), 2)
    assert (padded.hf_config.num_key_value_heads, padded.num_attention_heads) == (2, 16)
    fixed = adjust(upstream, _demo_model_config(tmp_path), LoadConfig(), 2)
    for cfg in (fixed, fixed.hf_config, fixed.hf_text_config):
        assert (cfg.num_key_value_heads, cfg.num_attention_heads) == (1, 8)
    assert fixed.hf_config.original_num_attention_heads == 8  # the rest of upstream's work is kept
    with pytest.raises(ValueError, match=r"--tp 3: num_attention_heads=8 and o_groups=2"):
        adjust(upstream, _demo_model_config(tmp_path), LoadConfig(), 3)
    other = types.SimpleNamespace(hf_config=types.SimpleNamespace(model_type="llama", architectures=["LlamaForCausalLM"]))
    assert adjust(lambda mc, lc, tp: ("upstream", mc, tp), other, None, 2) == ("upstream", other, 2)


def test_cpu_embedding_mask_runs_eagerly_with_the_same_result() -> None:
    import torch
    from sglang.srt.layers import vocab_parallel_embedding as vpe

    from winport.patches.cpu_tp_embedding_eager import _masked, eager_of

    compiled = vpe.get_masked_input_and_mask
    assert eager_of(compiled) is not compiled
    calls = []

    def original(*args):  # type: ignore[no-untyped-def]
        calls.append(args)  # the compiled function: must not run for CPU tensors
        raise AssertionError("compiled path taken on CPU")

    original._torchdynamo_orig_callable = eager_of(compiled)  # type: ignore[attr-defined]
    ids = torch.randint(0, 1024, (37,), generator=torch.Generator().manual_seed(7))
    # Rank 1 of 2 over a 1024-token vocabulary, no added tokens: ids 512..1023 are local.
    masked, mask = _masked(original, ids, 512, 1024, 0, 1024, 1024)
    assert not calls
    local = (ids >= 512) & (ids < 1024)
    assert torch.equal(mask, ~local)
    assert torch.equal(masked, torch.where(local, ids - 512, torch.zeros_like(ids)))
    with pytest.raises(_base.UpstreamChangedError, match="torch.compile wrapper"):
        eager_of(lambda x: x)


ROPE_CHECK = r"""
import torch
from sglang.kernels.ops.attention.dsv4 import rope as R
from winport.patches.cpu_dsv4_rope_torch import rotary_gptj_inplace
g = torch.Generator().manual_seed(20261129)
freqs = R.precompute_freqs_cis(64, 4096, 4096, 10000.0, 2.0, 32, 1)
for shape, dtype in [((5, 3, 512), torch.float32), ((6, 576), torch.float32), ((5, 3, 512), torch.bfloat16)]:
    for inverse in (False, True):
        for use_pos in (True, False):
            parent = (torch.randn(*shape, generator=g) * 4).to(dtype)
            pos = torch.randint(0, 4096, (shape[0],), generator=g) if use_pos else None
            table = freqs if use_pos else freqs[torch.randint(0, 4096, (shape[0],), generator=g)]
            kernel, ours = parent.clone(), parent.clone()
            R.apply_rotary_emb_triton(kernel[..., -64:], table, positions=pos, inverse=inverse)
            rotary_gptj_inplace(ours[..., -64:], table, pos, inverse)
            assert torch.equal(ours[..., :-64], parent[..., :-64]), "wrote outside the rope slice"
            assert not torch.equal(ours[..., -64:], parent[..., -64:]), "rotation did nothing"
            assert not ours.isnan().any()
            if dtype == torch.float32:
                assert torch.equal(kernel, ours), (shape, inverse, use_pos)
            else:
                # The kernel computes in fp32 and stores to bf16. Triton's interpreter truncates that
                # store (round toward zero) where compiled Triton rounds to nearest even, as torch
                # does: compare with the fp32 kernel result rounded both ways.
                exact = parent.float()
                R.apply_rotary_emb_triton(exact[..., -64:], table, positions=pos, inverse=inverse)
                assert torch.equal(ours, exact.to(torch.bfloat16)), (shape, inverse, use_pos)
                toward_zero = (exact.view(torch.int32) & -65536).view(torch.float32).to(torch.bfloat16)
                assert torch.equal(kernel, toward_zero), (shape, inverse, use_pos)
print("rope ok")
"""


def test_cpu_rope_matches_the_triton_kernel_under_the_interpreter() -> None:
    proc = run_python(ROPE_CHECK, env={"TRITON_INTERPRET": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().endswith("rope ok")


def test_cpu_tp_rank_binding_parses_and_pins(monkeypatch: pytest.MonkeyPatch) -> None:
    from winport.patches import cpu_tp_thread_binding as tb

    assert tb.parse_cpus("0-3,8, 10-11") == [0, 1, 2, 3, 8, 10, 11]
    assert tb.parse_cpus([4, 5]) == [4, 5]
    for bad in ("a-b", "3-1"):
        with pytest.raises(ValueError, match="SGLANG_CPU_OMP_THREADS_BIND"):
            tb.parse_cpus(bad)
    # Upstream binds itself on AMX/arm64 CPUs, and nothing is bound when no binding was asked for.
    from sglang.srt.distributed import bootstrap

    calls: list[object] = []
    monkeypatch.setenv("SGLANG_CPU_OMP_THREADS_BIND", "0-0|1-1")
    monkeypatch.setattr(bootstrap, "_is_cpu_amx_available", True)
    tb._init(lambda **kw: calls.append(kw), local_omp_cpuid="0-0", dist_init_method="tcp://x")
    assert calls == [{"local_omp_cpuid": "0-0", "dist_init_method": "tcp://x"}]
    monkeypatch.setattr(bootstrap, "_is_cpu_amx_available", False)
    monkeypatch.setattr(bootstrap, "_is_cpu_arm64", False)
    monkeypatch.delenv("SGLANG_CPU_OMP_THREADS_BIND")
    tb._init(lambda **kw: calls.append(kw), local_omp_cpuid="0-0")
    assert len(calls) == 2
    # Pinning really happens (in a fresh interpreter: it changes the process's affinity).
    code = ("import os, psutil, torch\n"
            "from winport.patches.cpu_tp_thread_binding import _init\n"
            "_init(lambda **kw: 1/0, local_omp_cpuid='0-0')\n"
            "print(psutil.Process().cpu_affinity(), torch.get_num_threads())\n")
    proc = run_python(code, env={"SGLANG_CPU_OMP_THREADS_BIND": "0-0|1-1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().splitlines()[-1] == "[0] 1"


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
