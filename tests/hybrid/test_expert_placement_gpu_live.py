"""On a CUDA GPU: `winport experts record` with the demo served hybrid (4 of 8 experts a layer on
the GPU, CUDA graphs on), then `winport serve --expert-placement` from that record. Run on the GPU
machine:
    .venv/bin/python -m pytest -q -s tests/hybrid/test_expert_placement_gpu_live.py

Decode on CUDA replays graphs captured at padded batch sizes, so a layer's decode rows can exceed
the tokens decoded (never fall below); prefill rows are exact.
"""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest

from tests.serve._server import CACHE, generate, record_experts, running, start
from tests.serve.test_server_live import GREEDY_PROMPTS
from winport.hybrid import route_record

pytestmark = pytest.mark.gpu
SLOTS = 4


def test_record_on_cuda_then_start_the_slots_from_it(tmp_path: Path) -> None:
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("\n".join(GREEDY_PROMPTS) + "\n", encoding="utf-8")
    out = tmp_path / "routes.json"
    text = record_experts(["--prompts", str(prompts), "--out", str(out), "--max-tokens", "16", "--demo",
                           "--gpu-experts", str(SLOTS), "--vram-gib", "32"])
    m = re.search(r"(\d+) prefill and (\d+) decode tokens", text)
    assert m, text[-3000:]
    prefill, decode = int(m[1]), int(m[2])
    rec = route_record.load(out)
    route_record.check_model(rec, json.loads((CACHE / "demo-v4" / "config.json").read_text()), out)
    for r in rec.layers.values():
        assert r.tokens["prefill"] == prefill and r.tokens["decode"] >= decode, r.tokens
        assert sum(r.prefill) == prefill * rec.top_k
    print(text[text.index(f"{rec.num_experts} experts a layer"):])

    srv = start(["--demo", "--gpu-experts", str(SLOTS), "--vram-gib", "32", "--expert-placement", str(out)])
    with running(srv):
        out_text = generate(srv, {"text": GREEDY_PROMPTS[0], "sampling_params": {"max_new_tokens": 8,
                                                                                 "temperature": 0}})["text"]
    line = re.search(r"starting with the most-routed experts of the route record \(layer (\d+): (\[[\d, ]*\])\)",
                     srv.text())
    assert line, srv.text()[-4000:]
    layer, experts = int(line[1]), ast.literal_eval(line[2])
    assert experts == rec.placement(layer, SLOTS), (experts, rec.placement(layer, SLOTS))
    assert out_text, "no text generated"
    print(f"placement of layer {layer}: {experts}; answer {out_text!r}")
