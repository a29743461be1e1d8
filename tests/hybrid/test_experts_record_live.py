"""`winport experts record` on the CPU demo: a prompt file served, every MoE layer's routes counted
in prefill and decode and saved, then read back by `winport experts show`.

On the CPU there is no CUDA-graph padding and the demo router never answers "no expert", so each
layer's rows equal the tokens the server reports prefilling (its cache's tokens excluded) and
decoding (each answer's tokens but the first, which the prefill gives), and its route counts sum
to top-k times the rows: the counters see the router's logical ids, before the CPU/GPU split.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

from tests.helpers import REPO_ROOT
from tests.serve._server import CACHE, record_experts
from winport.hybrid import route_record


def test_record_a_prompt_file_and_show_it(tmp_path: Path) -> None:
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("The quick brown fox jumps over the lazy dog.\n\n"
                       + json.dumps({"text": "def add(a, b):\n    return a + b"}) + "\nhello there\n", encoding="utf-8")
    out = tmp_path / "routes.json"
    out.write_text("an earlier record, replaced only once the new one is complete", encoding="utf-8")
    text = record_experts(["--prompts", str(prompts), "--out", str(out), "--max-tokens", "5", "--demo"])
    assert "prompt 3/3 done" in text and "winport: routed experts' route counts are written to" in text
    m = re.search(r"(\d+) MoE layers, (\d+) prefill and (\d+) decode tokens", text)
    assert m, text[-3000:]
    prefill, decode = int(m[2]), int(m[3])
    assert prefill >= 3 and decode > 0
    rec = route_record.load(out)
    config = json.loads((CACHE / "demo-v4" / "config.json").read_text(encoding="utf-8"))
    route_record.check_model(rec, config, out)  # every MoE layer of the demo, its expert count
    assert len(rec.layers) == int(m[1])
    for layer, r in rec.layers.items():
        assert r.tokens == {"prefill": prefill, "decode": decode}, (layer, r.tokens)
        assert sum(r.prefill) == prefill * rec.top_k and sum(r.decode) == decode * rec.top_k, layer
    assert not list(tmp_path.glob(".routes.json*")), "a partial record was left beside --out"
    assert "slots  prefill share" in text

    shown = subprocess.run([sys.executable, "-m", "winport", "experts", "show", str(out), "--slots", "1,8"],
                           capture_output=True, text=True, cwd=REPO_ROOT, timeout=120)
    assert shown.returncode == 0, shown.stderr
    rows = dict(re.findall(r"^\s+(\d+)\s+(\S+)\s+\S+$", shown.stdout, re.M))
    assert rows["8"] == "100.0%" and float(rows["1"].rstrip("%")) < 100.0, shown.stdout


def test_bad_inputs_fail_before_a_server_starts(tmp_path: Path) -> None:
    empty = tmp_path / "empty.txt"
    empty.write_text("\n\n", encoding="utf-8")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "no text field"}\n', encoding="utf-8")
    for prompts, message in ((empty, "no prompt in it"), (bad, "line 1: a JSON line needs")):
        r = subprocess.run([sys.executable, "-m", "winport", "experts", "record", "--prompts", str(prompts),
                            "--out", str(tmp_path / "r.json"), "--demo"],
                           capture_output=True, text=True, cwd=REPO_ROOT, timeout=120)
        assert r.returncode == 2 and message in r.stderr and str(prompts) in r.stderr, r.stderr
    r = subprocess.run([sys.executable, "-m", "winport", "experts", "show", str(bad)],
                       capture_output=True, text=True, cwd=REPO_ROOT, timeout=120)
    assert r.returncode == 2 and "field 'format'" in r.stderr and str(bad) in r.stderr, r.stderr
