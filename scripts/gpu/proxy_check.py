"""The full-width V4.1-Flash proxy served hybrid on the GPU machine: build it, serve it, ask it, time decode.

Run through scripts/gpu/serve_demo.sh --script (SGLang's wheels installed, kt-kernel on the path):
1. `winport demo-model --variant v41 --full-width --layers N` into --dir (timed, once);
2. per --gpu-experts value G: `winport serve --model DIR --gpu-experts G` (kt-kernel runs the other
   384 - G experts a layer on the CPU, CUDA graphs on), one chat completion (it must answer), then
   decode speed: greedy /generate of 1 and of 1 + `--tokens` new tokens with ignore_eos, decode
   tok/s = tokens / (t_long - t_short), median of 3; the server is stopped with Ctrl-C.
With --vram-gib N the servers are started with `--vram-gib N` instead (winport.placement chooses G
and the memory fraction), and with --long-prompt T a prompt of T tokens is prefilled after the chat:
the GPU memory the server's processes hold (nvidia-smi) is read before and after it, next to the
plan's lines (what calibrates the plan's activation estimate).
Prints one table row per G and writes --json.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

READY = "winport serve: ready at"


def _post(url: str, body: dict, timeout: float = 600) -> dict:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


def _generate_s(base: str, new_tokens: int) -> float:
    body = {"text": "The capital of France is", "sampling_params": {
        "max_new_tokens": new_tokens, "temperature": 0, "ignore_eos": True}}
    t0 = time.perf_counter()
    out = _post(base + "/generate", body)
    dt = time.perf_counter() - t0
    got = out["meta_info"]["completion_tokens"]
    if got != new_tokens:
        raise RuntimeError(f"/generate returned {got} tokens, asked for {new_tokens}")
    return dt


def _held(proc: subprocess.Popen) -> float | None:
    import psutil

    from winport.placement.actual import cuda_held_bytes

    pids = [proc.pid, *(p.pid for p in psutil.Process(proc.pid).children(recursive=True))]
    held = cuda_held_bytes(pids)
    return None if held is None else held / 2**30


def serve_once(folder: Path, gpu_experts: int, port: int, tokens: int, log: Path, ready_s: float,
               vram_gib: float | None = None, long_prompt: int = 0) -> dict:
    """Start the server, check a chat answer, time decode, stop it; return the row."""
    argv = [sys.executable, "-m", "winport", "serve", "--model", str(folder), "--port", str(port),
            "--max-running-requests", "4"]
    if vram_gib is not None:
        argv += ["--vram-gib", str(vram_gib), "--context-length", "32768"]
    else:
        argv += ["--gpu-experts", str(gpu_experts), "--context-length", "4096",
                 # With 2-4 layers a token's KV is tiny, so SGLang's default sizing makes a pool of ~400M
                 # tokens whose decode buffers then fail to fit (H200, 2026-12-02): cap it
                 "--", "--max-total-tokens", "65536"]
    t0 = time.perf_counter()
    with open(log, "w", encoding="utf-8") as fh:
        proc = subprocess.Popen(argv, stdout=fh, stderr=subprocess.STDOUT, text=True)
    try:
        while READY not in log.read_text(encoding="utf-8", errors="replace"):
            if proc.poll() is not None or time.perf_counter() - t0 > ready_s:
                raise RuntimeError(f"server (G={gpu_experts}) not ready (exit {proc.poll()}):\n"
                                   + log.read_text(errors="replace")[-4000:])
            time.sleep(2)
        start_s = time.perf_counter() - t0
        base = f"http://127.0.0.1:{port}"
        chat = _post(base + "/v1/chat/completions", {
            "model": json.loads(urllib.request.urlopen(base + "/v1/models", timeout=60).read())["data"][0]["id"],
            "messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 16, "temperature": 0})
        answer = chat["choices"][0]["message"]["content"]
        if chat["usage"]["completion_tokens"] < 1:
            raise RuntimeError(f"chat completion returned no tokens: {chat}")
        memory: dict = {"idle_gib": _held(proc)}
        if long_prompt:
            # Token ids of the demo tokenizer's range, no special tokens: a prefill of long_prompt tokens.
            ids = [3 + (i * 7919) % 1000 for i in range(long_prompt)]
            t1 = time.perf_counter()
            _post(base + "/generate", {"input_ids": ids, "sampling_params": {"max_new_tokens": 1, "temperature": 0}})
            memory.update(prefill_s=time.perf_counter() - t1, after_prefill_gib=_held(proc))
        runs = []
        for _ in range(3):
            short, long = _generate_s(base, 1), _generate_s(base, 1 + tokens)
            runs.append(tokens / (long - short))
        runs.sort()
        plan_lines = [ln for ln in log.read_text(errors="replace").splitlines() if ln.startswith("winport serve: ")
                      and ("GiB" in ln or "Experts:" in ln)]
        return {"gpu_experts": gpu_experts, "vram_gib": vram_gib, "memory": memory, "plan": plan_lines,
                "start_s": start_s, "decode_tok_s": runs[1], "runs": runs,
                "chat_tokens": chat["usage"]["completion_tokens"], "chat_answer": answer}
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()


def main() -> None:
    """Build the proxy once, then serve it per --gpu value."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", type=Path, default=Path("/tmp/proxy-v41"))
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--gpu", default="71")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--ready-s", type=float, default=480)
    ap.add_argument("--vram-gib", default="", help="comma-separated budgets, served instead of --gpu")
    ap.add_argument("--long-prompt", type=int, default=0)
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "/tmp/out")))
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    if not (a.dir / "winport-proxy.json").exists():
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-m", "winport", "demo-model", "--variant", "v41", "--full-width",
                        "--layers", str(a.layers), "--out", str(a.dir)], check=True)
        print(f"proxy built in {time.perf_counter() - t0:.0f} s", flush=True)
    rows = []
    runs = ([(0, float(v)) for v in a.vram_gib.split(",")] if a.vram_gib
            else [(int(v), None) for v in a.gpu.split(",")])
    for n, vram in runs:
        tag = f"v{vram:g}" if vram is not None else f"g{n}"
        try:
            row = serve_once(a.dir, n, 30000 + (int(vram) if vram else n), a.tokens, a.out / f"proxy_server_{tag}.log",
                             a.ready_s, vram, a.long_prompt)
        except Exception as exc:  # noqa: BLE001 (reported, and the next G still runs)
            print(f"{tag}: FAILED: {exc}", flush=True)
            continue
        rows.append(row)
        for line in row["plan"]:
            print(line, flush=True)
        print(f"memory (nvidia-smi, GiB): {row['memory']}", flush=True)
        print(f"{tag}: ready after {row['start_s']:.0f} s, chat answered {row['chat_tokens']} tokens "
              f"({row['chat_answer']!r}), decode {row['decode_tok_s']:.1f} tok/s (runs {row['runs']})", flush=True)
    print("| GPU experts a layer | layers | decode tok/s | server start s |\n|---|---|---|---|")
    for r in rows:
        print(f"| {r['gpu_experts']} of 384 | {a.layers} | {r['decode_tok_s']:.1f} | {r['start_s']:.0f} |")
    (a.out / "proxy.json").write_text(json.dumps(rows, indent=1))
    if not rows:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
