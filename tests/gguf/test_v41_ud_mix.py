"""The V4.1 demo as a GGUF in UD-Q4_K_XL's quant mix (Q8_0 dense + MXFP4 routed experts) loads and serves
(issue 6: "a GGUF with the real V4.1-Flash tensor names and quant types at tiny dims loads and serves").

``winport demo-model --variant v41 --gguf X --q8-0 --mxfp4-experts`` writes the v41 demo with llama.cpp's
``deepseek41`` names, its dense linear weights as Q8_0 and its stacked routed experts as MXFP4 (both by
gguf-py's quantizers). What `winport serve --model X.gguf` then runs, read from the code:

- winport.gguf.to_checkpoint converts with ``dense_fp8=None``: MXFP4 experts make it write block FP8
  dense weights ([32, 32] blocks, power-of-two scales, from the Q8_0 values) and the FP8
  quantization_config, the only config under which SGLang 0.5.23 loads DeepSeek's packed FP4 experts
  (before this, the converted folder had no quantization_config and SGLang failed at load on the
  packed expert rows). The experts are repacked bytes (no arithmetic).
- SGLang on CPU then runs the FP8 linears as W8A16 and the FP4 experts as W4A16 (winport.patches
  cpu_fp8_block_linear / cpu_mxfp4_moe): the path of the demo's own FP8 + MXFP4 safetensors
  checkpoint. So that checkpoint's server is the reference, not the bf16 demo's: the bf16 form runs
  SGLang's unquantized linears and MoE, whose arithmetic differs (measured, 29 prompt positions: median
  0.031 nat from the FP8 + MXFP4 server, greedy tokens equal).

Checked here, without a server:
- the MXFP4 export is lossless for the demo: the demo's bf16 experts are MXFP4 values, and the GGUF
  blocks hold the very E8M0 exponents and E2M1 codes of the demo's own MXFP4 checkpoint (compared
  byte by byte after the nibble reorder, the reorder written here from the format definitions), and
  gguf-py dequantizes them to the bf16 demo's values; a row width that is no multiple of 32 is a
  GGUFError naming the tensor;
- the folder the server path converts from the Q8_0 + MXFP4 file holds exactly the expected values:
  experts byte for byte the demo's MXFP4 checkpoint, each dense weight the FP8 blocks of gguf-py's
  dequantization of its Q8_0 bytes (quantized here with winport.demo.quantize, not the loader's
  code), everything else bit for bit; from a BF16-dense + MXFP4 file every value is the demo's FP8 +
  MXFP4 checkpoint's (so that file serves float for float like the demo: checked live once, 29
  prompt log-probabilities and 8 greedy tokens identical; not in CI, to save a server start);
- gguf-py's quantizer run in row chunks (bounded memory) gives the bytes of one whole-tensor call.

Live (in CI; three v41 servers one after the other: the module took 2 min 26 s on the 2-core dev machine,
3 min 17 s while other tests loaded it):
- `winport serve --model <UD-mix GGUF>` converts the file (fresh cache) and answers /generate and an
  OpenAI chat completion;
- its prompt log-probabilities (66 positions) are compared with the demo's FP8 + MXFP4 safetensors
  server. They differ (Q8_0's rounding, then e4m3's, in every dense weight), so the bound comes from a
  control: a third server runs the demo with its dense weights through the same kind of rounding at
  twice the step (Q8_0's round trip with |q| <= 63 instead of 127, then the same FP8 blocks), built
  here from the bf16 demo, independently of the exporter. To first order log-probabilities move in
  proportion to the weight error, so the control moves them further; the GGUF's median |difference|
  must not exceed the control's. The premise is checked on the weights: in every dense tensor the
  control's RMS error is more than 1.5x the GGUF's (measured: at least 2.81x; more than 2x because
  e4m3 snaps many of Q8_0's small errors back to the demo's value, fewer of the control's). Measured
  (2026-11-30): GGUF median 0.0387 nat (max 0.61, one routing flip), control 0.0980 (2.5x);
  the same statistic against the reference shifted by one position (a real error: every position
  off) is 1.03 and must fail the bound.
- greedy tokens (SGLang's /generate from the prompt ids, temperature 0, top-20 log-probabilities by
  token id: the chat API names tokens by text, and byte-fallback tokens all read as the replacement
  character there): equal to the reference's up to the first step where the two disagree, and there
  it must be a near-tie on both servers: each rates the other's pick within the largest move the
  control's rounding caused at any prompt position (0.74 nat) of its own. Measured (demo format 5):
  8 of 8 tokens equal. (With the previous demo weights: 4 of 8 equal, then a pick 0.17 nat apart on
  the reference and 0.08 on the GGUF; the random demo's next-token distributions are nearly flat.)
"""

from __future__ import annotations

import json
import shutil
import signal
import statistics
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gguf
import gguf.quants as gq
import numpy as np
import pytest
import torch

from tests.gguf._helpers import assert_served_without_a_copy, folder_bytes, served_tensors
from tests.helpers import REPO_ROOT

CACHE = REPO_ROOT / ".cache" / "winport-test-gguf-v41"  # shared with test_v41_gguf (same demo folders)
MXFP4_BYTES = 17  # GGML MXFP4 block: one E8M0 exponent, 16 bytes of E2M1 codes for 32 values
PROMPT = ("The server loads 42 weights. def main(): return x + y. hello world windows linux deepseek "
          "flash attention sparse memory? The scheduler routes 7 tokens. import torch. The cache stores "
          "pages. for i in range(10): print('hello'). A request streams replies.")
CHAT = [{"role": "user", "content": "hello world? The kernel checks 12 experts."}]
GREEDY_TOKENS = 8
# Log-probabilities of the best TOP_K tokens per generated step (OpenAI's maximum): the demo's random
# weights make near-flat next-token distributions (the best token at about -4.4 nat, a uniform one at
# -ln 1024 = -6.9), where a near-tie can take in three tokens or more, so the top 2 need not list
# the other server's pick (seen: it did not).
TOP_K = 20


# --- fixtures: the demo in both storage forms, the GGUF files --------------------------------------


@pytest.fixture(scope="module")
def bf16_demo() -> Path:
    """The demo's plain bf16 form (the same values as its FP8 + MXFP4 checkpoint): what GGUF export reads."""
    from winport.demo.build import ensure_demo

    return ensure_demo("v41", CACHE / "demo-v41-bf16", quantized=False)


@pytest.fixture(scope="module")
def fp8_demo() -> Path:
    """The demo as DeepSeek ships V4.1: FP8 [32, 32]-block dense weights, MXFP4 experts."""
    from winport.demo.build import ensure_demo

    return ensure_demo("v41", CACHE / "demo-v41", quantized=True)


@pytest.fixture(scope="module")
def ud_gguf(bf16_demo: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Q8_0 dense + MXFP4 experts, written by the CLI a user runs (own folder: its draft lies next to it)."""
    from winport.demo.command import main

    out = tmp_path_factory.mktemp("ud") / "demo-v41-UD-Q8_0-MXFP4.gguf"
    assert main(["--variant", "v41", "--out", str(bf16_demo), "--gguf", str(out), "--q8-0", "--mxfp4-experts"]) == 0
    return out


@pytest.fixture(scope="module")
def bf16_mxfp4_gguf(bf16_demo: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """BF16 dense + MXFP4 experts: a file whose every value is the demo's (no Q8_0 rounding)."""
    from winport.gguf.export import export_demo_gguf

    return export_demo_gguf(tmp_path_factory.mktemp("bf16mx") / "demo-v41-BF16-MXFP4.gguf", folder=bf16_demo,
                            variant="v41", experts_mxfp4=True)


def _bits(t: torch.Tensor) -> bytes:
    return bytes(t.contiguous().view(-1).view(torch.uint8).numpy())


@dataclass
class Stored:
    """One GGUF tensor as stored: its type name, numpy-order shape and bytes."""

    type: str
    shape: tuple[int, ...]
    raw: np.ndarray  # uint8, copied out of the file


def _stored(path: Path) -> tuple[dict[str, Any], dict[str, Stored]]:
    """(metadata, tensors) of a GGUF. winport's byte reader: gguf-py's refuses the engram table's fork
    type (MXFP8, 43); gguf-py still does every dequantization here."""
    from winport.gguf.reader import open_gguf

    with open_gguf(path) as m:
        return dict(m.metadata), {n: Stored(t.type.name, tuple(t.shape), np.array(t.raw())) for n, t in m.tensors.items()}


def _dequant(t: Stored) -> np.ndarray:
    """gguf-py's dequantization of a Q8_0 / MXFP4 tensor, float32 in its logical shape."""
    return gq.dequantize(t.raw, gguf.GGMLQuantizationType[t.type]).reshape(t.shape)


def _convert(path: Path, cache: Path) -> Path:
    from winport.gguf.to_checkpoint import gguf_to_checkpoint

    # dense_fp8=None: what `winport serve` asks for (winport.serve.command.build_plan).
    return gguf_to_checkpoint(path, cache=cache, dense_fp8=None, progress=False)


def _fp8_values(weight: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """float32 values of [32, 32]-block FP8 (scales e8m0 or float32: both hold powers of two)."""
    from winport.demo.quantize import V41_BLOCK, dequantize_fp8_block

    return dequantize_fp8_block(weight, scale.to(torch.float32), V41_BLOCK)


def _is_dense_fp8(name: str) -> bool:
    """A main-model dense linear weight the demo stores as FP8 (and the GGUF as Q8_0)."""
    from winport.demo.quantize import FP8_DENSE

    return bool(FP8_DENSE.match(name)) and name.startswith("layers.")


def _is_dense_scale(name: str) -> bool:
    return name.endswith(".scale") and _is_dense_fp8(name[: -len("scale")] + "weight")


# --- the MXFP4 export ----------------------------------------------------------------------------


def _ggml_mxfp4_to_deepseek(blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """GGML MXFP4 blocks uint8 [N, K/32, 17] -> DeepSeek's layout: (codes uint8 [N, K/2], E8M0 [N, K/32]).

    From the format definitions (FACTS.md, GGUF): a GGML block is its E8M0 byte, then 16 bytes whose
    low nibbles are values 0..15 and high nibbles values 16..31; DeepSeek packs value 2j in the low
    nibble and 2j+1 in the high nibble of byte j. Same exponent byte, same 4-bit codes.
    """
    n, nb, _ = blocks.shape
    q = blocks[..., 1:]
    codes = np.concatenate([q & 0x0F, q >> 4], axis=-1).reshape(n, nb * 32)  # value order
    return (codes[:, 0::2] | (codes[:, 1::2] << 4)).astype(np.uint8), np.ascontiguousarray(blocks[..., 0])


def test_mxfp4_experts_hold_the_demo_codes(ud_gguf: Path, bf16_demo: Path, fp8_demo: Path) -> None:
    from winport.gguf.export import gguf_name

    meta, tensors = _stored(ud_gguf)
    assert meta["general.file_type"] == int(gguf.LlamaFileType.MOSTLY_MXFP4_MOE)
    plain, fp8 = served_tensors(bf16_demo), served_tensors(fp8_demo)
    n_experts = n_q8 = 0
    for name in sorted(plain):
        if name.startswith("mtp."):  # the draft: its own GGUF
            continue
        g, role, e = gguf_name(name)
        t = tensors[g]
        if role == "fp8":
            n_q8 += 1
            assert t.type == "Q8_0", name
            assert _is_dense_fp8(name), f"{name}: Q8_0 in the GGUF but not FP8 in the demo's checkpoint"
            continue
        if role != "experts":
            continue
        n_experts += 1
        assert t.type == "MXFP4", name
        raw = t.raw.reshape(t.shape[0], t.shape[1], -1, MXFP4_BYTES)[e]
        codes, exps = _ggml_mxfp4_to_deepseek(raw)
        base = name[: -len("weight")]
        assert codes.tobytes() == _bits(fp8[base + "weight"]), f"{name}: E2M1 codes differ from the demo's"
        assert exps.tobytes() == _bits(fp8[base + "scale"]), f"{name}: E8M0 exponents differ from the demo's"
        # And the values, by gguf-py's own dequantizer: exactly the bf16 demo's (lossless re-quantization).
        values = gq.dequantize(raw.reshape(-1, MXFP4_BYTES), gguf.GGMLQuantizationType.MXFP4)
        assert torch.equal(torch.from_numpy(values).reshape(plain[name].shape), plain[name].float()), name
    cfg = json.loads((bf16_demo / "config.json").read_text())
    assert n_experts == cfg["num_hidden_layers"] * cfg["n_routed_experts"] * 3 and n_q8 == sum(_is_dense_fp8(n) for n in fp8) > 0


def test_mxfp4_export_needs_whole_blocks(bf16_demo: Path, tmp_path: Path) -> None:
    from safetensors.torch import save_file

    from winport.gguf import GGUFError
    from winport.gguf.export import _plan_tensors, checkpoint_to_gguf

    folder = tmp_path / "ckpt"
    folder.mkdir()
    shutil.copyfile(bf16_demo / "config.json", folder / "config.json")
    w = {f"layers.0.ffn.experts.{e}.w{i}.weight": torch.zeros(64, 48, dtype=torch.bfloat16)
         for e in range(2) for i in (1, 3)}
    save_file(w, str(folder / "model.safetensors"))
    with pytest.raises(GGUFError, match=r"blk\.0\.ffn_gate_exps\.weight.*48 values per row is not a multiple of 32"):
        checkpoint_to_gguf(folder, tmp_path / "x.gguf", arch="deepseek41", experts_mxfp4=True)
    assert not list(tmp_path.glob("x.gguf*"))
    with pytest.raises(GGUFError, match="Q8_0 or as MXFP4, not both"):
        _plan_tensors(folder, False, experts_q8_0=True, experts_mxfp4=True)


def test_mxfp4_quantized_in_row_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Chunked (bounded memory) quantization gives gguf-py's bytes for the whole tensor, bf16 input."""
    from winport.gguf import export

    x = torch.randn(3, 10, 64).mul(torch.tensor([1e-3, 1.0, 40.0]).view(3, 1, 1)).to(torch.bfloat16)
    x[1, 2] = 0  # an all-zero row: exponent byte 0, code 0
    p = export._Planned("blk.0.ffn_up_exps.weight", "experts", [("f", "layers.0.ffn.experts.0.w3.weight")],
                        tuple(x.shape), "BF16", mxfp4=True)
    monkeypatch.setattr(export, "_MXFP4_CHUNK_VALUES", 3 * 64)  # 3 rows a call: a ragged last chunk
    got = export._quantize_mxfp4(p, x.view(torch.int16).numpy())
    want = gq.quantize(x.float().numpy(), gguf.GGMLQuantizationType.MXFP4)
    assert got.shape == (3, 10, 2 * MXFP4_BYTES) and np.array_equal(got, want)


# --- what the server path converts ----------------------------------------------------------------


def test_ud_mix_converts_to_fp8_dense_and_the_demo_experts(ud_gguf: Path, fp8_demo: Path, tmp_path: Path) -> None:
    from winport.demo.quantize import V41_BLOCK, quantize_fp8_block
    from winport.gguf.export import gguf_name

    folder = _convert(ud_gguf, tmp_path)
    cfg = json.loads((folder / "config.json").read_text())
    assert cfg["quantization_config"] == json.loads((fp8_demo / "config.json").read_text())["quantization_config"]
    got, ref = served_tensors(folder), served_tensors(fp8_demo)
    _, tensors = _stored(ud_gguf)
    assert sorted(k for k in got if not k.startswith("mtp.")) == sorted(k for k in ref if not k.startswith("mtp."))
    n_dense = 0
    for name in ref:
        if name.startswith("mtp.") or _is_dense_scale(name):  # the draft; scales: with their weights
            continue
        if _is_dense_fp8(name):
            n_dense += 1
            q8 = _dequant(tensors[gguf_name(name)[0]])
            want = _fp8_values(*quantize_fp8_block(torch.from_numpy(q8), V41_BLOCK, name))
            scale = name[: -len("weight")] + "scale"
            assert got[name].dtype == torch.float8_e4m3fn, name
            assert torch.equal(_fp8_values(got[name], got[scale]), want), name
        else:  # experts (packed codes, E8M0) and every plain tensor: bit for bit
            assert _bits(got[name]) == _bits(ref[name]) and got[name].shape == ref[name].shape, name
    assert n_dense > 30


def test_bf16_dense_mxfp4_file_converts_to_the_demo_values(bf16_mxfp4_gguf: Path, fp8_demo: Path,
                                                           tmp_path: Path) -> None:
    got, ref = served_tensors(_convert(bf16_mxfp4_gguf, tmp_path)), served_tensors(fp8_demo)
    for name in ref:
        if name.startswith("mtp.") or _is_dense_scale(name):
            continue
        if _is_dense_fp8(name):
            scale = name[: -len("weight")] + "scale"
            assert torch.equal(_fp8_values(got[name], got[scale]), _fp8_values(ref[name], ref[scale])), name
        else:
            assert _bits(got[name]) == _bits(ref[name]), name


# --- the control: twice Q8_0's rounding step ------------------------------------------------------


def coarse_q8_round_trip(x: np.ndarray) -> np.ndarray:
    """Q8_0's round trip (per 32 values along a row: an fp16 scale, integers) with |q| <= 63 instead of
    127: the same kind of rounding at twice the step."""
    blocks = x.astype(np.float32).reshape(-1, 32)
    d = (np.abs(blocks).max(axis=1, keepdims=True) / 63).astype(np.float16).astype(np.float32)
    with np.errstate(divide="ignore", invalid="ignore"):
        q = np.where(d > 0, np.clip(np.round(blocks / d), -63, 63), 0)
    return (q * d).reshape(x.shape)


def _control_checkpoint(fp8_demo: Path, bf16_demo: Path, ud_gguf: Path, out: Path) -> float:
    """The demo's FP8 + MXFP4 folder with every Q8_0'd dense weight replaced by FP8 blocks of
    :func:`coarse_q8_round_trip` of the demo's value. Returns min over tensors of RMS(control error) /
    RMS(GGUF error), both against the demo's values (the premise of the bound: about 2)."""
    from safetensors.torch import save_file

    from winport.demo.quantize import V41_BLOCK, dequantize_fp8_block, quantize_fp8_block
    from winport.gguf.export import gguf_name

    out.mkdir(parents=True)
    for f in fp8_demo.iterdir():
        if f.is_file() and f.suffix != ".safetensors" and not f.name.startswith("winport-demo"):
            shutil.copyfile(f, out / f.name)
    tensors, plain = served_tensors(fp8_demo), served_tensors(bf16_demo)
    _, gguf_tensors = _stored(ud_gguf)
    ratio = float("inf")
    for name in [n for n in tensors if _is_dense_fp8(n)]:
        x = plain[name].float().numpy()
        w, s = quantize_fp8_block(torch.from_numpy(coarse_q8_round_trip(x)), V41_BLOCK, name)
        tensors[name], tensors[name[: -len("weight")] + "scale"] = w, s
        ud = _dequant(gguf_tensors[gguf_name(name)[0]])
        ud_fp8 = dequantize_fp8_block(*quantize_fp8_block(torch.from_numpy(ud), V41_BLOCK, name), V41_BLOCK)
        err_ud = float(torch.sqrt(((ud_fp8 - torch.from_numpy(x)) ** 2).mean()))
        err_ctl = float(torch.sqrt(((_fp8_values(w, s) - torch.from_numpy(x)) ** 2).mean()))
        ratio = min(ratio, err_ctl / err_ud)
    save_file(dict(sorted(tensors.items())), str(out / "model.safetensors"), metadata={"format": "pt"})
    return ratio


# --- live ------------------------------------------------------------------------------------------


@dataclass
class Answers:
    """What one server said: prompt log-probabilities and a greedy chat completion."""

    prompt_logprobs: list[float]
    chat_tokens: list[str]
    greedy_ids: list[int]  # greedy continuation of the prompt, by token id
    greedy_top: list[dict[int, float]]  # per generated step: token id -> logprob of the TOP_K best
    log: str


def _generate(url: str, body: dict[str, Any]) -> dict[str, Any]:
    """POST body to the server's native /generate and return its JSON answer."""
    req = urllib.request.Request(url + "/generate", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=300) as resp:  # noqa: S310 - loopback only
        return json.loads(resp.read())


def _ask(args: list[str], ids: list[int], cache: Path, chat: bool = True) -> tuple[Answers, Any]:
    """Start `winport serve <args>`, ask for the prompt log-probabilities and (``chat``) a greedy chat
    completion, send Ctrl-C; returns (answers, process). The caller waits for the process: SGLang sleeps
    5 s before it exits, and the next server can start meanwhile."""
    from openai import OpenAI

    from tests.serve._server import start, wait_ready

    t0 = time.monotonic()
    srv = start(args, {"WINPORT_CACHE": str(cache)})
    try:
        wait_ready(srv)
        t1 = time.monotonic()
        body = {"input_ids": ids, "sampling_params": {"max_new_tokens": 1, "temperature": 0},
                "return_logprob": True, "logprob_start_len": 0}
        gen = _generate(srv.url, body)
        t2 = time.monotonic()
        steps: list[Any] = []
        greedy: dict[str, Any] = {"ids": [], "top": []}
        if chat:
            # By token id: the chat API's logprobs name tokens by text, and byte-fallback tokens all
            # read as the replacement character there, so different tokens would look equal.
            body = {"input_ids": ids, "sampling_params": {"max_new_tokens": GREEDY_TOKENS, "temperature": 0,
                                                          "ignore_eos": True},
                    "return_logprob": True, "top_logprobs_num": TOP_K}
            out = _generate(srv.url, body)
            greedy = {"ids": out["output_ids"],
                      "top": [{int(tid): float(lp) for lp, tid, *_ in step}
                              for step in out["meta_info"]["output_top_logprobs"]]}
            client = OpenAI(base_url=srv.url + "/v1", api_key="none", timeout=300, max_retries=0)
            reply = client.chat.completions.create(model=client.models.list().data[0].id, messages=CHAT,
                                                   max_tokens=GREEDY_TOKENS, temperature=0, logprobs=True,
                                                   top_logprobs=TOP_K)
            steps = reply.choices[0].logprobs.content
    finally:
        if srv.proc.poll() is None:
            srv.proc.send_signal(signal.SIGINT)
    print(f"winport serve {' '.join(args)}: ready after {t1 - t0:.0f} s, /generate {t2 - t1:.0f} s, "
          f"chat {time.monotonic() - t2:.0f} s")
    return Answers([v[0] for v in gen["meta_info"]["input_token_logprobs"][1:]], [s.token for s in steps],
                   greedy["ids"], greedy["top"], srv.text()), srv.proc


@dataclass
class Live:
    """The three servers' answers and the control's weight-error ratio."""

    gguf: Answers
    reference: Answers
    control: Answers
    weight_error_ratio: float
    gguf_path: Path
    cache_growth: int  # bytes the server's cache grew by while serving the GGUF


@pytest.fixture(scope="module")
def live(ud_gguf: Path, fp8_demo: Path, bf16_demo: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    from tokenizers import Tokenizer

    # transformers' AutoTokenizer does not know model_type deepseek_v41: the tokenizers library directly.
    tok = Tokenizer.from_file(str(fp8_demo / "tokenizer.json"))
    ids = [json.loads((fp8_demo / "config.json").read_text())["bos_token_id"],
           *tok.encode(PROMPT, add_special_tokens=False).ids]
    control = tmp_path_factory.mktemp("control") / "demo-v41-coarse-q8"
    ratio = _control_checkpoint(fp8_demo, bf16_demo, ud_gguf, control)
    cache = tmp_path_factory.mktemp("serve-cache")  # a fresh cache: the GGUF is converted by the server path
    procs: list[subprocess.Popen[str]] = []
    try:
        answers = []
        growth = 0
        # The control only measures prompt log-probabilities (its chat answer is not used: ~11 s saved).
        for args, chat in ((["--model", str(ud_gguf)], True), (["--model", str(fp8_demo)], True),
                           (["--model", str(control)], False)):
            before = folder_bytes(cache)
            a, proc = _ask(args, ids, cache, chat)
            if args[1] == str(ud_gguf):
                growth = folder_bytes(cache) - before
            procs.append(proc)
            answers.append(a)
        yield Live(*answers, weight_error_ratio=ratio, gguf_path=ud_gguf, cache_growth=growth)
    finally:
        for p in procs:
            try:
                p.wait(60)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(10)


def test_ud_mix_gguf_serves_through_the_fp8_config(live: Live) -> None:
    assert "no copy" in live.gguf.log
    assert_served_without_a_copy(live.gguf.log, live.gguf_path, live.cache_growth)
    assert "routed experts are MXFP4" in live.gguf.log
    assert len(live.gguf.chat_tokens) == GREEDY_TOKENS and all(np.isfinite(live.gguf.prompt_logprobs))


def _median_diff(a: list[float], b: list[float]) -> float:
    return statistics.median(abs(x - y) for x, y in zip(a, b, strict=True))


def test_prompt_logprobs_within_the_control_bound(live: Live) -> None:
    got, ref, ctl = live.gguf.prompt_logprobs, live.reference.prompt_logprobs, live.control.prompt_logprobs
    assert len(got) == len(ref) == len(ctl) > 48
    assert all(np.isfinite(ref)) and all(np.isfinite(ctl))
    bound = _median_diff(ctl, ref)
    median = _median_diff(got, ref)
    shifted = _median_diff(got[1:], ref[:-1])
    print(f"prompt logprobs, n={len(got)}: GGUF vs demo median {median:.4f} (max "
          f"{max(abs(x - y) for x, y in zip(got, ref, strict=True)):.4f}); control vs demo median {bound:.4f}; "
          f"weight error ratio control/GGUF >= {live.weight_error_ratio:.2f}; shifted control {shifted:.4f}")
    # The premise: the control's weights are at least ~1.5x further from the demo's than the GGUF's.
    assert live.weight_error_ratio > 1.5
    assert 0 < median <= bound
    assert shifted > bound  # a real error (every position off) fails the bound


def test_greedy_tokens_agree_up_to_a_near_tie(live: Live) -> None:
    got, ref = live.gguf, live.reference
    tie = max(abs(x - y) for x, y in zip(live.control.prompt_logprobs, ref.prompt_logprobs, strict=True))
    n = len(ref.greedy_ids)
    assert n == len(got.greedy_ids) == GREEDY_TOKENS
    first = next((i for i in range(n) if got.greedy_ids[i] != ref.greedy_ids[i]), n)
    print(f"greedy: {first} of {n} tokens equal; tie threshold {tie:.3f} nat")
    if first == n:
        return
    a, b = ref.greedy_ids[first], got.greedy_ids[first]
    # Each server rates the other's pick as close to its own best: a near-tie the rounding can flip.
    top_ref, top_got = ref.greedy_top[first], got.greedy_top[first]
    print(f"step {first}: reference {a} {top_ref[a]:.3f}, GGUF's {b} {top_ref.get(b, float('-inf')):.3f}; "
          f"GGUF {b} {top_got[b]:.3f}, reference's {a} {top_got.get(a, float('-inf')):.3f}")
    assert b in top_ref and top_ref[a] - top_ref[b] <= tie, (first, a, b)
    assert a in top_got and top_got[b] - top_got[a] <= tie, (first, a, b)


def test_draft_of_an_mxfp4_model_gets_the_demos_mxfp4_experts(ud_gguf: Path, fp8_demo: Path, tmp_path: Path) -> None:
    """SGLang decides FP4 experts for the whole model, the bundled DSpark draft's included (as DeepSeek
    ships them): next to an MXFP4 model the Q8_0 draft's experts are requantized to MXFP4, and since
    they are Q8_0 of MXFP4 values the served values are the demo draft's own, exactly (the scale
    slack in _experts_to_mxfp4 is what makes power-of-two block maxima come back; without it this
    test fails). Everything else of the draft keeps its form (dense FP8, norms as stored)."""
    from winport.demo.quantize import dequantize_mxfp4
    from winport.gguf.to_checkpoint import gguf_to_checkpoint

    assert any(p.name.endswith("-DSpark.gguf") for p in ud_gguf.parent.iterdir()), "the draft lies next to the model"
    folder = gguf_to_checkpoint(ud_gguf, cache=tmp_path, dense_fp8=None, progress=False, draft=None)
    got, ref = served_tensors(folder), served_tensors(fp8_demo)
    experts = sorted(k for k in ref if k.startswith("mtp.") and ".experts." in k and k.endswith(".weight"))
    assert len(experts) >= 12, experts
    for name in experts:
        scale = name[: -len("weight")] + "scale"
        assert got[name].dtype == torch.uint8 and got[name].shape == ref[name].shape, name
        assert got[scale].dtype == torch.float8_e8m0fnu and got[scale].shape == ref[scale].shape, name
        assert torch.equal(dequantize_mxfp4(got[name], got[scale]), dequantize_mxfp4(ref[name], ref[scale])), name
    assert sorted(k for k in got if k.startswith("mtp.")) == sorted(k for k in ref if k.startswith("mtp."))


def test_unservable_conversion_says_so(ud_gguf: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """dense_fp8=False on MXFP4 experts writes a checkpoint SGLang 0.5.23 cannot load: the conversion
    says so and names the setting that works; dense_fp8=None (what serve passes) says why it picks FP8."""
    from winport.gguf.to_checkpoint import gguf_to_checkpoint

    gguf_to_checkpoint(ud_gguf, cache=tmp_path / "bf16", dense_fp8=False, progress=False, draft=None)
    said = capsys.readouterr().out
    assert f"{ud_gguf.name}: routed experts are MXFP4 and dense_fp8=False" in said and "dense_fp8=None" in said
    gguf_to_checkpoint(ud_gguf, cache=tmp_path / "fp8", dense_fp8=None, progress=False, draft=None)
    said = capsys.readouterr().out
    assert "cannot serve" not in said and "dense weights are converted to block FP8 too" in said
