"""winport.patches.dsv4_generic_device: SGLang's DeepSeek-V4 modules take their XPU route, served by
the sgl_kernel shim's functions."""

from __future__ import annotations

from tests.helpers import run_python_ok


def test_dsv4_modules_take_the_xpu_route_with_shim_functions() -> None:
    code = (
        "import sglang.kernels.ops.attention.dsv4.compress as c, sglang.kernels.ops.attention.dsv4.topk as t\n"
        "import sglang.srt.models.deepseek_v4 as m\n"
        "assert m._is_xpu is False and c._is_xpu is False\n"
        "from winport.patches import dsv4_generic_device; dsv4_generic_device.apply()\n"
        "print(m._is_xpu, c._is_xpu, t.is_xpu(), c.plan_compress_prefill.__qualname__, sorted(c._XPU_COMPRESS_FNS))\n"
    )
    out = run_python_ok(code)
    assert out.split("\n")[-2] == "True True True sgl_kernel.plan_compress_prefill [4, 128]"
