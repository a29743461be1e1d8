"""The V4.1 demo's DSpark draft stages in SGLang 0.5.23's own draft model, on the CPU, against float64.

SGLang runs DSpark speculative decoding on CUDA/NPU/XPU only, so on the CPU the draft model class
(`DeepseekV4ForCausalLMDSpark`, models/deepseek_v4_dspark.py) is built in a child process
(tests/serve/_dspark_child.py) from the demo's V4.1 config with its FP8 [32, 32] quant config, and
the demo's `mtp.*` tensors (FP8 dense, MXFP4 experts) go through the model's own `load_weights`
and winport's CPU quant paths. Checked here:

- loading: every checkpoint tensor maps to a draft parameter (no "unexpected weight", no name the
  remapper drops) and every parameter is written (all were poisoned with NaN / a byte pattern);
  the model has the config's shape: 3 stages, block 5, the draft MoE's 4 experts top-1, MXFP4
  experts, FP8 main_proj in [32, 32] blocks, Markov rank 32, a confidence head.
- the draft's distinctive parts against float64 references written from their math (not from
  SGLang's code): the target-hidden projection RMSNorm(main_proj @ [h_3; h_4; h_5]); the Markov head
  (bias = W2 @ W1[previous token]); the draft logits lm_head(RMSNorm(x)) after V4.1's collapsed head;
  the confidence head sigmoid(w . [h; W1[previous token]]) with previous = (anchor, draft[:-1]);
  each stage's MoE (sqrtsoftplus routing with bias-corrected selection, top-1, x1.5, clamped SwiGLU
  experts + shared expert).

Not covered on the CPU: the stages' attention and mHC (they need SGLang's DeepSeek-V4 KV pool and
attention backend inside a draft forward batch, which only the CUDA DSpark worker builds); the live
GPU test (tests/serve/test_dspark_live.py) runs the whole draft. Cost: one ~15 s child process.
"""

from __future__ import annotations

import math
import os
import time
from typing import Any

import pytest
import torch

from tests.helpers import REPO_ROOT
from tests.serve._server import free_port
from winport.demo import quantize as qz
from winport.demo.config import demo_config
from winport.demo.weights_v41 import dspark_tensors

CFG = demo_config("v41")
SEED = int(time.time() * 1e6) % (2**31)
EPS = CFG["rms_norm_eps"]
TOKENS = 24


def _bf16_randn(g: torch.Generator, *shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=g).bfloat16()


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Fresh random inputs, the child's outputs, and the draft weights as float64 values."""
    import subprocess
    import sys

    print(f"seed {SEED}")
    g = torch.Generator().manual_seed(SEED)
    hidden, vocab = CFG["hidden_size"], CFG["vocab_size"]
    gamma = CFG["dspark_block_size"]
    inputs = {
        "x": _bf16_randn(g, TOKENS, hidden),
        "main_hidden": _bf16_randn(g, TOKENS, hidden * len(CFG["dspark_target_layer_ids"])),
        "prev": torch.randint(0, vocab, (TOKENS,), generator=g),
        "anchor": torch.randint(0, vocab, (3,), generator=g),
        "draft": torch.randint(0, vocab, (3, gamma), generator=g),
        "features": _bf16_randn(g, 3 * gamma, hidden),
    }
    tmp = tmp_path_factory.mktemp("dspark")
    torch.save(inputs, tmp / "in.pt")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("WINPORT_", "SGLANG_"))}
    # WINPORT_PLATFORM=on: winport's patches, as in the server. A non-static ragged verify mode makes
    # SGLang build the confidence head (the default, static, builds none and skips its tensors).
    env.update({"WINPORT_PLATFORM": "on", "SGLANG_USE_CPU_ENGINE": "1", "SGLANG_RAGGED_VERIFY_MODE": "compact",
                "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO_ROOT)})
    proc = subprocess.run([sys.executable, "-m", "tests.serve._dspark_child", str(tmp / "in.pt"), str(tmp / "out.pt"),
                           str(free_port())], env=env, cwd=REPO_ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = torch.load(tmp / "out.pt", weights_only=False)
    w = qz.dequantize_state_dict(qz.quantize_state_dict(dspark_tensors(CFG), qz.block_for("v41")))
    return {"in": inputs, "out": out, "w": {k: v.double() for k, v in w.items()}}


def _rms(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt(x.square().mean(-1, keepdim=True) + EPS) * w


def _bound(ref: torch.Tensor, roundings: int) -> torch.Tensor:
    """SGLang keeps bf16 between steps: one rounding moves an element by at most 2^-9 of its
    magnitude, and through a matmul or RMSNorm by up to 2^-9 of the row's RMS; `roundings` of
    them with a 2x margin (the reasoning of test_v41_demo._close_bf16)."""
    return roundings * 2.0 ** -8 * (ref.abs() + ref.square().mean(-1, keepdim=True).sqrt())


def _check(actual: torch.Tensor, ref: torch.Tensor, roundings: int, what: str) -> float:
    assert not torch.isnan(actual).any(), f"{what}: NaN"
    assert actual.shape == ref.shape, f"{what}: shape {tuple(actual.shape)} vs {tuple(ref.shape)}"
    err = (actual.double() - ref).abs()
    excess = (err - _bound(ref, roundings)).max().item()
    assert excess <= 0, f"{what}: max excess over the bound {excess:.3g}, max err {err.max().item():.3g}"
    units = (err / (2.0 ** -8 * (ref.abs() + ref.square().mean(-1, keepdim=True).sqrt()))).max().item()
    print(f"{what}: max err {err.max().item():.3g} = {units:.2f} bf16 units (bound {roundings})")
    return units


def _fails(actual: torch.Tensor, ref: torch.Tensor, roundings: int) -> bool:
    return bool(((actual.double() - ref).abs() > _bound(ref, roundings)).any())


def test_every_draft_tensor_loaded_and_every_parameter_written(run: dict[str, Any]) -> None:
    out = run["out"]
    checkpoint = qz.quantize_state_dict(dspark_tensors(CFG), qz.block_for("v41"))
    assert sorted(out["fed"]) == sorted(checkpoint) and all(n.startswith("mtp.") for n in checkpoint)
    assert not out["dropped"], f"names the draft's remapper drops: {out['dropped'][:5]}"
    assert not out["warnings"], out["warnings"][:5]
    assert not out["unwritten"], f"parameters left poisoned: {out['unwritten'][:5]}"


def test_draft_model_has_the_configured_shape(run: dict[str, Any]) -> None:
    out, params = run["out"], run["out"]["params"]
    assert out["stages"] == CFG["num_nextn_predict_layers"] == 3 and out["gamma"] == CFG["dspark_block_size"] == 5
    assert out["top_k"] == [CFG["dspark_num_experts_per_tok"]] * 3 and out["confidence"]
    hidden, n_exp = CFG["hidden_size"], CFG["dspark_n_routed_experts"]
    assert params["stages.0.mlp.gate.weight"][0] == (n_exp, hidden)
    assert params["stages.2.mlp.experts.w13_weight"] == ((n_exp, 2 * CFG["moe_intermediate_size"], hidden // 2),
                                                          "torch.int8")
    assert params["stages.0.main_proj.weight"] == ((hidden, 3 * hidden), "torch.float8_e4m3fn")
    assert params["stages.0.main_proj.weight_scale_inv"][0] == (hidden // 32, 3 * hidden // 32)
    assert params["stages.1.self_attn.wq_b.weight_scale_inv"][0] == (8 * 512 // 32, CFG["q_lora_rank"] // 32)
    assert params["markov_head.markov_w1.weight"][0] == (CFG["vocab_size"], CFG["dspark_markov_rank"])
    assert "stages.2.norm.weight" in params and "stages.1.norm.weight" not in params
    assert not any(".tid2eid" in n for n in params), "draft stages are not hash-routed"


def test_target_hidden_projection_vs_float64(run: dict[str, Any]) -> None:
    w, h = run["w"], run["in"]["main_hidden"].double()
    ref = _rms(h @ w["mtp.0.main_proj.weight"].T, w["mtp.0.main_norm.weight"])
    _check(run["out"]["proj"], ref, roundings=3, what="main_proj + main_norm")
    # Control: the target layers' hidden states in the other order give another projection.
    hidden = CFG["hidden_size"]
    swapped = torch.cat([h[:, 2 * hidden:], h[:, hidden:2 * hidden], h[:, :hidden]], dim=-1)
    assert _fails(run["out"]["proj"], _rms(swapped @ w["mtp.0.main_proj.weight"].T, w["mtp.0.main_norm.weight"]), 3)


def test_markov_head_vs_float64(run: dict[str, Any]) -> None:
    w, out, prev = run["w"], run["out"], run["in"]["prev"]
    emb, head = w["mtp.2.markov_head.embed.weight"], w["mtp.2.markov_head.head.weight"]
    assert torch.equal(out["markov_embed"].double(), emb[prev])
    ref = emb[prev] @ head.T
    _check(out["markov_bias"], ref, roundings=2, what="Markov step bias")
    _check(out["markov_fwd"], ref, roundings=2, what="Markov head forward")
    # Control: the bias of the token before instead of the given one.
    assert _fails(out["markov_bias"], emb[prev.roll(1)] @ head.T, 2)


def test_draft_logits_vs_float64(run: dict[str, Any]) -> None:
    from winport.demo.weights import _value

    out, x = run["out"], run["in"]["x"]
    # V4.1 (hc_pre_from_prev_sublayer): the draft's hidden states leave forward() collapsed already.
    assert torch.equal(out["post_hc"], x)
    head = _value("head.weight", (CFG["vocab_size"], CFG["hidden_size"]), CFG, 0).bfloat16().double()
    ref = _rms(x.double(), run["w"]["mtp.2.norm.weight"]) @ head.T
    _check(out["logits"], ref, roundings=3, what="draft logits")


def test_confidence_head_vs_float64(run: dict[str, Any]) -> None:
    w, out, inp = run["w"], run["out"], run["in"]
    anchor, draft = inp["anchor"], inp["draft"]
    bs, gamma = draft.shape
    prev = torch.cat([anchor.view(-1, 1), draft[:, :-1]], dim=1)
    feats = torch.cat([inp["features"].double().view(bs, gamma, -1), w["mtp.2.markov_head.embed.weight"][prev]], -1)
    proj = w["mtp.2.confidence_head.proj.weight"][0]
    ref = feats @ proj
    # fp32 dot products of exact bf16 inputs: error below 2^-20 of the sum of |terms| (2x margin).
    bound = 2.0 ** -20 * (feats.abs() @ proj.abs())
    err = (out["confidence_raw"].double() - ref).abs()
    assert not torch.isnan(out["confidence_raw"]).any() and (err <= bound).all(), err.max()
    assert torch.allclose(out["confidence_p"].double(), torch.sigmoid(ref), rtol=0, atol=1e-6)
    # Control: the draft tokens themselves instead of their predecessors give other confidences.
    wrong = torch.cat([inp["features"].double().view(bs, gamma, -1), w["mtp.2.markov_head.embed.weight"][draft]], -1)
    assert ((out["confidence_raw"].double() - wrong @ proj).abs() > bound).any()


def _moe_ref(w: dict[str, torch.Tensor], stage: int, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """float64 DeepSeek-V4 MoE of one draft stage: (output [T, hidden], routing margin [T]).

    Scores sqrt(softplus(gate @ x)); experts chosen by score + bias (top-k); weights the chosen
    scores normalized to sum 1, times routed_scaling_factor; experts and the shared expert are
    SwiGLU with the gate clamped above and the up projection clamped both ways at swiglu_limit.
    The margin is the gap between the last chosen and the best unchosen biased score.
    """
    p = f"mtp.{stage}.ffn"
    limit, k = CFG["swiglu_limit"], CFG["dspark_num_experts_per_tok"]
    x = x.double()

    def swiglu(prefix: str, v: torch.Tensor) -> torch.Tensor:
        gate = (v @ w[f"{prefix}.w1.weight"].T).clamp(max=limit)
        up = (v @ w[f"{prefix}.w3.weight"].T).clamp(-limit, limit)
        return (torch.nn.functional.silu(gate) * up) @ w[f"{prefix}.w2.weight"].T

    scores = torch.sqrt(torch.nn.functional.softplus(x @ w[f"{p}.gate.weight"].T))
    biased = scores + w[f"{p}.gate.bias"]
    top = biased.topk(k + 1, dim=-1)
    chosen = top.indices[:, :k]
    margin = top.values[:, k - 1] - top.values[:, k]
    weights = scores.gather(1, chosen)
    weights = weights / weights.sum(-1, keepdim=True) * CFG["routed_scaling_factor"]
    out = swiglu(f"{p}.shared_experts", x)
    for t in range(x.shape[0]):
        for j in range(k):
            out[t] += weights[t, j] * swiglu(f"{p}.experts.{int(chosen[t, j])}", x[t:t + 1])[0]
    return out, margin


@pytest.mark.parametrize("stage", [0, 1, 2])
def test_stage_moe_vs_float64(run: dict[str, Any], stage: int) -> None:
    """Tokens whose best two biased scores are within 2^-6 are left out: SGLang computes the router
    in bf16/fp32, which can order a near-tie the other way and then picks a wholly different expert
    (that is routing noise, not an error). The rest agree to bf16 rounding: gate/up projections, the
    activation product, the down projection, the routed and shared sums (6 roundings)."""
    x = run["in"]["x"]
    ref, margin = _moe_ref(run["w"], stage, x)
    keep = margin > 2.0 ** -6
    assert keep.sum() >= TOKENS // 2, f"only {int(keep.sum())} of {TOKENS} tokens are not near-ties"
    _check(run["out"]["moe"][stage][keep], ref[keep], roundings=6, what=f"stage {stage} MoE")
    # Control: without the routed experts' scaling factor the answer is off.
    unscaled = ref - (1 - 1 / CFG["routed_scaling_factor"]) * (ref - _shared_only(run["w"], stage, x))
    assert _fails(run["out"]["moe"][stage][keep], unscaled[keep], 6)


def _shared_only(w: dict[str, torch.Tensor], stage: int, x: torch.Tensor) -> torch.Tensor:
    p = f"mtp.{stage}.ffn.shared_experts"
    limit = CFG["swiglu_limit"]
    x = x.double()
    gate = (x @ w[f"{p}.w1.weight"].T).clamp(max=limit)
    up = (x @ w[f"{p}.w3.weight"].T).clamp(-limit, limit)
    return (torch.nn.functional.silu(gate) * up) @ w[f"{p}.w2.weight"].T


def test_reference_inputs_are_not_degenerate(run: dict[str, Any]) -> None:
    """The float64 references see varied values (guards against an all-zero weight or input)."""
    for name in ("mtp.0.main_proj.weight", "mtp.2.markov_head.head.weight", "mtp.1.ffn.experts.2.w2.weight"):
        assert run["w"][name].std() > 0.01, name
    assert math.isfinite(float(run["out"]["logits"].float().std())) and run["out"]["logits"].float().std() > 0.1

