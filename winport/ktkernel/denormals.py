"""Keep IEEE subnormals in torch's CPU math after kt-kernel loads.

kt-kernel 0.7.2's extension turns on flush-to-zero / denormals-are-zero in the thread that imports
it, and again in the thread that builds its first CPUInfer pool (measured: a float32 2^-130 reads 0
afterwards). SGLang imports kt_kernel in every scheduler process (layers/moe/kt_ep_wrapper.py), so
without this the rest of the process would compute differently from the torch references (E8M0
scales below 2^-126 would dequantize to 0). kt-kernel's own worker threads keep their mode.
"""

from __future__ import annotations

from types import ModuleType

from winport import importhooks

TARGET = "kt_kernel"


def flushes_denormals() -> bool:
    """Whether this thread's float math flushes subnormals to zero (x86 FTZ/DAZ)."""
    import torch

    tiny = torch.tensor([2.0 ** -130], dtype=torch.float32)
    return bool((tiny * 1.0)[0] == 0)


def restore_ieee(_module: ModuleType | None = None) -> None:
    """Turn this thread's flush-to-zero off again if something turned it on."""
    import torch

    if flushes_denormals():
        torch.set_flush_denormal(False)


def install() -> None:
    """Run restore_ieee once kt_kernel is imported (now, if it already is)."""
    importhooks.on_import(TARGET, restore_ieee)
