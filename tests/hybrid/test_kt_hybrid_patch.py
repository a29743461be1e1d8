"""winport.patches.kt_hybrid_moe and the serve-side plan: upstream checks, what is wrapped, defaults."""

from __future__ import annotations

import pytest
import torch

from winport.hybrid import serve_plan, settings
from winport.hybrid.settings import KTSettings


def test_upstream_and_kt_kernel_still_look_as_expected() -> None:
    from winport.patches import PATCHES, kt_hybrid_moe

    assert "kt_hybrid_moe" in PATCHES
    kt_hybrid_moe.register_patch()
    kt_hybrid_moe.check_kt_sources()


def _fake_layer(is_draft: bool):  # type: ignore[no-untyped-def]
    from sglang.srt.layers.moe.fused_moe_triton.layer import FusedMoE

    layer = FusedMoE.__new__(FusedMoE)
    torch.nn.Module.__init__(layer)
    layer.is_draft = is_draft
    return layer


@pytest.mark.parametrize("is_draft", [False, True])
def test_only_target_moe_layers_are_wrapped(monkeypatch: pytest.MonkeyPatch, is_draft: bool) -> None:
    """The DSpark draft's MoE (its layer ids 0..2 duplicate the target's) keeps the GPU side's method."""
    from sglang.srt.layers.quantization.fp8 import Fp8MoEMethod

    from winport.hybrid.method import WinportKTMoEMethod
    from winport.patches import kt_hybrid_moe

    monkeypatch.setitem(kt_hybrid_moe._state, "active", True)
    monkeypatch.setattr(settings, "from_sglang", lambda: KTSettings())
    inner = Fp8MoEMethod.__new__(Fp8MoEMethod)
    inner.is_fp4_expert = True
    got = kt_hybrid_moe._get_quant_method(lambda self, layer, prefix: inner, None, _fake_layer(is_draft), "p")
    if is_draft:
        assert got is inner
    else:
        assert isinstance(got, WinportKTMoEMethod) and got.gpu_method is inner
        assert got.fuse_routed_scaling_factor_in_topk is False
    monkeypatch.setitem(kt_hybrid_moe._state, "active", False)
    assert kt_hybrid_moe._get_quant_method(lambda self, layer, prefix: inner, None, _fake_layer(False), "p") is inner


def test_scaling_is_left_to_the_model_on_cpu_torch() -> None:
    """Off CUDA DeepseekV2MoE multiplies the routed output itself: the method must not scale too."""
    from winport.hybrid.method import model_scales_routed_output

    assert model_scales_routed_output() is (not torch.cuda.is_available())


def test_default_threads_leave_cores_to_the_waiting_threads(monkeypatch: pytest.MonkeyPatch) -> None:
    import psutil

    monkeypatch.setattr(psutil, "cpu_count", lambda logical=True: 32 if logical else 16)
    assert settings.default_cpu_threads() == 15
    assert settings.default_cpu_threads(cuda=True) == 14
    gpu = serve_plan.expert_plan("cuda", 1, 48, None)
    assert gpu.argv[gpu.argv.index("--kt-cpuinfer") + 1] == "14"
    monkeypatch.setattr(psutil, "cpu_count", lambda logical=True: 1)
    assert settings.default_cpu_threads() == 1
    assert settings.default_cpu_threads(cuda=True) == 1


def test_serve_plan(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("WINPORT_KT_MOE", raising=False)
    cpu = serve_plan.expert_plan("cpu", 1, None, None)
    assert "kt-kernel on the CPU" in cpu.line and "synchronous" in cpu.line
    assert cpu.env == {"WINPORT_KT_MOE": "1", "KT_FORCE_SYNC_SUBMIT": "1"}
    assert cpu.argv[:2] == ["--kt-method", "MXFP4"] and cpu.argv[-2:] == ["--kt-num-gpu-experts", "0"]
    assert cpu.argv[cpu.argv.index("--kt-cpuinfer") + 1] == str(settings.default_cpu_threads())
    assert cpu.argv[cpu.argv.index("--kt-threadpool-count") + 1] == str(settings.numa_nodes())
    assert "torch W4A16" in serve_plan.expert_plan("cpu", 2, None, None).line
    gpu = serve_plan.expert_plan("cuda", 1, 48, None)
    assert gpu.argv[-1] == "48" and "KT_FORCE_SYNC_SUBMIT" not in gpu.env
    assert not serve_plan.expert_plan("cuda", 1, None, None).argv
    with pytest.raises(ValueError, match="--gpu-experts 4: the server runs on the CPU"):
        serve_plan.expert_plan("cpu", 1, 4, None)
    monkeypatch.setenv("WINPORT_KT_MOE", "0")
    off = serve_plan.expert_plan("cpu", 1, None, None)
    assert not off.argv and "WINPORT_KT_MOE=0" in off.line
    monkeypatch.setattr(serve_plan, "_kt_error", lambda: "no module named kt_kernel")
    monkeypatch.delenv("WINPORT_KT_MOE")
    broken = serve_plan.expert_plan("cpu", 1, None, None)
    assert not broken.argv and "kt-kernel cannot load (no module named kt_kernel)" in broken.line
