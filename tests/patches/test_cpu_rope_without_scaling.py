"""winport.patches.cpu_rope_without_scaling: DeepSeek-V4's compress-ratio-0 layers (rope_scaling=None)
get SGLang's generic rotary on CPU, where upstream's CPU factory only knows deepseek_yarn.

The rotary the patch returns is checked against plain GPT-J RoPE computed in float64 (independent of
SGLang's code); the hook's decisions on the other devices and with scaling; and, in a fresh
interpreter, that the hook registered through SGLang's HookRegistry reaches deepseek_v4's name.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from tests.helpers import run_python
from winport.patches.cpu_rope_without_scaling import _rope_wrapper

HEAD, MAX_POS, BASE = 64, 4096, 10000


def _never(*args: Any, **kwargs: Any) -> Any:
    raise AssertionError("upstream's get_rope_wrapper must not run for this layer")


def _gptj_reference(x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """Rotate the pairs (2i, 2i+1) of each head by position x base^(-2i/d), in float64."""
    d = x.shape[-1]
    inv_freq = torch.tensor([BASE ** (-2 * i / d) for i in range(d // 2)], dtype=torch.float64)
    angle = positions.double()[:, None, None] * inv_freq
    cos, sin = torch.cos(angle), torch.sin(angle)
    even, odd = x.double()[..., 0::2], x.double()[..., 1::2]
    out = torch.empty(x.shape, dtype=torch.float64)
    out[..., 0::2] = even * cos - odd * sin
    out[..., 1::2] = even * sin + odd * cos
    return out


def _neox_reference(x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """The NeoX pairing (i, i + d/2) of the same rotation, in float64."""
    d = x.shape[-1]
    inv_freq = torch.tensor([BASE ** (-2 * i / d) for i in range(d // 2)], dtype=torch.float64)
    angle = positions.double()[:, None, None] * inv_freq
    cos, sin = torch.cos(angle), torch.sin(angle)
    lo, hi = x.double()[..., : d // 2], x.double()[..., d // 2 :]
    return torch.cat([lo * cos - hi * sin, hi * cos + lo * sin], -1)


@pytest.mark.parametrize("positional", [False, True])
def test_cpu_layer_without_scaling_gets_plain_gptj_rope(positional: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    from sglang.srt.layers.rotary_embedding import base

    # As in SGLang's CPU engine (SGLANG_USE_CPU_ENGINE=1, which `winport serve` sets; read once at import):
    # otherwise RotaryEmbedding reaches for vllm's CUDA kernel.
    monkeypatch.setattr(base, "_is_cpu", True)
    if positional:  # rope_scaling as the sixth positional argument, device as keyword
        rope = _rope_wrapper(_never, HEAD, HEAD, MAX_POS, BASE, False, None, device="cpu")
    else:  # as deepseek_v4 calls it
        rope = _rope_wrapper(_never, head_size=HEAD, rotary_dim=HEAD, max_position=MAX_POS, base=BASE,
                             rope_scaling=None, is_neox_style=False, device="cpu")
    assert rope.is_neox_style is False and (rope.head_size, rope.rotary_dim) == (HEAD, HEAD)
    tokens, heads = 7, 3
    positions = torch.randint(0, MAX_POS, (tokens,))
    q = torch.randn(tokens, heads * HEAD)
    k = torch.randn(tokens, HEAD)
    q_out, k_out = rope.forward_native(positions, q.clone(), k.clone())
    want_q = _gptj_reference(q.view(tokens, heads, HEAD), positions).view(tokens, -1)
    want_k = _gptj_reference(k.view(tokens, 1, HEAD), positions).view(tokens, -1)
    assert not q_out.isnan().any() and not k_out.isnan().any()
    # fp32 cos/sin cache and products: a few fp32 ulps of |x| (positions up to 4096 rad add the
    # rounding of the angle itself, |angle| x 2^-24)
    tol = 8 * MAX_POS * 2.0**-24 * max(q.abs().max().item(), k.abs().max().item())
    assert (q_out.double() - want_q).abs().max() <= tol
    assert (k_out.double() - want_k).abs().max() <= tol
    # Control: the NeoX pairing (i, i + d/2), upstream's default style, is far from this result.
    assert (q_out.double() - _neox_reference(q.view(tokens, heads, HEAD), positions).view(tokens, -1)).abs().max() > 0.1


def test_other_layers_and_devices_stay_upstream() -> None:
    calls: list[tuple[tuple[Any, ...], dict[str, Any]]] = []

    def original(*args: Any, **kwargs: Any) -> str:
        calls.append((args, kwargs))
        return "upstream"

    yarn = {"rope_type": "deepseek_yarn", "factor": 4.0}
    assert _rope_wrapper(original, HEAD, HEAD, MAX_POS, BASE, False, yarn, device="cpu") == "upstream"
    assert _rope_wrapper(original, HEAD, HEAD, MAX_POS, BASE, rope_scaling=None, device="cuda") == "upstream"
    assert calls == [((HEAD, HEAD, MAX_POS, BASE, False, yarn), {"device": "cpu"}),
                     ((HEAD, HEAD, MAX_POS, BASE), {"rope_scaling": None, "device": "cuda"})]


def test_upstream_cpu_factory_needs_scaling() -> None:
    # The failure the patch exists for: without it, such a layer cannot be built on CPU.
    from sglang.srt.layers.rotary_embedding.factory import get_rope_wrapper

    with pytest.raises(AssertionError):
        get_rope_wrapper(head_size=HEAD, rotary_dim=HEAD, max_position=MAX_POS, base=BASE, rope_scaling=None,
                         is_neox_style=False, device="cpu")


def test_registered_hook_reaches_deepseek_v4() -> None:
    code = (
        "from winport.patches import cpu_rope_without_scaling as p; p.register_patch()\n"
        "from sglang.srt.plugins.hook_registry import HookRegistry; HookRegistry.apply_hooks()\n"
        "import sglang.srt.models.deepseek_v4 as m\n"
        f"rope = m.get_rope_wrapper(head_size={HEAD}, rotary_dim={HEAD}, max_position={MAX_POS}, base={BASE},"
        " rope_scaling=None, is_neox_style=False, device='cpu')\n"
        "print('rope', rope.is_neox_style, rope.rotary_dim)\n"
    )
    proc = run_python(code, env={"SGLANG_USE_CPU_ENGINE": "1"})  # as `winport serve` runs SGLang on CPU
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().splitlines()[-1] == f"rope False {HEAD}"
