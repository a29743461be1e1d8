"""Vocab-parallel embedding masks on CPU without torch.compile.

Targets sglang 0.5.23 `srt/layers/vocab_parallel_embedding.py:get_masked_input_and_mask`, which
`VocabParallelEmbedding._embed_local_shard` calls whenever the vocabulary is split (TP > 1). It is
decorated with `torch.compile(dynamic=True)`: on CPU, TorchInductor generates C++ and builds it
with the system compiler at the first request. A Windows machine usually has no such compiler
(the call fails), and on this 2-core Linux machine the build held rank 1 for minutes (py-spy:
inductor's CppCodeCache waiting on its lock) while rank 0 waited in the embedding all-reduce,
long enough for SGLang's 300 s watchdog to kill the server. The function is a handful of integer
comparisons on the token ids, so on CPU the undecorated function (torch.compile keeps it as
`_torchdynamo_orig_callable`) is called directly. Other devices keep the compiled one.
"""

from __future__ import annotations

from typing import Any

import torch

from winport.patches._base import UpstreamChangedError, register, require_source

TARGET = "sglang.srt.layers.vocab_parallel_embedding.get_masked_input_and_mask"


def eager_of(compiled: Any) -> Any:
    """The undecorated function behind a torch.compile wrapper (fails loudly when absent)."""
    eager = getattr(compiled, "_torchdynamo_orig_callable", None)
    if eager is None or eager is compiled:
        raise UpstreamChangedError(f"{TARGET} is no longer a torch.compile wrapper with an eager original")
    return eager


def _masked(original: Any, input_: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
    if input_.device.type == "cpu":
        return eager_of(original)(input_, *args, **kwargs)
    return original(input_, *args, **kwargs)


def register_patch() -> None:
    """Check upstream and register the hook."""
    obj = require_source(TARGET, "input_ = vocab_mask * (input_ - valid_offset)", "return input_, ~vocab_mask")
    eager_of(obj)
    require_source("sglang.srt.layers.vocab_parallel_embedding.VocabParallelEmbedding._embed_local_shard",
                   "masked_input, input_mask = get_masked_input_and_mask(")
    register(TARGET, _masked)
