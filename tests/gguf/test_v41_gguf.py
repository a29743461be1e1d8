"""The V4.1 demo in GGUF form, with llama.cpp's ``deepseek41`` names, loads and serves (issue 6).

winport.gguf.export writes the v41 demo (winport.demo.config_v41 / weights_v41) as a
``deepseek41`` GGUF: its ratio-1/2 compressors and indexers under llama.cpp's tensor names, the
kv/index source layers and the engram layout as hparams, the engram table as MXFP8 (fork type 43:
8 E8M0 scales then 256 e4m3 values per block; the demo's 64-value rows are packed four to a
block, see export.engram_gguf_shape); its DSpark draft stages (mtp.*), when the demo bundles them, go
to a draft GGUF next to it. winport.gguf.to_checkpoint turns both back into one folder.
Checked here:
- every tensor comes back bit for bit with its name, shape and dtype (the demo's dense weights are
  bf16, its engram FP8 + E8M0: all lossless in GGUF), config.json is the demo's dict, and SGLang's
  DeepseekV41Config and EngramLayout accept it;
- the MXFP8 bytes in the file decode (winport's MXFP8 dequantizer, checked against the format
  definition in test_dequant.py) to the table's values computed independently in float64 from the
  safetensors FP8 rows and E8M0 scales;
- ``winport demo-model --variant v41 --gguf`` writes the file;
- live (in CI, 90 s on a quiet 2-core machine: two v41 servers one after the other): `winport serve --model
  v41.gguf` and `winport serve --model <v41 demo folder>` give the same greedy tokens and the same
  prompt logprobs, float for float.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.helpers import REPO_ROOT

CACHE = REPO_ROOT / ".cache" / "winport-test-gguf-v41"


@pytest.fixture(scope="module")
def demo_dir() -> Path:
    from winport.demo.build import ensure_demo

    return ensure_demo("v41", CACHE / "demo-v41-bf16", quantized=False)


@pytest.fixture(scope="module")
def v41_gguf(demo_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from winport.gguf.export import export_demo_gguf

    return export_demo_gguf(tmp_path_factory.mktemp("gguf") / "demo-v41-BF16.gguf", folder=demo_dir, variant="v41")


@pytest.fixture(scope="module")
def converted(v41_gguf: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from winport.gguf.to_checkpoint import gguf_to_checkpoint

    # draft=None: the demo's DSpark draft (when it bundles one) is exported next to the model GGUF.
    return gguf_to_checkpoint(v41_gguf, cache=tmp_path_factory.mktemp("cache"), progress=False, draft=None)


def _load(folder: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    out: dict[str, torch.Tensor] = {}
    for f in sorted(folder.glob("*.safetensors")):
        out.update(load_file(str(f)))
    return out


def _bits(t: torch.Tensor) -> bytes:
    return bytes(t.contiguous().view(-1).view(torch.uint8).numpy())


def test_file_uses_deepseek41_names_hparams_and_mxfp8(v41_gguf: Path) -> None:
    from winport.gguf.reader import open_gguf

    with open_gguf(v41_gguf) as m:
        meta, tensors = m.metadata, m.tensors
        types = {n: t.type.name for n, t in tensors.items()}
        shapes = {n: tuple(t.shape) for n, t in tensors.items()}
    assert meta["general.architecture"] == "deepseek41"
    assert list(meta["deepseek41.attention.compress_ratios"]) == [0, 2, 2, 1, 1, 0]
    assert list(meta["deepseek41.kv_source_layer_ids"]) == [1, 3]
    assert list(meta["deepseek41.index_source_layer_ids"]) == [1, 3, 4]
    assert list(meta["deepseek41.engram.layer_ids"]) == [2]
    assert meta["deepseek41.engram.pad_id"] == 2 and meta["deepseek41.engram.compressed_vocab_size"] == 937
    # V4.1-only tensors under llama.cpp's names: ratio-2 compressor with gate, ratio-1 without.
    assert {"blk.1.attn_compressor_kv.weight", "blk.1.attn_compressor_gate.weight",
            "blk.1.attn_compressor_norm.weight", "blk.3.attn_compressor_kv.weight",
            "blk.3.indexer.attn_k.weight", "blk.4.indexer.attn_q_b.weight", "blk.4.indexer.proj.weight",
            "blk.2.engram_wkv.weight", "blk.2.engram_q.weight", "blk.2.engram_k.weight"} <= set(types)
    assert "blk.3.attn_compressor_gate.weight" not in types and "blk.4.indexer.attn_k.weight" not in types
    assert not any(n.startswith("output_hc_") for n in types)
    # 3198 rows x 64 values = 799.5 blocks of 256: packed into 800 GGUF rows, the last half padded.
    assert types["blk.2.engram_embd.weight"] == "MXFP8" and shapes["blk.2.engram_embd.weight"] == (800, 256)


def test_round_trip_is_bit_identical_and_the_config_is_v41(demo_dir: Path, converted: Path) -> None:
    from winport.gguf.engram_rows import SIDECAR, EngramRows, read_sources

    ref, got = _load(demo_dir), _load(converted)
    engram = {"layers.2.engram.embed.weight", "layers.2.engram.embed.scale"}
    assert engram <= set(ref) and sorted(set(ref) - engram) == sorted(got), \
        "every tensor but the engram table is in the converted shards"
    differ = [k for k in got if (ref[k].dtype, ref[k].shape) != (got[k].dtype, got[k].shape) or _bits(ref[k]) != _bits(got[k])]
    assert not differ, f"{len(differ)} tensors differ, e.g. {differ[:5]}"
    # The engram table stayed in the GGUF: every row read through the map is the demo's, bit for bit.
    source = read_sources(converted / SIDECAR)[2]
    assert source.path.endswith("demo-v41-BF16.gguf") and (source.rows, source.dim, source.type) == (3198, 64, "MXFP8")
    table = EngramRows(source)
    w, s = table.gather(torch.arange(source.rows))
    assert w.dtype == torch.float8_e4m3fn and s.shape == (3198, 2)
    assert _bits(w) == _bits(ref["layers.2.engram.embed.weight"]) and _bits(s) == _bits(ref["layers.2.engram.embed.scale"])
    table.close()
    want = json.loads((demo_dir / "config.json").read_text())
    have = json.loads((converted / "config.json").read_text())
    assert have == want
    for key in ("model_type", "architectures", "compress_ratios", "kv_source_layer_ids", "index_source_layer_ids",
                "engram_layer_ids", "engram_num_embeddings", "engram_max_ngram_size", "engram_vocab_size",
                "engram_n_heads", "engram_head_dim", "engram_pad_token_id", "engram_compressed_vocab_size"):
        assert key in have and have[key] == want[key], key
    assert have["model_type"] == "deepseek_v41"


def test_sglang_accepts_the_converted_config(converted: Path) -> None:
    from sglang.srt.configs.deepseek_v41 import DeepseekV41Config
    from sglang.srt.layers.engram import EngramLayout

    cfg = json.loads((converted / "config.json").read_text())
    c = DeepseekV41Config(**cfg)
    assert list(c.compress_ratios) == cfg["compress_ratios"] and c.model_type == "deepseek_v41"
    assert (c.engram_pad_token_id, c.engram_compressed_vocab_size) == (cfg["engram_pad_token_id"], 937)
    layout = EngramLayout.from_config(c)
    assert list(layout.num_embeddings) == cfg["engram_num_embeddings"]


def test_mxfp8_table_decodes_to_the_demo_values(demo_dir: Path, v41_gguf: Path) -> None:
    """GGUF MXFP8 blocks, dequantized by winport, vs float64 fp8 x 2^(e - 127) from the safetensors."""
    from winport.gguf.dequant import dequantize
    from winport.gguf.reader import open_gguf

    ref = _load(demo_dir)
    w = ref["layers.2.engram.embed.weight"].to(torch.float64)
    e = ref["layers.2.engram.embed.scale"].view(torch.uint8).to(torch.float64)
    want = (w.view(w.shape[0], -1, 32) * torch.exp2(e - 127).unsqueeze(-1)).reshape(-1).numpy()
    with open_gguf(v41_gguf) as m:
        t = m.tensors["blk.2.engram_embd.weight"]
        raw = np.ascontiguousarray(t.raw())
        got = dequantize(raw, t.type.id, tuple(t.shape), name=t.name, path=t.path).reshape(-1)
    assert np.isfinite(got).all()
    np.testing.assert_array_equal(got[: want.size].astype(np.float64), want)
    assert not got[want.size :].any()  # the padding of the last block is zeros


def test_engram_gguf_shape() -> None:
    from winport.gguf import GGUFError
    from winport.gguf.export import engram_gguf_shape

    assert engram_gguf_shape(1000, 256) == (1000, 256)  # V4.1-Flash: one block per row, as stored
    assert engram_gguf_shape(1000, 512) == (1000, 512)
    assert engram_gguf_shape(2094, 64) == (524, 256)
    assert engram_gguf_shape(4, 128) == (2, 256)
    with pytest.raises(GGUFError, match="engram row width 96"):
        engram_gguf_shape(10, 96)


def test_wrong_engram_rows_hparam_is_a_clear_error(converted: Path, v41_gguf: Path) -> None:
    from winport.gguf import GGUFError
    from winport.gguf.convert import load_gguf_model
    from winport.gguf.to_checkpoint import engram_tensors

    cfg = json.loads((converted / "config.json").read_text())
    loaded = load_gguf_model(v41_gguf)
    try:
        assert [p[0] for g in engram_tensors(loaded, cfg) for p in g.parts] == ["layers.2.engram.embed.weight",
                                                                                "layers.2.engram.embed.scale"]
        with pytest.raises(GGUFError, match=r"blk\.2\.engram_embd\.weight.*MXFP8 blocks"):
            engram_tensors(loaded, {**cfg, "engram_num_embeddings": [cfg["engram_num_embeddings"][0] + 8]})
        with pytest.raises(GGUFError, match="engram hparams"):
            engram_tensors(loaded, {k: v for k, v in cfg.items() if k != "engram_head_dim"})
    finally:
        loaded.close()


def test_demo_model_command_writes_the_v41_gguf(demo_dir: Path, tmp_path: Path) -> None:
    from winport.demo.command import main
    from winport.gguf.reader import open_gguf

    out = tmp_path / "v41.gguf"
    assert main(["--variant", "v41", "--out", str(demo_dir), "--gguf", str(out)]) == 0
    with open_gguf(out) as m:
        assert m.metadata["general.architecture"] == "deepseek41"
        assert "blk.2.engram_embd.weight" in m.tensors


# --- live: both servers, one after the other ---------------------------------------------------


def test_v41_gguf_server_equals_safetensors_server(demo_dir: Path, v41_gguf: Path) -> None:
    from tokenizers import Tokenizer

    from tests.gguf.test_serve_gguf import TEXTS, assert_gguf_serves_like_safetensors

    shutil.rmtree(REPO_ROOT / ".cache" / "winport-test-gguf" / "gguf", ignore_errors=True)
    # transformers' AutoTokenizer does not know model_type deepseek_v41: the tokenizers library directly.
    tok = Tokenizer.from_file(str(demo_dir / "tokenizer.json"))
    bos = json.loads((demo_dir / "config.json").read_text())["bos_token_id"]
    ids = [bos, *tok.encode(TEXTS[0] + " " + TEXTS[2], add_special_tokens=False).ids]
    assert_gguf_serves_like_safetensors(v41_gguf, demo_dir, ids)
