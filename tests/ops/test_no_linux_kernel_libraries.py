"""Issue 4's wiring check: on the DeepSeek-V4 path, under WINPORT_EMULATE_WINDOWS=1, nothing but
winport's shims answers for FlashMLA, DeepGEMM, TileLang, sgl-kernel, FlashInfer and FA3, and no
SGLang CUDA JIT module is built.

A fresh interpreter imports SGLang's DeepSeek-V4 model, attention backend, indexer, compressor,
mHC, FP8 and fused-MoE modules and applies winport's patches, once as on a CPU machine and once
with torch reporting a CUDA GPU (so SGLang's `if _is_cuda:` import branches run too). Every module
of those libraries then in sys.modules must come from winport's shims/ folder, and SGLang's
`load_jit` (nvcc through tvm_ffi at run time) must not have been called.
"""

from __future__ import annotations

import json

import pytest

from tests.helpers import FAKE_SM90_CUDA, REPO_ROOT, SGLANG_ON_WINPORT_ENV, run_python
from winport import linux_only

# The kernel libraries winport shims (uvloop, the other shimmed package, is no kernel library).
LIBRARIES = tuple(sorted(set(linux_only.SHIMMED_PACKAGES) - {"uvloop"}))

_PROBE = """
import importlib, json, sys
from winport.importhooks import on_import
jit_calls = []
def _spy(loader):
    real = loader.load_jit
    def load_jit(*args, **kwargs):
        jit_calls.append(args[0] if args else "?")
        return real(*args, **kwargs)
    loader.load_jit = load_jit
on_import("sglang.kernels.jit.utils.compile.loader", _spy)
for name in (
    "sglang.srt.entrypoints.engine",
    "sglang.srt.models.deepseek_v4", "sglang.srt.models.deepseek_v4_mhc",
    "sglang.srt.layers.attention.deepseek_v4_backend", "sglang.srt.layers.attention.dsv4.metadata",
    "sglang.srt.layers.attention.dsv4.indexer", "sglang.kernels.ops.attention.dsv4.compress",
    "sglang.srt.layers.quantization.fp8", "sglang.srt.layers.quantization.fp8_utils",
    "sglang.srt.layers.moe.moe_runner.triton_utils.fused_moe", "sglang.srt.layers.sampler",
    # What DeepseekV4AttnBackend.__init__ imports on CUDA (FlashMLA's decode entry point).
    "sglang.kernels.ops.attention.flash_mla_interface",
):
    importlib.import_module(name)
from winport import patches
patches.register_all()
libs = %r
mods = {k: getattr(v, "__file__", None) for k, v in list(sys.modules.items())
        if v is not None and k.split(".")[0] in libs}
print("RESULT " + json.dumps({"modules": mods, "jit": jit_calls}))
"""


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_dsv4_path_uses_only_winport_shims(device: str) -> None:
    code = (FAKE_SM90_CUDA if device == "cuda" else "") + _PROBE % (LIBRARIES,)
    env = SGLANG_ON_WINPORT_ENV
    proc = run_python(code, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT "))
    result = json.loads(line[len("RESULT "):])
    mods: dict[str, str | None] = result["modules"]
    # The path must actually reach these libraries, or the check below proves nothing.
    # (DeepGEMM is imported at module level on CUDA only; on CPU at run time, if at all.)
    reached = {"sgl_kernel", "flash_mla"} | ({"deep_gemm"} if device == "cuda" else set())
    assert reached <= {m.split(".")[0] for m in mods}, sorted(mods)
    shims = str(REPO_ROOT / "shims")
    foreign = {m: f for m, f in mods.items() if f is not None and not f.startswith(shims)}
    assert not foreign, f"modules not served by winport's shims: {foreign}"
    assert result["jit"] == [], f"SGLang CUDA JIT modules requested: {result['jit']}"
