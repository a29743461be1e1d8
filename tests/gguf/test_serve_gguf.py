"""The demo model in GGUF form serves exactly like its safetensors form (issue 6's acceptance).

The GGUF files are written by winport.gguf.export (gguf-py's writer underneath) from the demo
checkpoint; winport.gguf.to_checkpoint turns them back into a folder SGLang loads. Checked here:
- BF16 variant: every tensor comes back bit for bit with its dtype, config.json is the same dict,
  the tokenizer gives the same ids and carries the same chat template;
- Q8_0 variant: the dense linear weights equal gguf-py's own dequantization of the Q8_0 bytes
  (read with gguf-py's reader, not ours), everything else is still bit for bit;
- live: `winport serve --model demo.gguf` and `winport serve --demo` (one after the other: the
  machines have 2 cores) return the same output ids and the same prompt logprobs, float for float.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from tests.gguf._helpers import assert_served_without_a_copy, folder_bytes
from tests.helpers import REPO_ROOT

CACHE = REPO_ROOT / ".cache" / "winport-test-gguf"
START_TIMEOUT_S = 900
TEXTS = [
    "The server loads 42 weights.",
    "def main():\n    return x + y  \n\n",
    "hello world? 12345 deepseek, it's <｜User｜>fast<｜Assistant｜> 日本",
]


@pytest.fixture(scope="module")
def demo_dir() -> Path:
    from winport.demo.build import ensure_demo

    # the bf16 form of the demo (GGUF export takes plain weights; see winport.demo.build)
    return ensure_demo("v4", CACHE / "demo-v4-bf16", quantized=False)


@pytest.fixture(scope="module")
def bf16_gguf(demo_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from winport.gguf.export import export_demo_gguf

    return export_demo_gguf(tmp_path_factory.mktemp("gguf") / "demo-BF16.gguf", folder=demo_dir)


@pytest.fixture(scope="module")
def q8_gguf(demo_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from winport.gguf.export import export_demo_gguf

    return export_demo_gguf(tmp_path_factory.mktemp("gguf") / "demo-Q8_0.gguf", folder=demo_dir, dense_q8_0=True)


def _convert(path: Path, tmp_path: Path) -> Path:
    from winport.gguf.to_checkpoint import gguf_to_checkpoint

    return gguf_to_checkpoint(path, cache=tmp_path / "cache", progress=False)


def _load(folder: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(folder / "model.safetensors"))


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and \
        bytes(a.contiguous().view(-1).view(torch.uint8).numpy()) == bytes(b.contiguous().view(-1).view(torch.uint8).numpy())


def test_bf16_round_trip_is_bit_identical(demo_dir: Path, bf16_gguf: Path, tmp_path: Path) -> None:
    import gguf

    # The file really uses llama.cpp's names and keeps the stored types.
    r = gguf.GGUFReader(str(bf16_gguf))
    types = {t.name: t.tensor_type.name for t in r.tensors}
    assert types["token_embd.weight"] == "BF16" and types["blk.0.attn_sinks.weight"] == "F32"
    assert types["blk.1.ffn_gate_exps.weight"] == "BF16" and types["blk.0.ffn_gate_tid2eid.weight"] == "I32"
    assert "deepseek4.attention.compress_ratios" in r.fields

    folder = _convert(bf16_gguf, tmp_path)
    ref, got = _load(demo_dir), _load(folder)
    assert sorted(ref) == sorted(got)
    differ = [k for k in ref if not _same_bits(ref[k], got[k])]
    assert not differ, f"{len(differ)} tensors differ, e.g. {differ[:5]}"
    assert json.loads((folder / "config.json").read_text()) == json.loads((demo_dir / "config.json").read_text())


def test_tokenizer_from_metadata_encodes_identically(demo_dir: Path, bf16_gguf: Path, tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    folder = _convert(bf16_gguf, tmp_path)
    ref = AutoTokenizer.from_pretrained(str(demo_dir))
    got = AutoTokenizer.from_pretrained(str(folder))
    for text in TEXTS:
        assert got.encode(text) == ref.encode(text), text
        ids = ref.encode(text)
        assert got.decode(ids) == ref.decode(ids)
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hello world?"}]
    assert got.apply_chat_template(messages, add_generation_prompt=True, tokenize=False) == \
        ref.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert (got.bos_token_id, got.eos_token_id, got.pad_token_id) == (ref.bos_token_id, ref.eos_token_id, ref.pad_token_id)


def test_q8_0_weights_equal_gguf_py_dequantization(demo_dir: Path, q8_gguf: Path, tmp_path: Path) -> None:
    import gguf

    from winport.gguf.export import gguf_name

    r = gguf.GGUFReader(str(q8_gguf))
    by_name = {t.name: t for t in r.tensors}
    ref, got = _load(demo_dir), _load(_convert(q8_gguf, tmp_path))
    n_q8 = 0
    for name, tensor in ref.items():
        g, role, expert = gguf_name(name)
        t = by_name[g]
        if t.tensor_type == gguf.GGMLQuantizationType.Q8_0:
            n_q8 += 1
            want = gguf.quants.dequantize(np.array(t.data), t.tensor_type).reshape(tensor.shape)
            assert got[name].dtype == torch.bfloat16
            assert torch.equal(got[name], torch.from_numpy(want).to(torch.bfloat16)), name
            # And Q8_0 is a close copy of the original (sanity: the right tensor in the right place).
            assert torch.allclose(got[name].float(), tensor.float(), rtol=0.02, atol=0.02), name
        else:
            assert role != "fp8" or tensor.shape[-1] % 32, f"{name} should have been Q8_0"
            assert _same_bits(ref[name], got[name]), name
    # Every dense linear weight (attention, indexer wq_b, shared experts) went through Q8_0.
    assert n_q8 == sum(gguf_name(n)[1] == "fp8" for n in ref) > 0


def test_conversion_is_cached_and_errors_name_the_tensor(demo_dir: Path, bf16_gguf: Path, tmp_path: Path) -> None:
    from winport.gguf import GGUFError
    from winport.gguf.to_checkpoint import STAMP

    first = _convert(bf16_gguf, tmp_path)
    stamp_mtime = (first / STAMP).stat().st_mtime_ns
    assert _convert(bf16_gguf, tmp_path) == first
    assert (first / STAMP).stat().st_mtime_ns == stamp_mtime  # not converted again

    # A GGUF without a required tensor fails before any data is read, naming the tensor.
    from safetensors.torch import save_file

    from winport.gguf.export import checkpoint_to_gguf

    demo, src = tmp_path / "broken-src", demo_dir
    demo.mkdir()
    for f in src.iterdir():
        if f.suffix != ".safetensors":
            shutil.copyfile(f, demo / f.name)
    tensors = {k: v for k, v in _load(src).items() if k != "layers.2.attn.wq_b.weight"}
    save_file(tensors, str(demo / "model.safetensors"))
    broken = checkpoint_to_gguf(demo, tmp_path / "broken.gguf")
    with pytest.raises(GGUFError, match=r"blk\.2\.attn_q_b\.weight"):
        _convert(broken, tmp_path)
    assert not list((tmp_path / "cache" / "gguf").glob("*.partial"))


def test_build_plan_converts_a_gguf(bf16_gguf: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from winport.serve.command import ServeError, build_plan

    monkeypatch.setenv("WINPORT_CACHE", str(tmp_path / "cache"))
    plan = build_plan(["--model", str(bf16_gguf), "--device", "cpu"])
    assert (plan.model_path / "config.json").exists()
    assert plan.argv[plan.argv.index("--model-path") + 1] == str(plan.model_path)
    assert plan.argv[plan.argv.index("--served-model-name") + 1] == "demo-BF16"
    # Experts not MXFP4: bf16 dense weights, no FP8 quantization_config (test_v41_ud_mix: the MXFP4 case).
    assert "quantization_config" not in json.loads((plan.model_path / "config.json").read_text())
    with pytest.raises(ServeError, match="no such file"):
        build_plan(["--model", str(bf16_gguf), "--device", "cpu", "--draft-model", str(tmp_path / "nope.gguf")])


def test_build_plan_opens_the_gguf_once(bf16_gguf: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`winport serve` opens the GGUF once, whether its small folder is written or found in the cache
    (each SGLang scheduler opens it once more, in winport.gguf.direct.weights)."""
    from winport.gguf import reader
    from winport.serve.command import build_plan

    opened: list[str] = []
    real_init = reader.GGUFFile.__init__

    def counting_init(self: Any, path: Any, *args: Any, **kwargs: Any) -> None:
        opened.append(str(path))
        real_init(self, path, *args, **kwargs)

    monkeypatch.setattr(reader.GGUFFile, "__init__", counting_init)
    monkeypatch.setenv("WINPORT_CACHE", str(tmp_path / "cache"))
    for _ in ("written", "cached"):
        opened.clear()
        build_plan(["--model", str(bf16_gguf), "--device", "cpu"])
        assert opened == [str(bf16_gguf)]


# --- live: both servers, one after the other ---------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _serve_and_ask(source: list[str], body: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """Start `winport serve <source>`, POST /generate once, stop it with Ctrl-C; (reply, output)."""
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("WINPORT_", "SGLANG_"))}
    env.update({"WINPORT_EMULATE_WINDOWS": "1", "WINPORT_CACHE": str(CACHE), "PYTHONUNBUFFERED": "1"})
    cmd = [sys.executable, "-m", "winport", "serve", *source, "--port", str(port)]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=REPO_ROOT)
    out: list[str] = []
    threading.Thread(target=lambda: out.extend(iter(proc.stdout.readline, "")), daemon=True).start()
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while "winport serve: ready at" not in "".join(out):
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"{' '.join(source)}: not ready (exit {proc.poll()}):\n{''.join(out)[-6000:]}")
            time.sleep(1)
        req = urllib.request.Request(f"http://127.0.0.1:{port}/generate", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=300) as resp:  # noqa: S310 - loopback only
            reply = json.loads(resp.read())
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
    return reply, "".join(out)


def assert_gguf_serves_like_safetensors(gguf: Path, folder: Path, ids: list[int]) -> None:
    """Serve `gguf` (straight from the file, through the server path) and `folder`; 8 greedy tokens and
    every prompt and output log-probability must be identical, and no weight copy is cached."""
    body = {"input_ids": ids, "sampling_params": {"max_new_tokens": 8, "temperature": 0},
            "return_logprob": True, "logprob_start_len": 0}
    before = folder_bytes(CACHE)
    from_gguf, log = _serve_and_ask(["--model", str(gguf)], body)
    assert "no copy" in log
    assert_served_without_a_copy(log, gguf, folder_bytes(CACHE) - before)
    from_st, _ = _serve_and_ask(["--model", str(folder)], body)

    def out_ids(r: dict[str, Any]) -> list[int]:
        return r.get("output_ids") or [t[1] for t in r["meta_info"]["output_token_logprobs"]]

    assert len(out_ids(from_st)) == 8
    assert out_ids(from_gguf) == out_ids(from_st)
    lp_gguf = from_gguf["meta_info"]["input_token_logprobs"]
    lp_st = from_st["meta_info"]["input_token_logprobs"]
    assert len(lp_st) == len(ids)
    assert all(v[0] is None or math.isfinite(v[0]) for v in lp_st)
    assert lp_gguf == lp_st
    assert from_gguf["meta_info"]["output_token_logprobs"] == from_st["meta_info"]["output_token_logprobs"]


def test_gguf_server_equals_safetensors_server(demo_dir: Path, bf16_gguf: Path) -> None:
    from transformers import AutoTokenizer

    shutil.rmtree(CACHE / "gguf", ignore_errors=True)  # convert through the server path every run
    tok = AutoTokenizer.from_pretrained(str(demo_dir))
    ids = [tok.bos_token_id, *tok.encode(TEXTS[0] + " " + TEXTS[2])]
    assert_gguf_serves_like_safetensors(bf16_gguf, demo_dir, ids)
