"""Keeps tests/ops/README.md honest: every sgl_kernel / flashinfer / flash_attn_interface name that
SGLang's DeepSeek-V4 path imports either resolves in winport's shim (checked in a fresh interpreter
under WINPORT_EMULATE_WINDOWS=1, where the shims are what `import sgl_kernel` gives) or is listed
below with the reason it has no shim here. Names are parsed with ast from the installed SGLang files:
`from lib import name`, LazyImport("lib.mod", "name") and kernel-registry targets "lib:name"."""

from __future__ import annotations

import json
from pathlib import Path

from tests.helpers import run_python

DSV4_PATH_FILES = [
    "srt/models/deepseek_v4.py", "srt/models/deepseek_v4_mhc.py", "srt/models/deepseek_v4_dspark.py",
    "srt/layers/layernorm.py", "srt/layers/activation.py", "srt/layers/moe/topk.py", "srt/layers/moe/hash_topk.py",
    "srt/layers/moe/moe_runner/triton_utils/fused_moe.py", "srt/layers/sampler.py",
    "srt/constrained/xgrammar_backend.py", "srt/layers/attention/merge_state.py", "srt/layers/quantization/gguf.py",
    "srt/layers/attention/vision.py", "srt/layers/attention/deepseek_v4_backend.py",
    "srt/layers/rotary_embedding/base.py", "srt/mem_cache/allocation.py", "kernels/ops/activation/__init__.py",
    "kernels/ops/sampling/renorm.py", "kernels/ops/moe/__init__.py", "kernels/ops/speculative/cache_locs.py",
    "kernels/ops/speculative/eagle.py", "kernels/ops/speculative/spec_tree.py", "kernels/ops/kvcache/cache_move.py",
    "kernels/ops/speculative/dspark/dspark_accept.py", "kernels/ops/attention/flash_attention_v3.py",
    "kernels/ops/quantization/fp8_kernel.py",
]

ISSUE4 = "DeepSeek-V4 kernel owned by issue 4 (sparse MLA / mHC)"
NOT_REACHED = "imported only under an XPU/HIP/MUSA/AMX branch; CUDA and CPU take SGLang's own path"
OPTIONAL = "optional probe (try/except): its absence selects SGLang's own implementation, so no shim"
EXEMPT: dict[str, str] = {
    **dict.fromkeys(["sgl_kernel.fused_hc_head", "sgl_kernel.hc_post", "sgl_kernel.hc_split_sinkhorn",
                     "sgl_kernel.mhc_fused_post_pre", "sgl_kernel.mhc_pre", "sgl_kernel.flash_mla_sparse_fwd",
                     "sgl_kernel.flash_mla_with_kvcache", "flashinfer.mhc.mhc_pre_big_fuse",
                     "flashinfer.mhc.mhc_post"], ISSUE4),
    **dict.fromkeys(["sgl_kernel.gelu_quick", "sgl_kernel.hash_topk", "sgl_kernel.fused_experts",
                     "sgl_kernel.rotary_embedding", "sgl_kernel.fused_qk_rope_with_cos_sin_cache_inplace",
                     "sgl_kernel.build_tree_kernel_efficient", "sgl_kernel.verify_tree_greedy"], NOT_REACHED),
    **dict.fromkeys(["flashinfer.norm.fused_add_rmsnorm_quant", "flashinfer.norm.rmsnorm_quant",
                     "flashinfer.fused_moe.fused_topk_deepseek"], OPTIONAL),
    "flashinfer.prefill.cudnn_batch_prefill_with_kv_cache":
        "vision backend 'flashinfer_cudnn' only (opt-in); the default vision path is FA3 (shimmed)",
}

_PROBE = r'''
import ast, importlib, importlib.util, json, os, sys
# Locate SGLang without executing it (`import sglang` needs winport's patches under emulated Windows).
root = list(importlib.util.find_spec("sglang").submodule_search_locations)[0]
libs = ("sgl_kernel", "flashinfer", "flash_attn_interface")
found = {}
for rel in json.loads(sys.argv[1]) if len(sys.argv) > 1 else FILES:
    tree = ast.parse(open(os.path.join(root, rel)).read())
    for n in ast.walk(tree):
        names = []
        if isinstance(n, ast.ImportFrom) and n.module and n.module.split(".")[0] in libs:
            names = [(n.module, a.name) for a in n.names]
        elif isinstance(n, ast.Call) and getattr(n.func, "id", "") == "LazyImport" and len(n.args) == 2:
            a, b = n.args
            if isinstance(a, ast.Constant) and str(a.value).split(".")[0] in libs:
                names = [(a.value, b.value)]
        elif isinstance(n, ast.Constant) and isinstance(n.value, str) and n.value.split(":")[0] in libs \
                and n.value.count(":") == 1:
            names = [tuple(n.value.split(":"))]
        for mod, name in names:
            try:
                ok = hasattr(importlib.import_module(mod), name)
            except ImportError:
                ok = False
            found[f"{mod}.{name}"] = ok
print("RESULT" + json.dumps(found))
'''


def _probe() -> dict[str, bool]:
    code = "FILES = " + json.dumps(DSV4_PATH_FILES) + "\n" + _PROBE
    res = run_python(code, env={"WINPORT_EMULATE_WINDOWS": "1", "WINPORT_SHIMS": "force"}, timeout=240)
    assert res.returncode == 0, res.stderr[-3000:]
    line = [ln for ln in res.stdout.splitlines() if ln.startswith("RESULT")][-1]
    return json.loads(line[len("RESULT"):])


def test_every_dsv4_path_name_has_a_shim_or_a_reason() -> None:
    found = _probe()
    assert len(found) > 30, found  # the scan really saw SGLang's imports
    missing = sorted(n for n, ok in found.items() if not ok and n not in EXEMPT)
    assert not missing, f"names SGLang's DeepSeek-V4 path imports with no shim and no listed reason: {missing}"
    exposed_optional = sorted(n for n, ok in found.items() if ok and EXEMPT.get(n) == OPTIONAL)
    assert not exposed_optional, f"optional probes must stay missing (they change SGLang's behaviour): {exposed_optional}"
    readme = (Path(__file__).parent / "README.md").read_text()
    unlisted = sorted(n for n, ok in found.items()
                      if ok and EXEMPT.get(n) != ISSUE4 and f"`{n.split('.')[-1]}`" not in readme)
    assert not unlisted, f"shimmed names missing from tests/ops/README.md: {unlisted}"
