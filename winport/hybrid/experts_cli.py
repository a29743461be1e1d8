"""`winport experts`: record which routed experts a workload uses, and read a record.

    winport experts record --prompts FILE --out ROUTES.json [--max-tokens N] SERVE_FLAGS...
        starts `winport serve SERVE_FLAGS --record-experts ROUTES.json`, sends each prompt of FILE
        (one a line; a JSONL line {"text": ...} for a prompt with newlines) to SGLang's /generate,
        greedy, waits until the record holds every request and stops the server.
    winport experts show ROUTES.json [--slots 5,16,32,64]
        what share of the recorded routes N static GPU slots a layer would have served.

`winport serve --expert-placement ROUTES.json` then starts the GPU slots from the record
(winport.hybrid.route_record).
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from winport.hybrid.route_record import STEP_KINDS, RecordError, RouteRecord, load

RECORD_WAIT_S = 120.0  # for the scheduler's idle write after the last answer (it follows within a poll)


def read_prompts(path: Path) -> list[str]:
    """The prompts of `path`: one a non-empty line, or a JSONL line {"text": "..."}."""
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise ValueError(f"--prompts {path}: cannot read it ({exc.strerror or exc})") from None
    prompts = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        if line.lstrip().startswith("{"):
            try:
                item = json.loads(line)
            except ValueError as exc:
                raise ValueError(f"--prompts {path}, line {n}: not JSON ({exc})") from None
            if not isinstance(item, dict) or not isinstance(item.get("text"), str) or not item["text"]:
                raise ValueError(f"--prompts {path}, line {n}: a JSON line needs a non-empty string field 'text'")
            prompts.append(item["text"])
        else:
            prompts.append(line)
    if not prompts:
        raise ValueError(f"--prompts {path}: no prompt in it")
    return prompts


@dataclass
class Sent:
    """What the server said it did with the prompts: tokens prefilled (not from its cache) and decoded."""

    prefill: int = 0
    decode: int = 0
    generated: int = 0

    def add(self, meta: dict[str, object]) -> None:
        """Fold one /generate answer's meta_info in."""
        prompt, cached, out = (int(meta.get(k) or 0) for k in ("prompt_tokens", "cached_tokens", "completion_tokens"))  # type: ignore[call-overload]
        self.prefill += prompt - cached
        self.decode += max(out - 1, 0)  # the first token comes out of the prefill
        self.generated += out

    def covered_by(self, record: RouteRecord) -> bool:
        """Whether every layer of `record` counted at least these rows (CUDA-graph padding adds decode rows)."""
        return all(r.tokens["prefill"] >= self.prefill and r.tokens["decode"] >= self.decode
                   for r in record.layers.values())


def _generate(url: str, api_key: str | None, text: str, max_tokens: int) -> dict[str, object]:
    body = json.dumps({"text": text, "sampling_params": {"max_new_tokens": max_tokens, "temperature": 0}}).encode()
    req = urllib.request.Request(url + "/generate", data=body, headers={"Content-Type": "application/json"})
    if api_key:
        req.add_header("Authorization", f"Bearer {api_key}")
    try:
        with urllib.request.urlopen(req, timeout=3600) as resp:
            return json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        raise RuntimeError(f"/generate answered HTTP {exc.code}: {exc.read()[:500]!r}") from None


def _wait_for_record(out: Path, sent: Sent, stopping: threading.Event) -> RouteRecord:
    deadline = time.monotonic() + RECORD_WAIT_S
    problem = "it was never written"
    while time.monotonic() < deadline and not stopping.is_set():
        if out.exists():
            try:
                record = load(out)
            except RecordError as exc:
                problem = str(exc)
            else:
                if sent.covered_by(record):
                    return record
                problem = f"it counts fewer rows than the {sent.prefill} prefilled and {sent.decode} decoded"
        stopping.wait(0.5)
    raise RuntimeError(f"route record {out}: {problem} after {RECORD_WAIT_S:.0f} s")


def record(argv: list[str]) -> int:
    """`winport experts record`."""
    from winport.serve.command import ServeError, build_plan, launch, on_stop_signals, stop_server, wait_ready

    ap = argparse.ArgumentParser(prog="winport experts record", usage="%(prog)s --prompts FILE --out FILE "
                                 "[--max-tokens N] (--demo | --model MODEL) [winport serve flags...]",
                                 description="Serve the prompts of a file and save the route counts of every "
                                             "MoE layer (winport serve --record-experts).")
    ap.add_argument("--prompts", type=Path, required=True, help="one prompt a line, or JSONL lines {\"text\": ...}")
    ap.add_argument("--out", type=Path, required=True, help="the route record to write (JSON)")
    ap.add_argument("--max-tokens", type=int, default=64, help="tokens generated per prompt, greedy (default 64)")
    args, serve_argv = ap.parse_known_args(argv)
    if "--record-experts" in serve_argv:
        ap.error("--record-experts is this command's --out")
    if args.max_tokens < 1:
        ap.error("--max-tokens must be at least 1")
    try:
        prompts = read_prompts(args.prompts)
    except ValueError as exc:
        print(f"winport experts record: {exc}", file=sys.stderr)
        return 2
    out = Path(args.out).expanduser().resolve()
    # The server writes beside --out, renamed over it only once complete: a failed run loses no
    # earlier record, and an earlier record cannot pass for this run's.
    partial = out.with_name(f".{out.name}.recording")
    partial.unlink(missing_ok=True)
    if "--" in serve_argv:
        cut = serve_argv.index("--")
        own, extra = serve_argv[:cut], serve_argv[cut + 1:]
    else:
        own, extra = serve_argv, []
    # No warm-up request: the record holds the prompts' routes only.
    try:
        plan = build_plan([*own, "--record-experts", str(partial), "--", "--skip-server-warmup", *extra])
    except ServeError as exc:
        print(f"winport experts record: {exc}".replace("--record-experts", "--out"), file=sys.stderr)
        return 2
    rec: RouteRecord | None = None
    proc = launch(plan)
    stopping = threading.Event()
    on_stop_signals(stopping)
    try:
        if not wait_ready(plan, proc, stopping):
            return 1
        sent = Sent()
        start = time.monotonic()
        for i, text in enumerate(prompts, 1):
            if stopping.is_set():
                print("winport experts record: stopped; no record written", file=sys.stderr)
                return 1
            sent.add(_generate(plan.url, plan.api_key, text, args.max_tokens)["meta_info"])  # type: ignore[arg-type]
            print(f"winport experts record: prompt {i}/{len(prompts)} done ({sent.prefill} tokens prefilled, "
                  f"{sent.generated} generated, {time.monotonic() - start:.0f} s)", flush=True)
        rec = _wait_for_record(partial, sent, stopping)
    except (RuntimeError, OSError) as exc:
        print(f"winport experts record: {exc}", file=sys.stderr)
        return 1
    finally:
        stop_server(proc, stopping)
        if rec is None:
            partial.unlink(missing_ok=True)  # nothing half-done is left beside --out
    partial.replace(out)
    print(f"winport experts record: wrote {out}: {len(rec.layers)} MoE layers, {sent.prefill} prefill and "
          f"{sent.decode} decode tokens; `winport serve ... --expert-placement {out}` starts the GPU slots "
          "from it", flush=True)
    print(summary(rec, DEFAULT_SLOTS))
    return 0


DEFAULT_SLOTS = (5, 16, 32, 64)


def summary(rec: RouteRecord, slots: tuple[int, ...]) -> str:
    """A table: for N static GPU slots a layer (each layer's N most-routed experts), the share of
    all layers' recorded prefill and decode routes they would have served."""
    lines = [f"{rec.num_experts} experts a layer, top-{rec.top_k}, {len(rec.layers)} MoE layers",
             f"{'slots':>6} {'prefill share':>14} {'decode share':>13}"]
    for n in dict.fromkeys(min(n, rec.num_experts) for n in slots):  # a count above E says the same as E
        cells = []
        for kind in STEP_KINDS:
            served = total = 0
            for r in rec.layers.values():
                counts = r.decode if kind == "decode" else r.prefill
                served += sum(counts[e] for e in r.ranked()[:n])
                total += sum(counts)
            cells.append(f"{served / total:.1%}" if total else "-")
        lines.append(f"{n:>6} {cells[0]:>14} {cells[1]:>13}")
    return "\n".join(lines)


def show(argv: list[str]) -> int:
    """`winport experts show`."""
    ap = argparse.ArgumentParser(prog="winport experts show", description=summary.__doc__)
    ap.add_argument("record", type=Path)
    ap.add_argument("--slots", default=",".join(map(str, DEFAULT_SLOTS)), help="comma-separated slot counts")
    args = ap.parse_args(argv)
    try:
        slots = tuple(int(s) for s in args.slots.split(","))
    except ValueError:
        ap.error(f"--slots {args.slots}: comma-separated integers")
    if any(n < 0 for n in slots):
        ap.error(f"--slots {args.slots}: counts of 0 or more")
    try:
        rec = load(args.record)
    except RecordError as exc:
        print(f"winport experts show: {exc}", file=sys.stderr)
        return 2
    print(f"route record {args.record}: " + summary(rec, slots))
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point of `winport experts`."""
    argv = list(sys.argv[1:] if argv is None else argv)
    commands = {"record": record, "show": show}
    if argv and argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0
    if not argv or argv[0] not in commands:
        print(__doc__, file=sys.stderr)
        return 2
    return commands[argv[0]](argv[1:])
