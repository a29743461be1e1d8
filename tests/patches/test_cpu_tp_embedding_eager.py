"""winport.patches.cpu_tp_embedding_eager: the vocabulary-parallel embedding mask runs eagerly on CPU."""

from __future__ import annotations

import pytest

from winport.patches import _base


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
