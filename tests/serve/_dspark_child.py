"""Child process of tests/serve/test_dspark_draft.py: SGLang's DSpark draft model on the CPU, in-process.

Builds SGLang 0.5.23's `DeepseekV4ForCausalLMDSpark` from the V4.1 demo config (as SGLang's model
loader would for `--speculative-algorithm DSPARK` with the draft bundled in the checkpoint: the same
config, FP8 [32, 32] quant config, MXFP4 routed experts), loads the demo's `mtp.*` tensors through
the model's own `load_weights`, runs every quant method's `process_weights_after_loading` (winport's
CPU patches, registered by loading SGLang's plugins as the server does), then runs the draft's
distinctive parts on the inputs the parent gives and saves what it saw. Runs in its own process:
it initializes torch.distributed (gloo, world 1) and SGLang's process-wide context.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path
from typing import Any

POISON_BYTE = 0x77  # written into every integer parameter before loading
# RadixAttention's KV-cache scales: not checkpoint tensors in DeepSeek's format (the FP8 KV cache
# scales per tile at run time); their quant method checks their defaults after loading.
NOT_IN_CHECKPOINT = (".attn.k_scale", ".attn.v_scale")


def _init_sglang(port: int) -> None:
    os.environ.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": "0", "WORLD_SIZE": "1",
                       "LOCAL_RANK": "0"})
    from sglang.srt.plugins import load_plugins

    load_plugins()  # winport's patches (WINPORT_PLATFORM=on), as in every server process
    from sglang.srt.distributed import parallel_state
    from sglang.srt.distributed.parallel_state import init_distributed_environment, initialize_model_parallel
    from sglang.srt.runtime_context import SpawnRanks, get_parallel, publish, reset_context
    from sglang.srt.server_args import ServerArgs

    init_distributed_environment(world_size=1, rank=0, local_rank=0, backend="gloo")
    reset_context()
    publish(ServerArgs(model_path="dummy", device="cpu", tp_size=1), role="test",
            ranks=SpawnRanks(world_rank=0))
    get_parallel().override_permanently(world_group=parallel_state._WORLD)
    initialize_model_parallel(backend="gloo")


def _poison(model: Any) -> None:
    import torch

    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(NOT_IN_CHECKPOINT):
                continue
            if p.dtype.is_floating_point:
                p.data.reshape(-1).view(torch.uint8).fill_(0xFF)  # NaN in every float format used here
            else:
                p.data.reshape(-1).view(torch.uint8).fill_(POISON_BYTE)


def _unwritten(model: Any) -> list[str]:
    import torch

    bad = []
    for name, p in model.named_parameters():
        if name.endswith(NOT_IN_CHECKPOINT):
            continue
        raw = p.data.reshape(-1).view(torch.uint8)
        if p.dtype.is_floating_point and p.dtype != torch.float8_e8m0fnu:
            if torch.isnan(p.data.float()).any():
                bad.append(name)
        elif (raw == (0xFF if p.dtype.is_floating_point else POISON_BYTE)).all():
            bad.append(name)
    return bad


def main(inputs_path: str, out_path: str, port: int) -> None:
    """Build, load, run; save a dict of facts and outputs to out_path."""
    import torch

    _init_sglang(port)
    from sglang.srt.configs.deepseek_v41 import DeepseekV41Config
    from sglang.srt.layers.quantization.fp8 import Fp8Config
    from sglang.srt.layers.vocab_parallel_embedding import ParallelLMHead, VocabParallelEmbedding
    from sglang.srt.models.deepseek_v4_dspark import DeepseekV4ForCausalLMDSpark

    from winport.demo import quantize as qz
    from winport.demo.config import demo_config
    from winport.demo.weights import _storage_dtype, _value
    from winport.demo.weights_v41 import dspark_tensors

    inputs = torch.load(inputs_path)
    cfg = demo_config("v41")
    checkpoint = qz.quantize_state_dict(dspark_tensors(cfg), qz.block_for("v41"))
    quant = Fp8Config.from_config(qz.quantization_config(qz.block_for("v41")))
    # What SGLang's loader sets on an Fp8Config for a DeepSeek-V4 checkpoint with int8 experts
    # (model_loader/loader.py, configs/model_config.py try_detect_fp4_experts); CPU: no FP8 dequant.
    quant.is_fp4_experts, quant.is_dsv4_fp4_experts, quant.dequant_fp4_to_fp8 = True, True, False
    torch.set_default_dtype(torch.bfloat16)  # the model runner builds models under the model dtype
    model = DeepseekV4ForCausalLMDSpark(DeepseekV41Config(**cfg), quant)
    lm_head = ParallelLMHead(cfg["vocab_size"], cfg["hidden_size"])
    embed = VocabParallelEmbedding(cfg["vocab_size"], cfg["hidden_size"])
    torch.set_default_dtype(torch.float32)
    params = {n: (tuple(p.shape), str(p.dtype)) for n, p in model.named_parameters()}
    _poison(model)

    warnings: list[str] = []

    class Catch(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            warnings.append(record.getMessage())

    logging.getLogger("sglang.srt.models.deepseek_v4_dspark").addHandler(Catch(logging.WARNING))
    fed: list[str] = []

    def stream() -> Any:
        for name, t in checkpoint.items():
            fed.append(name)
            yield name, t

    with torch.no_grad():
        model.load_weights(stream())
        unwritten = _unwritten(model)
        for module in model.modules():
            method = getattr(module, "quant_method", None)
            if method is not None and hasattr(method, "process_weights_after_loading"):
                method.process_weights_after_loading(module)
        # The target model's head (the demo's own head.weight, regenerated by name) and embedding.
        head = _value("head.weight", (cfg["vocab_size"], cfg["hidden_size"]), cfg, 0).to(_storage_dtype("head.weight"))
        lm_head.weight.copy_(head)
        model.attach_shared_modules(embed_tokens=embed, lm_head=lm_head)

        out: dict[str, Any] = {"params": params, "fed": fed, "warnings": warnings, "unwritten": unwritten,
                               "dropped": [n for n in fed if model._remap_dspark_weight_name(n) is None],
                               "stages": len(model.stages), "gamma": model.block_size,
                               "top_k": [s.mlp.top_k for s in model.stages],
                               "confidence": model.confidence_head is not None}
        x = inputs["x"]
        out["moe"] = [stage.mlp(x.clone()) for stage in model.stages]
        out["proj"] = model.project_target_hidden(inputs["main_hidden"])
        out["markov_bias"], _ = model.markov_head.step_bias(inputs["prev"], hidden_states=None, state=None)
        out["markov_fwd"], out["markov_embed"] = model.markov_head(inputs["prev"])
        out["logits"], out["post_hc"] = model.compute_base_logits(x)
        out["confidence_p"], out["confidence_raw"] = model.compute_confidence(
            anchor_tokens=inputs["anchor"], draft_tokens=inputs["draft"], confidence_features=inputs["features"])
    torch.save(out, out_path)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
    Path(sys.argv[2]).touch()
