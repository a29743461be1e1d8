"""Compare SGLang's DeepSeek-V4 demo serving against transformers' eager reference.

For each prompt: per-position prompt logprobs (SGLang's /generate with logprob_start_len 0 vs
transformers' DeepseekV4ForCausalLM in fp32) and 32 greedy tokens. Prints the max |dlogprob|, the
greedy agreement, and at the first greedy disagreement the reference's top-2 logit gap (a small gap
means the disagreement is a near-tie, not a bug).

transformers' model keeps the KV in full precision; DeepSeek's reference inference code (and SGLang's
584-byte V4 cache) round the 448 non-RoPE KV dims through FP8 e4m3 in tiles of 64 with power-of-two
scales. `--fp8-kv` gives the reference that round trip, which is the fair comparison. What then
remains is bf16 noise (median |dlogprob| ~0.03) plus MoE routing flips at near-tied expert scores
(top-2 of 8 with random gates), each worth a 0.3-1 nat spike and a greedy divergence.

Usage (a server must be answering, e.g. `winport serve --demo --port 30200`):
    python scripts/debug/compare_hf.py --model /tmp/wpc2/demo-v4 --port 30200 --fp8-kv [--verbose]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import urllib.request
from pathlib import Path

import torch

from winport.demo.reference import add_fp8_kv, dequantized_copy

PROMPTS = (
    "hello world windows linux deepseek flash attention sparse memory",
    "the quick brown fox jumps over the lazy dog",
    "def main(): return sum(range(10))",
)


def post(port: int, body: dict) -> dict:
    """POST body to the server's /generate and return the JSON answer."""
    req = urllib.request.Request(f"http://127.0.0.1:{port}/generate", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as resp:
        return json.loads(resp.read())


def sglang_run(port: int, ids: list[int], n_new: int) -> tuple[list[float], list[int]]:
    """Prompt logprobs (positions 1..) and n_new greedy tokens from the server."""
    out = post(port, {"input_ids": ids, "return_logprob": True, "logprob_start_len": 0,
                      "sampling_params": {"max_new_tokens": 1, "temperature": 0}})
    lps = [x[0] for x in out["meta_info"]["input_token_logprobs"]][1:]
    gen = post(port, {"input_ids": ids, "sampling_params": {"max_new_tokens": n_new, "temperature": 0,
                                                           "ignore_eos": True}})
    return lps, gen["output_ids"]


def hf_run(model: torch.nn.Module, ids: list[int], n_new: int) -> tuple[list[float], list[int], torch.Tensor]:
    """Reference prompt logprobs, greedy tokens and the logits of each greedy step (no KV cache)."""
    x = torch.tensor([ids])
    with torch.no_grad():
        logits = model(x, use_cache=False).logits[0].float()
    lp = torch.log_softmax(logits, -1)
    prompt_lps = [lp[i - 1, ids[i]].item() for i in range(1, len(ids))]
    seq, steps = list(ids), []
    with torch.no_grad():
        for _ in range(n_new):
            last = model(torch.tensor([seq]), use_cache=False).logits[0, -1].float()
            steps.append(last)
            seq.append(int(last.argmax()))
    return prompt_lps, seq[len(ids):], torch.stack(steps)


def main() -> None:
    """Run the comparison for each prompt and print a summary line per prompt."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="/tmp/wpc2/demo-v4")
    ap.add_argument("--port", type=int, default=30200)
    ap.add_argument("--new", type=int, default=32)
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--fp8-kv", action="store_true",
                    help="give the reference DeepSeek's FP8 KV quantization (what SGLang's cache does)")
    ap.add_argument("--verbose", action="store_true", help="print per-position logprobs")
    args = ap.parse_args()
    from transformers import AutoTokenizer, DeepseekV4ForCausalLM

    tok = AutoTokenizer.from_pretrained(args.model)
    source = Path(args.model)
    if "quantization_config" in json.loads((source / "config.json").read_text()):
        # FP8 + MXFP4 demo: transformers reads its exact bf16 dequantization
        source = dequantized_copy(source, Path(tempfile.mkdtemp(prefix="winport-ref-")))
    model = DeepseekV4ForCausalLM.from_pretrained(str(source), dtype=getattr(torch, args.dtype),
                                                  attn_implementation="eager").eval()
    if args.fp8_kv:
        print(f"reference: FP8 KV round trip on {add_fp8_kv(model)} KV norms", flush=True)
    for text in PROMPTS:
        ids = [0] + tok.encode(text, add_special_tokens=False)
        s_lps, s_gen = sglang_run(args.port, ids, args.new)
        h_lps, h_gen, h_logits = hf_run(model, ids, args.new)
        diffs = [abs(a - b) for a, b in zip(s_lps, h_lps, strict=True)]
        agree = next((i for i, (a, b) in enumerate(zip(s_gen, h_gen, strict=True)) if a != b), len(h_gen))
        same = sum(a == b for a, b in zip(s_gen, h_gen, strict=True))
        line = (f"{text[:40]!r:44} n={len(ids)} max|dlp|={max(diffs):.4f} mean={sum(diffs) / len(diffs):.4f} "
                f"greedy prefix {agree}/{len(h_gen)} same {same}")
        if agree < len(h_gen):
            top2 = h_logits[agree].topk(2).values
            line += f" | first diff step {agree}: HF top2 gap {float(top2[0] - top2[1]):.4f}"
        print(line, flush=True)
        if args.verbose:
            for i, (a, b) in enumerate(zip(s_lps, h_lps, strict=True), start=1):
                print(f"  pos {i:3d} sglang {a:9.4f} hf {b:9.4f} d {a - b:+.4f}")
            print("  sglang", s_gen, "\n  hf    ", h_gen)


if __name__ == "__main__":
    main()
