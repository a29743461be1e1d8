"""winport.patches.cuda_mxfp4_moe: SGLang's Fp8MoEMethod serving packed MXFP4 experts with winport's Triton kernel.

On the CPU: a real Fp8MoEMethod layer (SGLang's own create_weights, FP4-expert layout) goes through
the patch's load hook and apply hook with SGLang's CUDA flag faked on; the Triton kernel runs under
TRITON_INTERPRET=1. Its output is checked against the float64 error bound and the rounding-faithful
reference of tests/ops/test_mxfp4_moe.py, and against the CPU serving path's independent torch MoE
(winport.patches.cpu_mxfp4_moe). Also: both hooks are inert without WINPORT_GPU_MXFP4_MOE=1 or off
CUDA, conflicting settings fail by name, and `winport serve` on (faked) CUDA with the variable set
does not ask SGLang to dequantize the experts.
"""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():  # before kernels_triton is imported (triton.jit reads it then)
    os.environ.setdefault("TRITON_INTERPRET", "1")
if os.environ.get("TRITON_INTERPRET") == "1":
    # As in the op suite (tests/ops/conftest.py): an interpreted kernel's access outside its tensors fails.
    from tests.ops.triton_bounds import install as _install_bounds_check

    _install_bounds_check()

import json  # noqa: E402
import time  # noqa: E402
from typing import Any  # noqa: E402

import pytest  # noqa: E402

from kernels_triton import mxfp4_moe as mm  # noqa: E402
from tests.helpers import run_python  # noqa: E402
from tests.ops.test_mxfp4_moe import check, error_bound, make_experts  # noqa: E402
from winport.patches import cuda_mxfp4_moe as patch  # noqa: E402
from winport.serve import command  # noqa: E402

SEED = int(time.time() * 1e6) % (2**31)
E, H, INTER, T, K = 4, 64, 64, 7, 2


def _layer(gen: torch.Generator, swiglu_limit: float | None = 10.0, scaling: float | None = 1.5,
           **runner: Any) -> tuple[Any, torch.nn.Module, tuple[torch.Tensor, ...]]:
    """SGLang's Fp8MoEMethod + a module with its FP4-expert parameters, filled with random MXFP4 experts."""
    from sglang.srt.layers.moe.moe_runner.base import MoeRunnerConfig
    from sglang.srt.layers.quantization.fp8 import Fp8Config, Fp8MoEMethod

    method = Fp8MoEMethod(Fp8Config(is_checkpoint_fp8_serialized=True, weight_block_size=[32, 32],
                                    is_fp4_experts=True))
    layer = torch.nn.Module()
    layer.moe_tp_size = 1
    layer.prefix = "model.layers.3.mlp.experts"
    layer.moe_runner_config = MoeRunnerConfig(swiglu_limit=swiglu_limit, routed_scaling_factor=scaling, **runner)
    method.create_weights(layer, E, H, INTER, torch.bfloat16, weight_loader=None)
    method.moe_runner_config = layer.moe_runner_config  # what create_moe_runner stores
    w13, s13, w2, s2 = make_experts(E, H, INTER, lo=122, hi=127, gen=gen)
    # The checkpoint loader copies int8 bytes and fp32 scale values (2^(e-127)) into these.
    layer.w13_weight.data.copy_(w13.view(torch.int8))
    layer.w2_weight.data.copy_(w2.view(torch.int8))
    layer.w13_weight_scale_inv.data.copy_(torch.exp2(s13.float() - 127))
    layer.w2_weight_scale_inv.data.copy_(torch.exp2(s2.float() - 127))
    return method, layer, (w13, s13, w2, s2)


def _dispatch(x: torch.Tensor, ids: torch.Tensor, tw: torch.Tensor) -> Any:
    from sglang.srt.layers.moe.token_dispatcher.standard import StandardDispatchOutput
    from sglang.srt.layers.moe.topk import StandardTopKOutput

    return StandardDispatchOutput(hidden_states=x, hidden_states_scale=None,
                                  topk_output=StandardTopKOutput(tw, ids, torch.zeros(x.shape[0], E)))


def _never(*args: Any, **kwargs: Any) -> Any:
    raise AssertionError("SGLang's own method was called although the patch should serve this layer")


class _Original:
    """Stands in for SGLang's method: records that it was called."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, *args: Any, **kwargs: Any) -> str:
        self.calls += 1
        return "upstream"


@pytest.fixture
def on_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    """SGLang believes it runs on CUDA and the user opted in."""
    from sglang.srt.layers.quantization import fp8

    monkeypatch.setattr(fp8, "_is_cuda", True)
    monkeypatch.setenv(patch.ENV, "1")


def _routing(gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.stack([torch.randperm(E, generator=gen)[:K] for _ in range(T)]).to(torch.int32)
    ids[2, 1] = -1  # an empty slot (a CPU expert under kt-kernel's mask, say)
    tw = torch.rand(T, K, generator=gen) + 0.1
    return ids, tw / tw.sum(1, keepdim=True)


def test_hooks_serve_the_layer_with_the_kernel(on_cuda: None) -> None:
    print(f"seed {SEED}")
    gen = torch.Generator().manual_seed(SEED)
    method, layer, experts = _layer(gen)
    assert patch._process(_never, method, layer) is None
    assert getattr(layer, patch.FLAG) and layer.w13_weight.dtype == torch.int8
    assert layer.w13_weight_scale_inv.dtype == torch.float32  # kept as loaded, not DeepGEMM's layout
    x = (torch.randn(T, H, generator=gen) * 2).bfloat16()
    ids, tw = _routing(gen)
    combined = patch._apply(_never, method, layer, _dispatch(x, ids, tw))
    out = combined.hidden_states
    assert out.dtype == torch.bfloat16 and out.shape == (T, H)
    exact, bound = error_bound(x, *experts, ids, tw, 10.0, 1.5)
    check(out, exact, bound, "patched apply vs float64")
    faithful = mm.mxfp4_moe_ref(x, *experts, ids, tw, 10.0, 1.5, round_like_kernel=True)
    same = (out.double() == faithful).float().mean()
    assert same >= 0.99, f"only {float(same):.4f} of outputs equal the rounding-faithful reference"
    # Independent torch MoE (the CPU serving path), on the layer's own fp32 scales; it has no
    # routed_scaling_factor, and rounds at other points: a few bf16 steps of |out| apart at most.
    from winport.patches.cpu_mxfp4_moe import mxfp4_moe as cpu_moe

    theirs = cpu_moe(x, layer.w13_weight.data, layer.w13_weight_scale_inv.data, layer.w2_weight.data,
                     layer.w2_weight_scale_inv.data, tw, ids, 10.0).double() * 1.5
    assert (out.double() - theirs).abs().max() <= 0.03 * theirs.abs().max()
    # The config's clamp reaches the kernel (it clips at this scale: without it the answer differs).
    free = mm.mxfp4_moe_ref(x, *experts, ids, tw, None, 1.5)
    assert (out.double() - free).abs().max() > 0.1 * free.abs().max()


def test_hooks_are_inert_unless_opted_in_on_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    from sglang.srt.layers.quantization import fp8

    gen = torch.Generator().manual_seed(SEED)
    for cuda, env in ((True, None), (True, "0"), (False, "1")):
        monkeypatch.setattr(fp8, "_is_cuda", cuda)
        if env is None:
            monkeypatch.delenv(patch.ENV, raising=False)
        else:
            monkeypatch.setenv(patch.ENV, env)
        method, layer, _ = _layer(gen)
        original = _Original()
        assert patch._process(original, method, layer) == "upstream" and original.calls == 1
        assert not getattr(layer, patch.FLAG, False)
        assert patch._apply(original, method, layer, None) == "upstream" and original.calls == 2
    # FP8 (non-FP4) experts are left to SGLang even when opted in.
    monkeypatch.setattr(fp8, "_is_cuda", True)
    monkeypatch.setenv(patch.ENV, "1")
    method, layer, _ = _layer(gen)
    method.is_fp4_expert = False
    original = _Original()
    assert patch._process(original, method, layer) == "upstream" and original.calls == 1


def test_conflicting_settings_fail_by_name(on_cuda: None, monkeypatch: pytest.MonkeyPatch) -> None:
    gen = torch.Generator().manual_seed(SEED)
    method, layer, _ = _layer(gen)
    method.dequant_fp4_to_fp8 = True
    with pytest.raises(RuntimeError, match="mlp.experts: .*SGLANG_DSV4_FP4_DEQUANT=1"):
        patch._process(_never, method, layer)
    from sglang.srt.layers.moe import utils
    from sglang.srt.layers.moe.utils import MoeRunnerBackend

    method, layer, _ = _layer(gen)
    monkeypatch.setattr(utils, "get_moe_runner_backend", lambda: MoeRunnerBackend.MARLIN)
    with pytest.raises(RuntimeError, match="--moe-runner-backend triton"):
        patch._process(_never, method, layer)
    monkeypatch.setattr(utils, "get_moe_runner_backend", lambda: MoeRunnerBackend.TRITON)
    layer.w2_weight_scale_inv.data = layer.w2_weight_scale_inv.data.to(torch.bfloat16)
    with pytest.raises(ValueError, match="w2_weight_scale_inv: expected float32"):
        patch._process(_never, method, layer)


@pytest.mark.parametrize("runner", [{"activation": "gelu"}, {"apply_router_weight_on_input": True},
                                    {"gemm1_alpha": 1.702, "gemm1_clamp_limit": 7.0}, {"no_combine": True}])
def test_unsupported_runner_config_fails(on_cuda: None, runner: dict[str, Any]) -> None:
    gen = torch.Generator().manual_seed(SEED)
    method, layer, _ = _layer(gen, **runner)
    patch._process(_never, method, layer)
    x = torch.randn(T, H, generator=gen).bfloat16()
    with pytest.raises(NotImplementedError, match=next(iter(runner))):
        patch._apply(_never, method, layer, _dispatch(x, *_routing(gen)))


def _cuda_plan(monkeypatch: pytest.MonkeyPatch, tmp_path: Any, opt_in: bool) -> command.LaunchPlan:
    from winport.demo.config import demo_config

    folder = tmp_path / "demo"
    folder.mkdir(exist_ok=True)
    (folder / "config.json").write_text(json.dumps(demo_config()))
    monkeypatch.setattr(command, "_cuda_available", lambda: True)
    monkeypatch.setattr("winport.demo.build.ensure_demo", lambda variant: folder)
    if opt_in:
        monkeypatch.setenv(patch.ENV, "1")
    else:
        monkeypatch.delenv(patch.ENV, raising=False)
    return command.build_plan(["--demo"])


def test_serve_plan_keeps_experts_packed_only_when_opted_in(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    plan = _cuda_plan(monkeypatch, tmp_path, opt_in=True)
    assert plan.device == "cuda"
    assert "SGLANG_DSV4_FP4_DEQUANT" not in plan.env
    assert plan.env[patch.ENV] == "1"
    # --moe-runner-backend triton then is the platform's default: tests/serve/test_launch_policy.py.
    plan = _cuda_plan(monkeypatch, tmp_path, opt_in=False)
    assert plan.env["SGLANG_DSV4_FP4_DEQUANT"] == "1"
    assert patch.ENV not in plan.env


THROUGH_SGLANG = """
import torch
from winport import patches
patches.register_all()
from sglang.srt.plugins.hook_registry import HookRegistry
HookRegistry.apply_hooks()
from sglang.srt.layers.quantization import fp8
fp8._is_cuda = True
from kernels_triton.mxfp4_moe import mxfp4_moe
from tests.patches.test_cuda_mxfp4_moe import T, H, _dispatch, _layer, _routing
gen = torch.Generator().manual_seed(SEED)
method, layer, experts = _layer(gen)
assert method.process_weights_after_loading_block_quant(layer) is None
assert layer._winport_cuda_mxfp4
x = torch.randn(T, H, generator=gen).bfloat16()
ids, tw = _routing(gen)
out = method.apply(layer, _dispatch(x, ids, tw)).hidden_states
assert torch.equal(out, mxfp4_moe(x, *experts, ids, tw, 10.0, 1.5)), "apply differs from the kernel"
print("served by winport")
"""


def test_registered_hooks_chain_through_sglang_methods() -> None:
    """All winport patches registered and applied by SGLang's HookRegistry (the cpu_mxfp4_moe and
    cuda_fp4_dequant_block_shape hooks sit on the same methods): Fp8MoEMethod's own entry points
    reach the kernel on (faked) CUDA."""
    proc = run_python(THROUGH_SGLANG.replace("SEED", str(SEED)),
                      env={"TRITON_INTERPRET": "1", patch.ENV: "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().endswith("served by winport")
