"""winport.patches.fused_op_without_jit: no SGLang fused op auto-selects its nvcc-compiled backend.

Checked in a fresh interpreter with SGLang's platform detection reporting CUDA, so the ops resolve as
they would on a GPU; before the patch clamp_position (the op that reached the JIT compiler on the
H200) resolves to forward_jit, which makes the test able to fail.
"""

from __future__ import annotations

from tests.helpers import run_python

_PROBE = r"""
import importlib, pkgutil, sys
import torch
import sglang.srt.utils as su
import sglang.srt.utils.common as suc
for mod in (su, suc):
    if hasattr(mod, "is_cuda"):
        mod.is_cuda = lambda: True
from sglang.kernels import fused_op
from sglang.kernels.spec import KernelBackend, PlatformInfo
fused_op._platform = lambda: PlatformInfo(device_type="cuda", cuda_arch_major=12, cuda_arch_minor=0)
fused_op._platform_key.cache_clear(); fused_op._oot_dispatch_key = lambda: None
import sglang.kernels.ops as ops_pkg
for info in pkgutil.walk_packages(ops_pkg.__path__, ops_pkg.__name__ + "."):
    try:
        importlib.import_module(info.name)
    except Exception:
        pass  # modules needing CUDA-only libraries at import time are not on our path
from sglang.kernels.ops.attention.clamp_position import _CLAMP_POSITION
def jit_ops():
    seen = []
    stack = [fused_op.BaseFusedOp]
    while stack:
        cls = stack.pop(); stack.extend(cls.__subclasses__())
        if cls.__dict__.get("forward_jit") is None or getattr(cls, "__abstractmethods__", None):
            continue
        op = cls.__new__(cls); torch.nn.Module.__init__(op)
        if KernelBackend.JIT in op._auto_backend_candidates():
            seen.append(cls.__name__)
    return sorted(seen)
before = jit_ops()
print("BEFORE", before, _CLAMP_POSITION._resolve_forward_method().__name__)
if sys.argv[-1] == "patch":
    from winport.patches import fused_op_without_jit
    fused_op_without_jit.register_patch()
    fused_op_without_jit.register_patch()  # idempotent
print("AFTER", jit_ops(), _CLAMP_POSITION._resolve_forward_method().__name__)
seq = torch.tensor([0, 1, 7, 4096], dtype=torch.int32)
if sys.argv[-1] == "patch":  # unpatched, this would start nvcc
    print("POS", _CLAMP_POSITION._resolve_forward_method()(seq).tolist())
"""


def _run(arg: str) -> dict[str, str]:
    proc = run_python(_PROBE.replace('sys.argv[-1] == "patch"', repr(arg) + ' == "patch"'))
    assert proc.returncode == 0, proc.stderr[-3000:]
    return {line.split(" ", 1)[0]: line.split(" ", 1)[1] for line in proc.stdout.splitlines() if " " in line}


def test_without_the_patch_clamp_position_would_compile_cuda() -> None:
    res = _run("none")
    assert "ClampPositionOp" in res["BEFORE"] and res["AFTER"].endswith("forward_jit")


def test_with_the_patch_no_fused_op_selects_jit() -> None:
    res = _run("patch")
    assert "ClampPositionOp" in res["BEFORE"]
    assert res["AFTER"] == "[] forward_native", res
    assert res["POS"] == "[0, 0, 6, 4095]"
