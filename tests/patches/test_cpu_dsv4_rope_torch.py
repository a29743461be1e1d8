"""winport.patches.cpu_dsv4_rope_torch: DeepSeek-V4's GPT-J rotary in torch, against SGLang's Triton
kernel under the interpreter."""

from __future__ import annotations

from tests.helpers import run_python

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
