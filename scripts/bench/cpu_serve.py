"""CPU serving benchmark: prefill and decode speed of `winport serve --demo` on this machine.

Starts SGLang exactly as `winport serve --demo` would (same command line and environment, from
winport.serve.command.build_plan, under WINPORT_EMULATE_WINDOWS=1), waits until it answers, then:
  1. warm-up: one short greedy request (first-call costs: imports, Triton interpreter set-up);
  2. prefill: a fixed prompt (radix cache off, so nothing is reused) with max_tokens=1, timed
     from send to the complete response;
  3. decode: the same prompt streamed with --decode new tokens (ignore_eos); the time from the
     first streamed token to the last, over decode-1 intervals, gives tokens/s;
and prints the numbers. Options:
  --tp N                tensor parallel ranks (CPU TP binds one equal CPU range per rank)
  --py-spy PATH         record a py-spy profile (flame SVG + raw) of each scheduler process during
                        the decode phase into --out (py-spy from PyPI; not needed otherwise)
  --env K=V             extra environment for the server (repeatable)
  --baseline-env K=V    first run a baseline with this environment, then the normal run, and print
                        the speed-ups of the two measured back to back in one invocation
Usage: python scripts/bench/cpu_serve.py [--tp 1] [--decode 32] [--py-spy /path/py-spy --out DIR]
       python scripts/bench/cpu_serve.py --baseline-env WINPORT_CPU_TORCH_KERNELS=0
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

PROMPT = ("The quick brown fox jumps over the lazy dog while the server loads forty-two weights "
          "and a small model answers questions about windows, kernels and caches.")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _post(url: str, body: dict[str, object], timeout: float = 1800) -> dict[str, object]:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as resp:  # noqa: S310 - loopback only
        return json.loads(resp.read())


def _stream_times(url: str, body: dict[str, object], timeout: float = 1800) -> list[float]:
    """Arrival time of every streamed chunk that carries text."""
    req = urllib.request.Request(url, data=json.dumps({**body, "stream": True}).encode(),
                                 headers={"Content-Type": "application/json"})
    times = []
    with urllib.request.urlopen(req, timeout=timeout) as resp:  # noqa: S310 - loopback only
        for raw in resp:
            line = raw.decode().strip()
            if not line.startswith("data:") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[5:])
            if chunk.get("choices") and chunk["choices"][0].get("text") is not None:
                times.append(time.perf_counter())
    return times


def _schedulers(root_pid: int) -> list[int]:
    import psutil

    kids = psutil.Process(root_pid).children(recursive=True)
    return [p.pid for p in kids if "scheduler" in " ".join(p.cmdline() or [p.name()])
            or p.name().startswith("sglang::sched")]


def run_once(tp: int, decode: int, extra_env: list[str], out: Path, py_spy: str | None) -> dict[str, object]:
    """Start the demo server with `extra_env` (K=V; K= removes K), measure, stop it; return the numbers."""
    from winport.serve.command import build_plan, stop_tree

    port = _free_port()
    plan = build_plan(["--demo", "--device", "cpu", "--tp", str(tp), "--port", str(port)])
    env = {k: v for k, v in os.environ.items() if not k.startswith(("WINPORT_", "SGLANG_"))}
    env.update({"WINPORT_EMULATE_WINDOWS": "1", "PYTHONUNBUFFERED": "1", **plan.env})
    if "WINPORT_CACHE" in os.environ:
        env["WINPORT_CACHE"] = os.environ["WINPORT_CACHE"]
    for kv in extra_env:
        k, _, v = kv.partition("=")
        if v:
            env[k] = v
        else:
            env.pop(k, None)
    # No prefix reuse between the timed requests; a generous watchdog (2 ranks on 2 cores are slow).
    argv = [*plan.argv, "--disable-radix-cache", "--watchdog-timeout", "3600"]
    out.mkdir(parents=True, exist_ok=True)
    log = open(out / "server.log", "w")  # noqa: SIM115 - closed in finally
    cmd = [sys.executable, "-X", "utf8", "-m", "sglang.launch_server", *argv]
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=REPO)
    url = plan.url
    try:
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"server exited with {proc.returncode}; see {out / 'server.log'}")
            try:
                with urllib.request.urlopen(url + "/v1/models", timeout=5):  # noqa: S310
                    break
            except OSError:
                time.sleep(1)
        t_ready = time.perf_counter() - t0
        base = {"model": "winport-demo-v4", "temperature": 0}
        t = time.perf_counter()
        _post(url + "/v1/completions", {**base, "prompt": "hello windows", "max_tokens": 2})
        t_warm = time.perf_counter() - t
        t = time.perf_counter()
        r = _post(url + "/v1/completions", {**base, "prompt": PROMPT, "max_tokens": 1})
        t_prefill = time.perf_counter() - t
        n_prompt = int(r["usage"]["prompt_tokens"])  # type: ignore[index]
        spies: list[subprocess.Popen[bytes]] = []
        if py_spy:
            for pid in _schedulers(proc.pid):
                spies.append(subprocess.Popen([py_spy, "record", "--pid", str(pid), "--rate", "50",
                                               "--format", "raw", "-o", str(out / f"decode_{pid}.txt")],
                                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
            time.sleep(1.0)
        times = _stream_times(url + "/v1/completions", {**base, "prompt": PROMPT, "max_tokens": decode,
                                                        "ignore_eos": True})
        for spy in spies:
            spy.send_signal(signal.SIGINT)
            spy.wait(60)
        if len(times) < 2:
            raise RuntimeError(f"only {len(times)} streamed tokens")
        decode_s = times[-1] - times[0]
        return {
            "tp": tp, "extra_env": extra_env, "ready_s": round(t_ready, 1), "warmup_request_s": round(t_warm, 2),
            "prompt_tokens": n_prompt, "prefill_s": round(t_prefill, 2),
            "prefill_tok_s": round(n_prompt / t_prefill, 2), "decode_tokens": len(times),
            "decode_s": round(decode_s, 2), "decode_tok_s": round((len(times) - 1) / decode_s, 3),
        }
    finally:
        stop_tree(proc)  # type: ignore[arg-type]
        log.close()


def main() -> int:
    """Run the benchmark (and the baseline, when asked for); print the numbers and ratios."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tp", type=int, default=1)
    ap.add_argument("--decode", type=int, default=32)
    ap.add_argument("--py-spy", default=None, help="path of a py-spy binary: profile the decode phase")
    ap.add_argument("--out", type=Path, default=Path("/tmp/winport_cpu_serve_bench"))
    ap.add_argument("--env", action="append", default=[], help="extra K=V for the server environment")
    ap.add_argument("--baseline-env", action="append", default=[],
                    help="K=V of a baseline run made first in the same invocation (ratios are printed), e.g. "
                         "WINPORT_CPU_TORCH_KERNELS=0 for SGLang's Triton kernels in the interpreter")
    args = ap.parse_args()
    # SIGTERM (timeout, kill) unwinds through `finally`, so the server tree is stopped too.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    machine = f"{platform.node()} {platform.machine()} {os.cpu_count()} logical CPUs, load {os.getloadavg()}"
    runs = {}
    if args.baseline_env:
        runs["baseline"] = run_once(args.tp, args.decode, [*args.env, *args.baseline_env], args.out / "baseline",
                                    args.py_spy)
        print(json.dumps(runs["baseline"]), flush=True)
    runs["run"] = run_once(args.tp, args.decode, args.env, args.out / "run", args.py_spy)
    print(json.dumps(runs["run"]), flush=True)
    summary: dict[str, object] = {"machine": machine, "load_after": os.getloadavg(), **runs}
    if "baseline" in runs:
        b, r = runs["baseline"], runs["run"]
        summary["prefill_speedup"] = round(float(r["prefill_tok_s"]) / float(b["prefill_tok_s"]), 2)  # type: ignore[arg-type]
        summary["decode_speedup"] = round(float(r["decode_tok_s"]) / float(b["decode_tok_s"]), 2)  # type: ignore[arg-type]
    print(json.dumps(summary, indent=1))
    (args.out / "summary.json").write_text(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
