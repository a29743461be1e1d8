"""`--vram-gib` placement (winport.placement): the sizes a plan counts, the plans of the real
DeepSeek-V4.1-Flash config at 32, 80 and 96 GiB, impossible budgets, `winport plan`, and what
`winport serve --vram-gib` passes SGLang.

The real model's figures are checked against arithmetic written out here from its shapes
(tests/placement/v41_flash.py), not against the code's own sums; the demo's against its files.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from tests.placement.v41_flash import v41_flash_config
from winport.placement import budget as budget_mod
from winport.placement.budget import GIB, Inputs, PlanError, make_plan
from winport.placement.kv import kv_bytes
from winport.placement.model_bytes import model_bytes

# --- one expert (H = 5120, I = 2304: w1 and w3 [I, H], w2 [H, I]) ----------------------------------
VALUES = 3 * 5120 * 2304  # 35,389,440
EXPERT_MXFP4 = VALUES // 2 + VALUES // 32  # 17,694,720 codes + 1,105,920 E8M0 = 18,800,640 (18.8 MB)
# FP8 blocks of [128, 128]: w1, w3 18 x 40 blocks each, w2 40 x 18, float32 scales: 2,160 x 4 B
EXPERT_FP8 = VALUES + 2160 * 4  # 35,398,080
EXPERT_HOST = VALUES // 2 + VALUES // 32 * 2  # kt-kernel: bf16 scales, 19,906,560

# --- dense weights as served, V4.1-Flash, [32, 32] FP8 blocks with float32 scales (1 B per 256 values)
# A layer's FP8 matrices: wq_a 1280x5120 = 6,553,600; wq_b 32768x1280 = 41,943,040; wkv 512x5120 =
# 2,621,440; wo_a 8192x4096 = 33,554,432; wo_b 5120x8192 = 41,943,040; shared expert 3 x 2304x5120 =
# 35,389,440: 162,004,992 values + 632,832 scale bytes = 162,637,824 B.
FP8_LAYER = 162_004_992 + 162_004_992 // 256
# bf16: q_norm 1280 + kv_norm 512 + router 384x5120 + two norms 5120 = 1,978,112 x 2 B
BF16_LAYER = (1280 + 512 + 384 * 5120 + 2 * 5120) * 2
# fp32: sinks 64 + two mHC mixers (24 x 20480 + 24 + 3) = 983,158 x 4 B
FP32_LAYER = (64 + 2 * (24 * 20480 + 24 + 3)) * 4
LAYER = FP8_LAYER + BF16_LAYER + FP32_LAYER  # 170,526,680
# 37 routed layers add the router bias (384 fp32), 3 hash-routed ones tid2eid (129280 x 6 int32)
ROUTING = 37 * 384 * 4 + 3 * 129280 * 6 * 4
EMBED_HEAD = 2 * 129280 * 5120 * 2  # 2,647,654,400
# V4.1's own: compressors of kv sources 2, 8, 14 (ratio 2: wkv + wgate 512x5120 bf16) and 20 (ratio
# 1: wkv), each with a 512 norm; indexers of the 8 index sources (wq_b 4096x1280 FP8, weights_proj
# 32x5120 bf16), with wk 128x512 and k_norm 128 on the 4 that are kv sources; engram on layers 1
# and 14 (wkv 25600x1536 FP8, q and k weights 4x5120 bf16)
COMPRESSORS = 3 * (2 * 512 * 5120 * 2 + 1024) + (512 * 5120 * 2 + 1024)
INDEXERS = 8 * (4096 * 1280 + 4096 * 1280 // 256 + 32 * 5120 * 2) + 4 * (128 * 512 * 2 + 256)
ENGRAM = 2 * (25600 * 1536 + 25600 * 1536 // 256 + 2 * 4 * 5120 * 2)
DENSE = 40 * LAYER + ROUTING + EMBED_HEAD + 5120 * 2 + COMPRESSORS + INDEXERS + ENGRAM  # 9,639,168,960

# --- KV per token (SGLang's default sizing, 256-token pages of 584-byte rows padded to 576 B) ------
# paged bytes a token: 149,760 / 256 = 585 (ratio 1 and SWA), 74,880 / 128 = 585 (ratio 2); the FP4
# indexer keys 128 / 2 + 128 / 32 = 68 B; owners: ratio 2 layers 2, 8, 14, ratio 1 layer 20
KV_FULL = 3 * (585 + 68) / 2 + (585 + 68)  # 1,632.5
KV_SWA = 0.1 * 585 * 40  # 2,340 (ratio mode, --swa-full-tokens-ratio 0.1)
# Cap mode, SGLang's default on CUDA (it sets max_running_requests 256 for DeepSeek-V4): a fixed SWA pool
# of per request (window 128 + eviction interval 128 + two pages 512) x 256 = 196,608, plus two prefill
# chunks in flight and a page (2 x 8192 + 256 = 16,640; 2 x 4096 + 256 = 8,448 for a chunk of 4096),
# plus 4 x 256 cached prefix tails of window + page (1,024 x 384 = 393,216): 606,464 / 598,272 slots,
# both whole pages, of 585 x 40 = 23,400 B each. 606,464 is the cap SGLang printed for the V4.1 demo
# on the H200 (2026-12-03).
SWA_SLOT = 585 * 40
SWA_CAP = {8192: 196_608 + 16_640 + 393_216, 4096: 196_608 + 8_448 + 393_216}  # 606,464 / 598,272
# At winport's workstation cap of 16 running requests (kv.WORKSTATION_RUNNING_REQUESTS): 768 x 16 = 12,288
# + the chunks as above + 4 x 16 tails x 384 = 24,576: 53,504 / 45,312 slots (1.2520 / 1.0603 GB).
SWA_CAP_16 = {8192: 12_288 + 16_640 + 24_576, 4096: 12_288 + 8_448 + 24_576}  # 53,504 / 45,312

# --- activations: per token 6 x (3 x 2304 + 5120) x 2 + 2 x 64 x 512 x 2 + 3 x 4 x 5120 x 4 = 521,216 B,
# x 1.25 (budget.ACTIVATION_SLACK, from the H200 measurement written there)
ACT_TOKEN = 5 * (6 * (3 * 2304 + 5120) * 2 + 2 * 64 * 512 * 2 + 3 * 4 * 5120 * 4) // 4  # 651,520


@pytest.fixture(scope="module")
def v41() -> tuple[dict, object]:
    cfg = v41_flash_config()
    return cfg, model_bytes(cfg)


def test_v41_flash_sizes_by_hand(v41: tuple[dict, object]) -> None:
    cfg, m = v41
    assert (m.expert_mxfp4, m.expert_fp8, m.expert_host) == (EXPERT_MXFP4, EXPERT_FP8, EXPERT_HOST)
    assert m.dense_gpu == DENSE == 9_639_168_960
    assert m.embed_head == EMBED_HEAD
    assert (m.moe_layers, m.experts_per_layer) == (40, 384)
    assert m.engram_host == 2 * 384_000_000 * (256 + 8)
    kv = kv_bytes(cfg)
    assert (kv.full, kv.swa, kv.fixed) == (KV_FULL, KV_SWA, 0)
    for chunk, cap in SWA_CAP.items():
        kv = kv_bytes(cfg, cap_chunk=chunk)
        assert (kv.full, kv.swa, kv.swa_cap_tokens, kv.fixed) == (KV_FULL, 0.0, cap, cap * SWA_SLOT)
    assert budget_mod.activation_bytes(cfg, 1) == ACT_TOKEN


def _fixed(card_gib: int, context: int, running: int = 256) -> int:
    """Everything but the experts, by hand: context, dense, KV, activations, graphs, load overhead."""
    chunk, max_bs = (8192, 256) if card_gib >= 90 else (4096, 48)
    max_bs = min(max_bs, running)
    kv = (SWA_CAP if running == 256 else SWA_CAP_16)[chunk] * SWA_SLOT + int(KV_FULL * context)
    return (budget_mod.CONTEXT_BYTES + DENSE + kv + ACT_TOKEN * chunk + ACT_TOKEN * max_bs
            + budget_mod.LOAD_OVERHEAD_BYTES)


# An FP8 slot costs 40 x EXPERT_FP8 resident + one EXPERT_MXFP4 being dequantized at load = 1.4347 GB;
# an MXFP4 slot 40 x EXPERT_MXFP4 = 0.7520 GB.
SLOT = {False: 40 * EXPERT_FP8 + EXPERT_MXFP4, True: 40 * EXPERT_MXFP4}
# (card GiB, --vram-gib) -> slots a layer: FP8-dequantized and MXFP4-resident experts, 1M context.
# 80 of 96: fixed = 0.805 context + 9.639 dense + 15.903 KV (14.191 SWA pool + 1.712 for 1M tokens)
# + 5.337 activations (8192 tokens) + 0.167 graphs (256) + 1.074 load = 32.926 GB; room 85.899 - 32.926
# = 52.973 GB -> 52.973 / 1.4347 = 36.9 -> 36 FP8 slots; / 0.7520 = 70.4 -> 70 MXFP4 slots.
# (In ratio mode, before the cap was modelled: KV 4.165, 45 and 86.)
# 96 of 96: room 103.079 - 32.926 = 70.153 GB -> 48.9 and 93.3 -> 48 and 93.
# 32 of 32 (a 5090: chunk 4096, graphs to 48): KV 13.999 + 1.712; fixed 29.931 GB, room 34.360 - 29.931
# = 4.429 GB -> 3.1 and 5.9 -> 3 and 5.
PLANS = [(96, 80, 36, 70), (96, 96, 48, 93), (32, 32, 3, 5)]
# The same at 16 running requests (what `winport serve` and `winport plan` use on CUDA by default): the
# SWA pool is 1.252 GB, not 14.191 (1.060, not 13.999, at chunk 4096), and the decode graphs stop at
# batch 16 (16 x 651,520 = 0.010 GB, not 0.167 at 256 or 0.031 at 48).
# 80 of 96: fixed 32.926 - 14.191 + 1.252 - 0.157 = 19.830 GB; room 85.899 - 19.830 = 66.069 -> / 1.4347
# = 46.05 -> 46 FP8 slots; / 0.7520 = 87.9 -> 87 MXFP4. 96 of 96: room 103.079 - 19.830 = 83.249 -> 58.02
# and 110.7 -> 58 and 110. 32 of 32: fixed 29.931 - 13.999 + 1.060 - 0.021 = 16.971; room 34.360 - 16.971
# = 17.389 -> 12.1 and 23.1 -> 12 and 23.
PLANS_16 = [(96, 80, 46, 87), (96, 96, 58, 110), (32, 32, 12, 23)]


@pytest.mark.parametrize(("card", "vram", "fp8_slots", "mxfp4_slots"), PLANS_16)
def test_v41_flash_plans_at_the_workstation_cap(v41: tuple[dict, object], card: int, vram: int, fp8_slots: int,
                                                mxfp4_slots: int) -> None:
    from winport.placement.kv import WORKSTATION_RUNNING_REQUESTS

    cfg, m = v41
    assert WORKSTATION_RUNNING_REQUESTS == 16
    for mxfp4, want in ((False, fp8_slots), (True, mxfp4_slots)):
        plan = make_plan(Inputs(config=cfg, sizes=m, card_bytes=card * GIB, host_bytes=512 * GIB,
                                vram_gib=vram, gpu_mxfp4=mxfp4, max_running=16))
        assert plan.slots == want == (vram * GIB - _fixed(card, 1048576, 16)) // SLOT[mxfp4]
        assert "SGLang's cap for 16 running requests" in plan.describe()


def test_running_requests_below_one_are_refused(v41: tuple[dict, object]) -> None:
    cfg, m = v41
    with pytest.raises(PlanError, match="--max-running-requests must be at least 1, got 0"):
        make_plan(Inputs(config=cfg, sizes=m, card_bytes=96 * GIB, host_bytes=512 * GIB, max_running=0))


@pytest.mark.parametrize(("card", "vram", "fp8_slots", "mxfp4_slots"), PLANS)
def test_v41_flash_plans(v41: tuple[dict, object], card: int, vram: int, fp8_slots: int, mxfp4_slots: int) -> None:
    cfg, m = v41
    for mxfp4, want in ((False, fp8_slots), (True, mxfp4_slots)):
        plan = make_plan(Inputs(config=cfg, sizes=m, card_bytes=card * GIB, host_bytes=512 * GIB,
                                vram_gib=vram, gpu_mxfp4=mxfp4))
        room = vram * GIB - _fixed(card, 1048576)
        assert plan.slots == want == room // SLOT[mxfp4]
        used = sum(b for _, b, _ in plan.lines)
        assert used <= vram * GIB
        assert plan.host_experts == 384 * 40 * EXPERT_HOST
        text = plan.describe()
        assert f"Experts: {want} of 384 a layer on the GPU" in text
        assert f"{384 - want} a layer in kt-kernel" in text
        # SGLang's fraction covers weights + KV: dense + experts + KV over the card less its context
        chunk = 8192 if card >= 90 else 4096
        static = (DENSE + want * 40 * (EXPERT_MXFP4 if mxfp4 else EXPERT_FP8)
                  + SWA_CAP[chunk] * SWA_SLOT + int(KV_FULL * 1048576)
                  + budget_mod.LOAD_OVERHEAD_BYTES + (0 if mxfp4 else want * EXPERT_MXFP4))
        assert math.isclose(plan.mem_fraction_static, static / (card * GIB - budget_mod.CONTEXT_BYTES))


def test_a_budget_that_holds_every_expert_needs_no_kt_kernel(v41: tuple[dict, object]) -> None:
    cfg, m = v41
    plan = make_plan(Inputs(config=cfg, sizes=m, card_bytes=400 * GIB, host_bytes=16 * GIB, gpu_mxfp4=True))
    assert plan.slots == 384 and plan.host_experts == 0  # and no host RAM check


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"vram_gib": 120}, "more than GPU has: 96.00 GiB"),
    ({"vram_gib": 0}, "positive"),
    ({"vram_gib": float("nan")}, "positive"),
    ({"vram_gib": 12}, r"--vram-gib 12: below what the server needs before any routed expert, 30\.66 GiB .*"
                       r"KV cache for 1048576 tokens 14\.81 GiB.*give at least 30\.7 GiB or a shorter --context-length"),
    ({"vram_gib": 80, "gpu_experts": 50}, r"--gpu-experts 50 needs 66\.81 GiB .* room for 36 a layer"),
    ({"vram_gib": 80, "gpu_experts": 400}, "0 to 384"),
    ({"vram_gib": 80, "host_bytes": 256 * GIB}, r"host RAM: kt-kernel needs 284\.77 GiB .* has 256\.00 GiB"),
])
def test_impossible_budgets_name_the_numbers(v41: tuple[dict, object], kwargs: dict, message: str) -> None:
    cfg, m = v41
    args = {"config": cfg, "sizes": m, "card_bytes": 96 * GIB, "host_bytes": 512 * GIB, **kwargs}
    with pytest.raises(PlanError, match=message):
        make_plan(Inputs(**args))


def test_gpu_experts_within_the_budget_is_taken(v41: tuple[dict, object]) -> None:
    cfg, m = v41
    plan = make_plan(Inputs(config=cfg, sizes=m, card_bytes=96 * GIB, host_bytes=512 * GIB, vram_gib=80,
                            gpu_experts=20))
    assert plan.slots == 20


def test_shorter_context_leaves_room_for_more_experts(v41: tuple[dict, object]) -> None:
    cfg, m = v41
    args = {"config": cfg, "sizes": m, "card_bytes": 96 * GIB, "host_bytes": 512 * GIB, "vram_gib": 80}
    long, short = make_plan(Inputs(**args)), make_plan(Inputs(**args, context_length=65536))
    assert short.kv_tokens == 65536 and short.slots > long.slots
    # below MIN_KV_TOKENS the pool stays at the floor (SWA room for 25 request windows)
    assert make_plan(Inputs(**args, context_length=4096)).kv_tokens == budget_mod.MIN_KV_TOKENS


# --- the demo: the config's count against the checkpoint's files ------------------------------------


def test_demo_dense_bytes_equal_its_checkpoint_files() -> None:
    """model_bytes of the V4.1 demo's config = the served bytes of its safetensors' dense tensors,
    counted from the file headers: FP8 weights 1 B a value + 4 B per `.scale` entry, the rest at
    their dtype; experts, engram rows and the draft (mtp.*) left out."""
    from winport.demo.build import ensure_demo
    from winport.placement.source import _ST_BYTES, safetensors_entries

    folder = ensure_demo("v41")
    config = json.loads((folder / "config.json").read_text())
    entries: dict[str, tuple[str, list[int]]] = {}
    for shard in folder.glob("*.safetensors"):
        entries.update(safetensors_entries(shard))
    served = 0
    for name, (dtype, shape) in entries.items():
        if name.startswith("mtp.") or ".ffn.experts." in name or ".engram.embed." in name:
            continue
        if name.endswith(".scale"):
            served += math.prod(shape) * 4  # float32 in SGLang's parameters
        else:
            served += math.prod(shape) * _ST_BYTES[dtype]
    m = model_bytes(config)
    assert m.dense_gpu == served
    n_exp, h, i = config["n_routed_experts"], config["hidden_size"], config["moe_intermediate_size"]
    expert_bytes = sum(math.prod(s) for n, (_d, s) in entries.items() if n.startswith("layers.") and ".ffn.experts." in n)
    assert expert_bytes == m.moe_layers * n_exp * (3 * h * i // 2 + 3 * h * i // 32)
    assert m.expert_mxfp4 * n_exp * m.moe_layers == expert_bytes


# --- winport plan ------------------------------------------------------------------------------------


def _config_file(tmp_path: Path) -> Path:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(v41_flash_config()))
    return path


def test_winport_plan_prints_the_budget(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from winport.placement.cli import main

    path = _config_file(tmp_path)
    assert main(["--model", str(path), "--card-gib", "96", "--vram-gib", "80", "--ram-gib", "512", "--mxfp4"]) == 0
    out = capsys.readouterr().out
    for line in ("GPU budget 80.00 GiB of a 96 GiB card", "dense weights", "KV cache", "activations", "CUDA graphs",
                 "GPU experts", "Experts: 87 of 384 a layer on the GPU (MXFP4", "Host RAM: kt-kernel holds all 15360",
                 "SGLang's cap for 16 running requests",
                 "Engram tables: 188.83 GiB"):
        assert line in out
    assert main(["--model", str(path), "--card-gib", "96", "--vram-gib", "80", "--ram-gib", "512", "--fp8"]) == 0
    assert "Experts: 46 of 384" in capsys.readouterr().out
    assert main(["--model", str(path), "--card-gib", "96", "--vram-gib", "80", "--ram-gib", "512", "--fp8",
                 "--max-running-requests", "256"]) == 0
    assert "Experts: 36 of 384" in capsys.readouterr().out


def test_winport_plan_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    from winport.placement import cli

    path = _config_file(tmp_path)
    monkeypatch.setattr(cli, "card", lambda: None)
    assert cli.main(["--model", str(path)]) == 2
    assert "no CUDA GPU here: give --card-gib" in capsys.readouterr().err
    assert cli.main(["--model", str(tmp_path / "missing.gguf"), "--card-gib", "96"]) == 2
    assert "no such file or folder" in capsys.readouterr().err
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    assert cli.main(["--model", str(bad), "--card-gib", "96"]) == 2
    assert f"{bad}: not JSON" in capsys.readouterr().err
    assert cli.main(["--model", str(path), "--card-gib", "96", "--vram-gib", "10", "--ram-gib", "512"]) == 2
    assert "below what the server needs" in capsys.readouterr().err


def test_plan_from_a_gguf_equals_the_plan_from_its_checkpoint(tmp_path: Path) -> None:
    """The UD-mix GGUF of the V4.1 demo gives the config (and so the sizes) of the demo checkpoint."""
    from winport.demo.command import main as demo_model
    from winport.placement.source import read_source

    gguf = tmp_path / "demo.gguf"
    assert demo_model(["--variant", "v41", "--gguf", str(gguf), "--q8-0", "--mxfp4-experts"]) == 0
    from winport.demo.build import ensure_demo

    ckpt = read_source(ensure_demo("v41"))
    src = read_source(gguf)
    assert src.kind == "gguf" and ckpt.kind == "checkpoint"
    assert model_bytes(src.config) == model_bytes(ckpt.config)
    assert ckpt.draft_bytes > 0  # the demo bundles its DSpark draft as mtp.*


# --- winport serve --vram-gib --------------------------------------------------------------------------


def test_serve_vram_gib_places_the_experts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    """On a (pretended) 96 GiB card, a model folder of the real config: the plan is printed, its slots
    become the kt-kernel GPU expert count, its fraction SGLang's --mem-fraction-static."""
    from winport.placement import cli
    from winport.serve import command

    folder = tmp_path / "model"
    folder.mkdir()
    _config_file(folder)
    monkeypatch.setattr(command, "_cuda_available", lambda: True)
    monkeypatch.setattr(cli, "card", lambda: (96 * GIB, "RTX PRO 6000 (pretended)"))
    monkeypatch.setattr(cli, "host_ram", lambda: 512 * GIB)
    monkeypatch.delenv("WINPORT_GPU_MXFP4_MOE", raising=False)
    monkeypatch.delenv("WINPORT_KT_MOE", raising=False)
    plan = command.build_plan(["--model", str(folder), "--vram-gib", "80"])
    out = capsys.readouterr().out
    assert "winport serve: GPU budget 80.00 GiB of RTX PRO 6000 (pretended)" in out
    assert "winport serve: Experts: 46 of 384 a layer on the GPU" in out  # PLANS_16: the workstation cap
    argv = plan.argv
    assert argv[argv.index("--kt-num-gpu-experts") + 1] == "46"
    assert argv[argv.index("--max-running-requests") + 1] == "16"
    assert float(argv[argv.index("--mem-fraction-static") + 1]) == pytest.approx(plan.placement.mem_fraction_static,
                                                                                 abs=1e-5)
    wide = command.build_plan(["--model", str(folder), "--vram-gib", "80", "--max-running-requests", "256"])
    assert wide.argv[wide.argv.index("--kt-num-gpu-experts") + 1] == "36"  # PLANS: SGLang's own cap
    assert wide.argv[wide.argv.index("--max-running-requests") + 1] == "256"
    with pytest.raises(command.ServeError, match="--gpu-experts 60 needs"):
        command.build_plan(["--model", str(folder), "--vram-gib", "80", "--gpu-experts", "60"])
    with pytest.raises(command.ServeError, match="below what the server needs"):
        command.build_plan(["--model", str(folder), "--vram-gib", "16"])


def test_memory_report_compares_sglangs_figures_with_the_plan(v41: tuple[dict, object]) -> None:
    from winport.placement.actual import compare, expected_tokens

    cfg, m = v41
    plan = make_plan(Inputs(config=cfg, sizes=m, card_bytes=96 * GIB, host_bytes=512 * GIB, vram_gib=80))
    info = {"internal_states": [{"memory_usage": {"weight": 71.2, "kvcache": 3.5, "token_capacity": 900000,
                                                  "graph": {"decode": 0.3, "prefill": 0.0}}}]}
    tensors = sum(b for w, b, _ in plan.lines if w in ("dense weights", "GPU experts")) / GIB
    reserve = sum(b for w, b, _ in plan.lines if w == "load overhead") / GIB
    lines = compare(plan, info)
    assert lines[0].startswith(f"GPU as loaded vs planned: weights 71.20 vs {tensors:.2f} GiB of tensors + "
                               f"{reserve:.2f} GiB reserved for loading")
    # 71.20 GiB held is more than tensors + reserve: the expected tokens fall below the plan's by the excess
    over = 71.2 - tensors - reserve
    assert over > 0
    expect = 1048576 - int(over * GIB / KV_FULL)
    assert expected_tokens(plan, 71.2) == expect
    assert f"KV cache 900000 vs {expect} tokens (the plan's 1048576" in lines[0]
    assert "CUDA graphs 0.30 vs 0.16 GiB" in lines[0]
    assert "more than the" in lines[1] and "fewer than the 1048576 planned" in lines[2]
    # Weights that use half the reserve leave the other half to the KV pool, at KV_FULL bytes a token.
    half = tensors + reserve / 2
    assert expected_tokens(plan, half) == 1048576 + int(reserve / 2 * GIB / KV_FULL)
    info["internal_states"][0]["memory_usage"].update(weight=half, token_capacity=1100000)
    assert len(compare(plan, info)) == 1
    assert compare(plan, {}) == ["SGLang's /server_info reports no memory_usage; the plan cannot be checked"]
