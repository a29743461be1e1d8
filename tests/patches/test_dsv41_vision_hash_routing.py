"""winport.patches.dsv41_vision_hash_routing: with a vision tower, V4.1's hash-routed MoE layers keep
hash routing (experts by token id), as for text, instead of SGLang's vision_topk, which reads a
topk_config that HashTopK does not have.

A real SGLang HashTopK (its runtime context stood in for: no shared-expert slots, a draft-scope
layer so no expert-location dispatch is looked up, the torch route as `winport serve` sets it) is
routed through the hook and compared with the text route and with tid2eid itself; score-routed
layers are left to upstream; upstream alone fails on such a layer (the bug the patch exists for).
"""

from __future__ import annotations

import types
from typing import Any

import pytest
import torch

from tests.helpers import run_python_ok
from winport.patches.dsv41_vision_hash_routing import _vision_topk

EXPERTS, TOPK, VOCAB, TOKENS = 8, 2, 50, 6


def _never(*args: Any, **kwargs: Any) -> Any:
    raise AssertionError("upstream's vision_topk must not run for a hash-routed layer")


@pytest.fixture
def hash_moe(monkeypatch: pytest.MonkeyPatch) -> types.SimpleNamespace:
    """A MoE stand-in holding SGLang's own HashTopK with random tid2eid, as a hash layer has."""
    from sglang.srt.layers.moe import hash_topk

    monkeypatch.setenv("SGLANG_OPT_USE_FUSED_HASH_TOPK", "0")  # the fused route is a CUDA JIT kernel
    shared = types.SimpleNamespace(use_waterfill=False, num_shared_topk_slots=0)
    monkeypatch.setattr(hash_topk, "get_model", lambda: types.SimpleNamespace(shared_experts=shared))
    topk = hash_topk.HashTopK(TOPK, EXPERTS, vocab_size=VOCAB, layer_id=0, is_draft=True)
    with torch.no_grad():
        topk.tid2eid.copy_(torch.stack([torch.randperm(EXPERTS)[:TOPK] for _ in range(VOCAB)]).int())
    return types.SimpleNamespace(is_hash=True, topk=topk)


def test_hash_layer_routes_by_token_id_as_for_text(hash_moe: types.SimpleNamespace) -> None:
    logits = torch.randn(TOKENS, EXPERTS)
    ids = torch.randint(0, VOCAB, (TOKENS,))
    got = _vision_topk(_never, hash_moe, logits, ids)
    text = hash_moe.topk(torch.randn(TOKENS, 16), logits, input_ids=ids)  # the text route's call
    assert torch.equal(got.topk_ids, hash_moe.topk.tid2eid[ids])
    assert torch.equal(got.topk_ids, text.topk_ids) and torch.equal(got.topk_weights, text.topk_weights)
    assert not got.topk_weights.isnan().any() and got.topk_weights.abs().sum() > 0
    # Other token ids pick other experts: the routing really follows the ids.
    other = _vision_topk(_never, hash_moe, logits, (ids + 1) % VOCAB)
    assert not torch.equal(other.topk_ids, got.topk_ids)


def test_upstream_vision_topk_fails_on_a_hash_layer(hash_moe: types.SimpleNamespace) -> None:
    from sglang.srt.models.deepseek_v2 import vision_topk

    with pytest.raises(AttributeError, match="topk_config"):
        vision_topk(hash_moe, torch.randn(TOKENS, EXPERTS), torch.randint(0, VOCAB, (TOKENS,)))


def test_score_routed_layers_stay_upstream() -> None:
    calls: list[tuple[Any, ...]] = []
    moe = types.SimpleNamespace(is_hash=False, topk=_never)
    logits, ids = torch.randn(3, EXPERTS), torch.arange(3)
    assert _vision_topk(lambda *a, **k: calls.append((a, k)) or "upstream", moe, logits, ids, None) == "upstream"
    assert calls == [((moe, logits, ids, None), {})]
    no_flag = types.SimpleNamespace(topk=_never)  # a MoE without is_hash is score-routed too
    assert _vision_topk(lambda *a, **k: "upstream", no_flag, logits, ids) == "upstream"


def test_registered_hook_reaches_deepseek_v2() -> None:
    code = (
        "from winport.patches import dsv41_vision_hash_routing as p; p.register_patch()\n"
        "from sglang.srt.plugins.hook_registry import HookRegistry; HookRegistry.apply_hooks()\n"
        "import types, sglang.srt.models.deepseek_v2 as m\n"
        "moe = types.SimpleNamespace(is_hash=True, topk=lambda h, l, i: ('hash', h is l, i))\n"
        "print(m.vision_topk(moe, 'logits', 'ids'))\n"
    )
    out = run_python_ok(code)
    assert out.strip().splitlines()[-1] == "('hash', True, 'ids')"
