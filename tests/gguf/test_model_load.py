"""A tiny GGUF with real V4.1-Flash tensor names and quant types loads to SGLang-named tensors."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import gguf
import gguf.quants as gq
import numpy as np
import pytest
import torch

from tests.gguf._helpers import random_blocks, write_gguf, write_raw_gguf
from winport.gguf import GGUFError, load_gguf_model, open_gguf
from winport.gguf.cli import dump_main, info_main
from winport.gguf.convert import fp8_blocks_dequant, to_fp8_blocks
from winport.gguf.mxfp4_repack import dequant_kt_mxfp4, gguf_mxfp4_to_kt
from winport.gguf.names import plan_names

H, QL, V, E, I_MOE, L = 64, 32, 96, 4, 32, 2  # hidden, q_lora, vocab, experts, moe inter, layers


def _q8(rng: np.random.Generator, n: int, k: int) -> tuple[str, np.ndarray]:
    x = rng.standard_normal((n, k)).astype(np.float32) * 0.05
    return "Q8_0", gq.quantize(x, gguf.GGMLQuantizationType.Q8_0)


def _mx(rng: np.random.Generator, e: int, n: int, k: int) -> tuple[str, np.ndarray]:
    x = rng.standard_normal((e, n, k)).astype(np.float32)
    return "MXFP4", gq.quantize(x, gguf.GGMLQuantizationType.MXFP4)


def _f32(rng: np.random.Generator, *shape: int) -> tuple[str, np.ndarray]:
    return "F32", rng.standard_normal(shape).astype(np.float32)


def _bf16(rng: np.random.Generator, *shape: int) -> tuple[str, np.ndarray]:
    t = torch.from_numpy(rng.standard_normal(shape).astype(np.float32)).to(torch.bfloat16)
    return "BF16", t.view(torch.int16).numpy().view(np.uint16)


def tiny_v41_tensors(rng: np.random.Generator, n_layers: int = L) -> dict:
    t = {
        "token_embd.weight": _q8(rng, V, H),
        "output_norm.weight": _f32(rng, H),
        "output.weight": _q8(rng, V, H),
    }
    for i in range(n_layers):
        b = f"blk.{i}."
        t.update({
            b + "attn_norm.weight": _f32(rng, H),
            b + "attn_sinks.weight": _f32(rng, 4),
            b + "attn_q_a.weight": _q8(rng, QL, H),
            b + "attn_q_a_norm.weight": _f32(rng, QL),
            b + "attn_q_b.weight": _q8(rng, 4 * 32, QL),
            b + "attn_kv.weight": _q8(rng, 32, H),
            b + "attn_kv_a_norm.weight": _f32(rng, 32),
            b + "attn_output_a.weight": _q8(rng, 64, 64),
            b + "attn_output_b.weight": _q8(rng, H, 64),
            b + "hc_attn_fn.weight": _f32(rng, 24, 4 * H),
            b + "hc_attn_base.weight": _f32(rng, 24),
            b + "hc_attn_scale.weight": _f32(rng, 3),
            b + "hc_ffn_fn.weight": _f32(rng, 24, 4 * H),
            b + "hc_ffn_base.weight": _f32(rng, 24),
            b + "hc_ffn_scale.weight": _f32(rng, 3),
            b + "attn_compressor_kv.weight": _bf16(rng, 32, H),
            b + "attn_compressor_norm.weight": _f32(rng, 32),
            b + "indexer.attn_q_b.weight": _q8(rng, 64, QL),
            b + "indexer.proj.weight": _bf16(rng, 2, H),
            b + "ffn_norm.weight": _f32(rng, H),
            b + "ffn_gate_inp.weight": _f32(rng, E, H),
            b + "exp_probs_b.bias": _f32(rng, E),
            b + "ffn_gate_exps.weight": _mx(rng, E, I_MOE, H),
            b + "ffn_up_exps.weight": _mx(rng, E, I_MOE, H),
            b + "ffn_down_exps.weight": _mx(rng, E, H, I_MOE),
            b + "ffn_gate_shexp.weight": _q8(rng, I_MOE, H),
            b + "ffn_up_shexp.weight": _q8(rng, I_MOE, H),
            b + "ffn_down_shexp.weight": _q8(rng, H, I_MOE),
        })
    t["blk.1.engram_wkv.weight"] = _q8(rng, H, 64)
    t["blk.1.engram_q.weight"] = _f32(rng, 4, H)
    return t


KV = {"deepseek41.block_count": L, "deepseek41.embedding_length": H, "deepseek41.expert_count": E,
      "deepseek41.attention.q_lora_rank": QL, "deepseek41.expert_feed_forward_length": I_MOE}


@pytest.fixture
def tiny(tmp_path: Path, rng: np.random.Generator) -> tuple[Path, dict]:
    tensors = tiny_v41_tensors(rng)
    tensors["blk.0.some_future_tensor.weight"] = _f32(rng, 4)
    return write_gguf(tmp_path / "DeepSeek-V4.1-Flash-UD-Q4_K_XL.gguf", "deepseek41", tensors, KV), tensors


def test_tiny_v41_loads_to_sglang_names(tiny: tuple[Path, dict]) -> None:
    path, tensors = tiny
    with load_gguf_model(path, draft=False, mmproj=False) as lm:
        assert lm.fp8_block == (32, 32) and lm.quant_config()["weight_block_size"] == [32, 32]
        assert lm.unknown_tensors == ["blk.0.some_future_tensor.weight"]
        assert lm.hparams["num_hidden_layers"] == L and lm.hparams["n_routed_experts"] == E
        out = dict(lm.weights(progress=False))
        ref = open_gguf(path)
    # Dense Q8_0 -> FP8 + block scales, SGLang's Fp8 block layout.
    w, s = out["layers.0.attn.wq_b.weight"], out["layers.0.attn.wq_b.scale"]
    assert w.dtype == torch.float8_e4m3fn and tuple(w.shape) == (128, QL)
    assert s.dtype == torch.float32 and tuple(s.shape) == (4, 1)
    q8 = ref["blk.0.attn_q_b.weight"].dequantize().astype(np.float64)
    err = np.abs(fp8_blocks_dequant(w, s, (32, 32)) - q8)
    assert np.isfinite(err).all() and err.max() <= np.abs(q8).max() * 2.0**-3
    # Embedding / head are float roles: Q8_0 dequantized to bf16 exactly representable? (close)
    emb = out["embed.weight"]
    assert emb.dtype == torch.bfloat16 and tuple(emb.shape) == (V, H)
    np.testing.assert_allclose(emb.float().numpy(), ref["token_embd.weight"].dequantize(), rtol=2**-8, atol=0)
    # F32 / BF16 as stored, bit for bit.
    np.testing.assert_array_equal(out["layers.1.attn_norm.weight"].numpy(), tensors["blk.1.attn_norm.weight"][1])
    assert out["layers.0.hc_attn_fn"].shape == (24, 4 * H)
    cmp = out["layers.0.attn.compressor.wkv.weight"]
    assert cmp.dtype == torch.bfloat16
    np.testing.assert_array_equal(cmp.view(torch.int16).numpy().view(np.uint16), tensors["blk.0.attn_compressor_kv.weight"][1])
    assert "layers.0.ffn.gate.bias" in out and "layers.1.engram.q_weight" in out
    assert out["layers.1.engram.wkv.weight"].dtype == torch.float8_e4m3fn
    # MXFP4 experts: per-expert nibbles + E8M0, bit-exact repack of the GGUF blocks.
    raw = tensors["blk.1.ffn_down_exps.weight"][1]
    for e in range(E):
        p = out[f"layers.1.ffn.experts.{e}.w2.weight"]
        sc = out[f"layers.1.ffn.experts.{e}.w2.scale"]
        assert p.dtype == torch.uint8 and tuple(p.shape) == (H, I_MOE // 2)
        assert tuple(sc.shape) == (H, I_MOE // 32)
        rp, rs = gguf_mxfp4_to_kt(raw[e], H, I_MOE)
        np.testing.assert_array_equal(p.numpy(), rp)
        np.testing.assert_array_equal(sc.view(torch.uint8).numpy(), rs)
    n_expert_tensors = sum(1 for k in out if ".ffn.experts." in k)
    assert n_expert_tensors == L * 3 * E * 2


def test_mxfp4_repack_matches_gguf_py(rng: np.random.Generator) -> None:
    """kt layout decoded in float64 == gguf-py's dequantization of the GGUF blocks."""
    x = rng.standard_normal((48, 128)).astype(np.float32) * 3
    q = gq.quantize(x, gguf.GGMLQuantizationType.MXFP4)
    ref = gq.dequantize(q, gguf.GGMLQuantizationType.MXFP4).astype(np.float64)
    packed, scales = gguf_mxfp4_to_kt(q, 48, 128)
    np.testing.assert_array_equal(dequant_kt_mxfp4(packed, scales), ref)
    # Random blocks (all codes and exponents), not only what the quantizer emits.
    rb = random_blocks(rng, "MXFP4", 48 * 4)
    rb[:, 0] %= 250  # keep gguf-py's float32 reference finite (12 x 2^127 overflows it)
    rb = rb.reshape(48, -1)
    ref = gq.dequantize(rb, gguf.GGMLQuantizationType.MXFP4).astype(np.float64)
    np.testing.assert_array_equal(dequant_kt_mxfp4(*gguf_mxfp4_to_kt(rb, 48, 128)), ref)


@pytest.mark.parametrize("block,shape,fmt", [((32, 32), (96, 160), "ue8m0"), ((128, 128), (200, 96), "ue8m0"),
                                             ((128, 128), (200, 96), "fp32")])
def test_q8_0_to_fp8_error(tmp_path: Path, rng: np.random.Generator, block, shape, fmt) -> None:
    """Added error of Q8_0 -> FP8 e4m3 with block scales, against the Q8_0 values (reported)."""
    tname, q = _q8(rng, *shape)
    p = write_gguf(tmp_path / "d.gguf", "deepseek4", {"w": (tname, q)})
    with open_gguf(p) as m:
        t = m["w"]
        q8 = t.dequantize().astype(np.float64)
        w, s = to_fp8_blocks(t, block, scale_fmt=fmt)
    assert tuple(s.shape) == (-(-shape[0] // block[0]), -(-shape[1] // block[1]))
    if fmt == "ue8m0":
        assert np.all(np.log2(s.numpy()) == np.round(np.log2(s.numpy())))
    deq = fp8_blocks_dequant(w, s, block)
    err = np.abs(deq - q8)
    s_full = np.repeat(np.repeat(s.numpy(), block[0], 0), block[1], 1)[: shape[0], : shape[1]]
    # e4m3: relative rounding <= 2^-4 for normals, absolute <= 2^-10 x scale for subnormals.
    bound = np.maximum(np.abs(q8) * 2.0**-4, s_full * 2.0**-10) * (1 + 1e-6)
    assert np.isfinite(deq).all() and np.all(err <= bound)
    rel_rms = np.sqrt(np.mean(err**2) / np.mean(q8**2))
    print(f"Q8_0->FP8 {block} {fmt}: rel RMS error {rel_rms:.4f}, max abs {err.max():.3g}")
    assert 0 < rel_rms < 0.04


def test_missing_required_named_at_once(tmp_path: Path, rng: np.random.Generator) -> None:
    tensors = tiny_v41_tensors(rng)
    for name in ("output.weight", "blk.1.attn_q_a.weight", "blk.0.ffn_up_exps.weight"):
        del tensors[name]
    p = write_gguf(tmp_path / "broken.gguf", "deepseek41", tensors, KV)
    with pytest.raises(GGUFError) as ei:
        load_gguf_model(p, draft=False, mmproj=False)
    msg = str(ei.value)
    assert "3 required tensor(s) missing" in msg and str(p) in msg
    for name in ("output.weight", "blk.1.attn_q_a.weight", "blk.0.ffn_up_exps.weight"):
        assert name in msg


def test_alias_names_of_other_forks() -> None:
    plan = plan_names(["blk.0.attn_kv_norm.weight", "blk.3.engram_kv.weight", "blk.3.indexer.wk.weight"], 0)
    assert plan.mapped["blk.0.attn_kv_norm.weight"].target == "layers.0.attn.kv_norm.weight"
    assert plan.mapped["blk.3.engram_kv.weight"].target == "layers.3.engram.wkv.weight"
    assert plan.mapped["blk.3.indexer.wk.weight"].target == "layers.3.attn.indexer.wk.weight"
    with pytest.raises(GGUFError, match="both map to"):
        plan_names(["blk.0.attn_kv_norm.weight", "blk.0.attn_kv_a_norm.weight"], 0)


def test_engram_table_is_row_accessed(tmp_path: Path, rng: np.random.Generator) -> None:
    from winport.gguf.engram_rows import EngramRows, EngramSource
    from winport.gguf.to_checkpoint import EngramStream

    rows = 1000
    raw = random_blocks(rng, "MXFP8", rows)  # one 256-value row = one MXFP8 block (264 B)
    p = write_raw_gguf(tmp_path / "eng.gguf", {"general.architecture": "deepseek41"},
                       [("blk.1.engram_embd.weight", "MXFP8", (rows, 256), raw.tobytes())])
    with open_gguf(p) as m:
        t = m["blk.1.engram_embd.weight"]
        assert t.shape[0] == rows and t.ggml_dims[0] == 256
        # Served rows: gathered through the memory map (what engram_sources records for the table).
        tab = EngramRows(EngramSource(layer=1, target="layers.1.engram.embed", path=str(p), tensor=t.name,
                                      offset=t.offset, nbytes=t.nbytes, type=t.type.name, rows=rows, dim=256,
                                      file_size=p.stat().st_size))
        idx = rng.integers(0, rows, 17)
        w, s = tab.gather(torch.from_numpy(idx))
        np.testing.assert_array_equal(w.view(torch.uint8).numpy(), raw[idx, 8:])
        np.testing.assert_array_equal(s.view(torch.uint8).numpy(), raw[idx, :8])
        vals = (w.double() * s.double().repeat_interleave(32, dim=1)).numpy()
        ref = torch.from_numpy(raw[idx, 8:].copy()).view(torch.float8_e4m3fn).double().numpy()
        ref = ref * np.repeat(2.0 ** (raw[idx, :8].astype(np.float64) - 127), 32, axis=1)
        np.testing.assert_array_equal(vals, ref)
        tab.close()
        # Copied rows (engram="copy"): chunks of 300 rows' blocks cover every row once, in order.
        stream = EngramStream("layers.1.engram.embed", t, rows, 256, chunk_bytes=300 * 264)
        assert [part[1:] for part in stream.parts] == [("F8_E4M3", [rows, 256], rows * 256),
                                                       ("F8_E8M0", [rows, 8], rows * 8)]
        chunks = list(stream.chunks())
        assert [c[0] for c in chunks] == [0, 300 * 256, 600 * 256, 900 * 256]
        assert chunks[3][1].shape == (100 * 256,) and chunks[3][2].shape == (100 * 8,)
        np.testing.assert_array_equal(np.concatenate([c[1] for c in chunks]), raw[:, 8:].reshape(-1))
        np.testing.assert_array_equal(np.concatenate([c[2] for c in chunks]), raw[:, :8].reshape(-1))


def test_tokenizer_from_metadata(tmp_path: Path, rng: np.random.Generator) -> None:
    from tokenizers import Tokenizer
    from tokenizers.pre_tokenizers import ByteLevel

    alphabet = ByteLevel.alphabet()
    tokens = sorted(alphabet) + ["he", "ll", "hell", "hello", "Ġw", "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"]
    merges = ["h e", "l l", "he ll", "hell o", "Ġ w"]
    types = [1] * (len(tokens) - 2) + [3, 3]
    kv = {"general.architecture": "deepseek41", "tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "deepseek-v3",
          "tokenizer.ggml.tokens": tokens, "tokenizer.ggml.merges": merges, "tokenizer.ggml.token_type": types,
          "tokenizer.ggml.bos_token_id": len(tokens) - 2, "tokenizer.ggml.eos_token_id": len(tokens) - 1,
          "tokenizer.chat_template": "{% for m in messages %}{{ m['content'] }}{% endfor %}"}
    tensors = tiny_v41_tensors(rng)
    p = write_gguf(tmp_path / "tok.gguf", "deepseek41", tensors, {**KV, **kv})
    with load_gguf_model(p, draft=False, mmproj=False) as lm:
        d = lm.tokenizer_dir(tmp_path / "cache")
    tok = Tokenizer.from_file(str(d / "tokenizer.json"))
    enc = tok.encode("hello world 123")
    assert tok.decode(enc.ids) == "hello world 123"
    assert enc.ids[0] == tokens.index("hello") and tokens.index("Ġw") in enc.ids
    assert tok.encode("<｜end▁of▁sentence｜>").ids == [len(tokens) - 1]
    import json

    cfg = json.loads((d / "tokenizer_config.json").read_text(encoding="utf-8"))
    assert cfg["eos_token"] == "<｜end▁of▁sentence｜>" and "messages" in cfg["chat_template"]


def test_draft_and_mmproj_found_next_to_model(tiny: tuple[Path, dict], rng: np.random.Generator) -> None:
    path, _ = tiny
    draft = {"blk.0.attn_norm.weight": _f32(rng, H), "blk.0.attn_q_a.weight": _q8(rng, QL, H)}
    write_gguf(path.parent / "DeepSeek-V4.1-Flash-DSpark-Q8_0.gguf", "deepseek41", draft)
    write_gguf(path.parent / "mmproj-BF16.gguf", "clip", {"v.blk.0.attn_q.weight": _bf16(rng, 32, 32)})
    with load_gguf_model(path.parent) as lm:
        assert lm.draft is not None and lm.mmproj is not None
        names = dict(lm.draft_weights(progress=False))
        assert set(names) == {"mtp.0.attn_norm.weight", "mtp.0.attn.wq_a.weight", "mtp.0.attn.wq_a.scale"}
        # A projector without the DeepSeek-V4.1 vision tensors is named as unusable (the full
        # sidecar conversions are tested in test_sidecars.py).
        with pytest.raises(GGUFError, match=r"mmproj-BF16\.gguf: not a usable DeepSeek-V4\.1 vision projector"):
            dict(lm.mmproj_weights())


def test_cli_info_and_dump(tiny: tuple[Path, dict], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path, tensors = tiny
    assert info_main([str(path)]) == 0
    out = capsys.readouterr().out
    assert "blk.0.attn_q_b.weight" in out and "layers.0.attn.wq_b.weight [fp8]" in out
    assert "1 unmapped tensor(s): blk.0.some_future_tensor.weight" in out
    npy = tmp_path / "x.npy"
    assert dump_main([str(path), "blk.1.ffn_gate_exps.weight", "--npy", str(npy)]) == 0
    arr = np.load(npy)
    ref = gq.dequantize(tensors["blk.1.ffn_gate_exps.weight"][1], gguf.GGMLQuantizationType.MXFP4)
    np.testing.assert_array_equal(arr, ref)
    assert dump_main([str(path), "nope", "--npy", str(npy)]) == 2
    r = subprocess.run([sys.executable, "-m", "winport.gguf", "info", str(path), "--no-tensors"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "deepseek41.block_count" in r.stdout


def test_cli_info_shows_the_cache(tiny: tuple[Path, dict], tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """`winport gguf info` says what winport's GGUF cache holds."""
    path, _ = tiny
    monkeypatch.setenv("WINPORT_CACHE", str(tmp_path / "cache"))
    (tmp_path / "cache" / "gguf" / "k1").mkdir(parents=True)
    (tmp_path / "cache" / "gguf" / "k1" / "config.json").write_bytes(b"x" * 2_500_000)
    assert info_main([str(path), "--no-tensors"]) == 0
    assert "1 folder(s), 2.5 MB" in capsys.readouterr().out


def _prefetch_log(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Record the tensors GGUFTensor.prefetch is asked for, in order (and prefetch nothing)."""
    from winport.gguf import reader

    log: list[str] = []
    monkeypatch.setattr(reader.GGUFTensor, "prefetch", lambda self: log.append(self.name))
    return log


def test_loading_prefetches_each_tensor_before_it_converts(tiny: tuple[Path, dict],
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """The load stream asks the OS for every tensor it reads whole before it converts that tensor
    (the next one's reads then overlap this one's conversion), in file order, each once."""
    path, _ = tiny
    log = _prefetch_log(monkeypatch)
    with load_gguf_model(path, draft=False, mmproj=False) as lm:
        streamed = [t.name for t in sorted((lm.model[g] for g, m in lm.plan.mapped.items() if m.role != "engram"),
                                           key=lambda t: t.offset)]
        seen: list[str] = []
        it = lm.weights(progress=False)
        for _ in it:
            seen.append(log[-1])
    assert log == streamed, "every streamed tensor prefetched once, in file order"
    # Prefetched ahead: after the first tensor's outputs, the second one was asked for already.
    assert seen[0] == streamed[1]


def test_loading_only_some_experts_does_not_prefetch_their_whole_tensor(tiny: tuple[Path, dict],
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """With an expert filter (the GPU's experts; kt-kernel reads the rest later) the expert tensors
    are read in part, so a whole-tensor prefetch would read bytes nobody asked for."""
    path, _ = tiny
    log = _prefetch_log(monkeypatch)
    with load_gguf_model(path, draft=False, mmproj=False) as lm:
        experts = {lm.model[g].name for g, m in lm.plan.mapped.items() if m.role == "experts"}
        assert experts
        for _ in lm.weights(progress=False, expert_filter=lambda layer, e: e == 0):
            pass
    assert log and not experts & set(log)
