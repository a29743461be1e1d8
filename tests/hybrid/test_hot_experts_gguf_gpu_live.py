"""On a CUDA GPU: a GGUF served straight from its file (no safetensors anywhere), hybrid with 4 of 8
experts a layer on the GPU and WINPORT_HOT_EXPERTS=1: the slots follow the routes with the experts
read from the GGUF (winport.hybrid.expert_source.GGUFExperts). At load each layer checks that what a
swap would write into GPU slot 0 is byte for byte what loading put there (FP8 after SGLang's
dequantization), so a server that comes up has passed that check in every layer. Run on the GPU machine:
    .venv/bin/python -m pytest -q -s tests/hybrid/test_hot_experts_gguf_gpu_live.py
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from tests.serve._server import generate, running, start
from tests.serve.test_server_live import GREEDY_PROMPTS

pytestmark = pytest.mark.gpu


def test_a_gguf_served_directly_swaps_its_experts_in_from_the_gguf(tmp_path: Path) -> None:
    from winport.demo.command import main

    gguf = tmp_path / "demo-v4-BF16-MXFP4.gguf"
    assert main(["--variant", "v4", "--out", str(tmp_path / "demo"), "--gguf", str(gguf), "--mxfp4-experts"]) == 0
    srv = start(["--model", str(gguf), "--gpu-experts", "4", "--vram-gib", "32"],
                env={"WINPORT_HOT_EXPERTS": "1", "WINPORT_HOT_EXPERTS_INTERVAL": "2"})
    with running(srv):
        for text in GREEDY_PROMPTS:
            out = generate(srv, {"text": text, "sampling_params": {"max_new_tokens": 32, "temperature": 0}})
            assert out["text"], "no text generated"
        deadline = time.monotonic() + 30
        while "first GPU expert swaps" not in srv.text() and time.monotonic() < deadline:
            time.sleep(1)
        log = srv.text()
    assert "GPU slots follow the routes" in log, log[-4000:]
    folder = re.search(r"winport serve: model (\S+) on cuda", log)
    assert folder and not list(Path(folder[1]).glob("*.safetensors")), "the GGUF was converted, not served directly"
    m = re.search(r"first GPU expert swaps \((\d+)\) after (\d+) decode steps", log)
    assert m, "no expert was swapped in:\n" + log[-4000:]
    print(m[0])
