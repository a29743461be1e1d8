"""One MoE layer's CPU experts in kt-kernel 0.7.2: wrapper lifecycle and the weight hand-off.

Weights reach kt-kernel from memory, with no second on-disk copy of the experts. kt-kernel 0.7.2
loads MXFP4 only through a safetensors loader (`load_weights_from_tensors` raises
NotImplementedError for MXFP4), but its NativeMoEWrapper reads experts through one object, the
class-level `_native_loader_instance`, whose `load_experts(base_key)` returns per-expert lists of
packed weights and bf16 scales; `load_weights` passes their pointers to the C++ backend, which
copies (repacks) them into its own buffers, then drops the lists and releases the loader. So
winport installs a loader that serves the tensors SGLang's weight loader handed over (collected
per layer by :meth:`KTExperts.stage`, from whatever the checkpoint is: DeepSeek safetensors or a
GGUF) and the C++ copy is the only lasting one. The staged host copy of a layer lives only until
the layer is complete: it is handed over at once (peak RAM: kt-kernel's copy + one layer).
With SGLang's `--kt-weight-path`, kt-kernel reads its own files instead (the flag's meaning).

The mask is loaded all-False and set afterwards (kt-kernel's AVX2 backend never loads an expert
masked GPU at load time, so placement could not change later). Experts the GPU serves are also
given to kt-kernel as id -1: the AVX2 backend computes every loaded expert whatever the mask says
(measured here: flipping the mask after load left the output unchanged), so the ids, not the mask,
keep an expert from being counted twice.

Forward, CPU tensors: kt-kernel's stream path (`submit_with_cuda_stream`) never runs on CPU-only
torch and `forward()` then returns all zeros with no error; only KT_FORCE_SYNC_SUBMIT=1 selects
its synchronous path. `submit` refuses CPU tensors without it (:class:`SilentZeroPathError`).
CUDA tensors: `submit_forward` / `sync_forward` with the current stream (host functions on the
stream: capturable in CUDA graphs; SGLang's decode graph runner calls
KTMoEWrapper.set_capture_batch_sizes so the staging buffers stay fixed per batch size; that list
counts requests, not tokens, so winport.hybrid.kt_capture_buffers keeps every buffer a capture used).
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterator
from typing import Any

import torch

from winport import envs
from winport.hybrid.settings import KTSettings
from winport.ktkernel.denormals import restore_ieee

logger = logging.getLogger(__name__)

SYNC_ENV = envs.KT_FORCE_SYNC_SUBMIT.name
PROJS = ("w1", "w3", "w2")  # gate, up, down: kt-kernel's and DeepSeek's checkpoint names
KINDS = ("weight", "scale")


class SilentZeroPathError(RuntimeError):
    """kt-kernel would take its stream path on CPU tensors, which returns zeros without an error."""


def import_kt() -> Any:
    """Import kt_kernel (CPU-only torch: after making pin_memory a no-op, which kt-kernel needs)."""
    if not torch.cuda.is_available():
        from winport.patches import cpu_pin_memory

        cpu_pin_memory.apply()
    with keep_denormal_mode():
        import kt_kernel
    from winport.hybrid import kt_capture_buffers

    kt_capture_buffers.apply()
    return kt_kernel


def e8m0_to_bf16(scale: torch.Tensor, name: str) -> torch.Tensor:
    """E8M0 scales (uint8 / float8_e8m0fnu bytes, or float32 powers of two) -> bf16 with the same value.

    bf16 has float32's 8-bit exponent, so byte e becomes the bf16 bits e << 7 (2^(e-127)); e = 0 is
    2^-127, a bf16 subnormal (bits 0x0040). 255 (NaN) and non-powers of two are refused.
    """
    if scale.dtype in (torch.uint8, torch.float8_e8m0fnu):
        e = scale.view(torch.uint8).to(torch.int32)
    elif scale.dtype == torch.float32:
        s = scale.double()
        e = (torch.log2(s).round() + 127).clamp(0, 255).to(torch.int32)
        if not torch.equal(torch.exp2(e.double() - 127), s):
            raise ValueError(f"{name}: float32 MXFP4 scales must be powers of two in [2^-127, 2^127]")
    else:
        raise ValueError(f"{name}: MXFP4 scales must be E8M0 bytes or float32, got {scale.dtype}")
    if bool((e == 255).any()):
        raise ValueError(f"{name}: E8M0 scale 255 (NaN)")
    bits = torch.where(e == 0, torch.full_like(e, 0x40), e << 7)
    return bits.to(torch.int16).view(torch.bfloat16).contiguous()


@contextlib.contextmanager
def keep_denormal_mode() -> Iterator[None]:
    """Keep IEEE subnormals in this thread across a kt-kernel call that turns flush-to-zero on
    (its import and its first wrapper: winport.ktkernel.denormals says why)."""
    try:
        yield
    finally:
        restore_ieee()


class _MemoryExperts:
    """The loader kt-kernel's NativeMoEWrapper reads (`load_experts`, `close_all_handles`), serving
    one layer's experts from memory."""

    def __init__(self, layer_idx: int, experts: dict[str, list[torch.Tensor]] | None) -> None:
        self.layer_idx = layer_idx
        self.experts = experts

    def load_experts(self, base_key: str, device: str = "cpu") -> dict[str, list[torch.Tensor]]:
        """kt-kernel's loader call; it asks for `model.layers.{L}` first."""
        if self.experts is None or base_key != f"model.layers.{self.layer_idx}":
            raise KeyError(base_key)  # kt-kernel tries its other prefixes, then says none matched
        return self.experts

    def close_all_handles(self) -> None:
        """kt-kernel's release call after the C++ copy: drop the host tensors."""
        self.experts = None


# SGLang's DeepSeek-V4 load_weights runs the weight loaders of several layers in a thread pool, and
# kt-kernel's loader slot is one class attribute: without the lock one layer's hand-off cleared the
# slot while another layer was reading it (kt-kernel then fell back to opening a file by that name).
_LOADER_SLOT = threading.Lock()


@contextlib.contextmanager
def _loader(obj: _MemoryExperts) -> Iterator[None]:
    from kt_kernel.utils.amx import NativeMoEWrapper

    with _LOADER_SLOT:
        NativeMoEWrapper._native_loader_instance = obj
        try:
            yield
        finally:
            NativeMoEWrapper._native_loader_instance = None


class KTExperts:
    """The routed experts of one MoE layer in kt-kernel (all of them; the mask/ids say which run)."""

    def __init__(self, layer_idx: int, num_experts: int, top_k: int, hidden_size: int,
                 intermediate_size: int, settings: KTSettings, swiglu_limit: float | None) -> None:
        if settings.method != "MXFP4":
            raise ValueError(f"--kt-method {settings.method}: winport hands kt-kernel the checkpoint's MXFP4 "
                             "experts (--kt-method MXFP4); other kt formats need --kt-weight-path")
        for what, n in (("hidden size", hidden_size), ("moe intermediate size", intermediate_size)):
            if n % 32:
                raise ValueError(f"layer {layer_idx}: kt-kernel's MXFP4 experts need a {what} divisible by 32, got {n}")
        self.on_cpu_torch = not torch.cuda.is_available()
        if self.on_cpu_torch:
            # The only kt-kernel path that computes on CPU tensors (module docstring).
            if envs.KT_FORCE_SYNC_SUBMIT.is_set() and not envs.KT_FORCE_SYNC_SUBMIT.get():
                raise SilentZeroPathError(f"{SYNC_ENV}={envs.KT_FORCE_SYNC_SUBMIT.raw()!r} on CPU-only torch: kt-kernel's "
                                          "stream path would return zeros; unset it or set it to 1")
            envs.set_default(envs.KT_FORCE_SYNC_SUBMIT, "1")
        kt = import_kt()
        self.layer_idx, self.num_experts, self.top_k = layer_idx, num_experts, top_k
        self.hidden_size, self.intermediate_size = hidden_size, intermediate_size
        self.settings = settings
        self.variant = getattr(kt, "__cpu_variant__", "?")
        self._staged: dict[tuple[int, str, str], torch.Tensor] = {}
        self.loaded = False
        with keep_denormal_mode(), contextlib.ExitStack() as stack:
            if settings.weight_path is None:
                stack.enter_context(_loader(_MemoryExperts(layer_idx, None)))
            self.wrapper = kt.KTMoEWrapper(
                layer_idx=layer_idx, num_experts=num_experts, num_experts_per_tok=top_k,
                hidden_size=hidden_size, moe_intermediate_size=intermediate_size,
                gpu_experts_mask=torch.zeros(num_experts, dtype=torch.bool),
                cpuinfer_threads=settings.cpu_threads, threadpool_count=settings.threadpool_count,
                weight_path=settings.weight_path or "<winport: experts from memory>",
                chunked_prefill_size=settings.chunk, method=settings.method,
                max_deferred_experts_per_token=settings.max_deferred_experts_per_token,
                swiglu_limit=float(swiglu_limit or 0.0))
        # kt-kernel's own tensor: its pointer is what C++ reads, so it is the one to change in place.
        self.mask: torch.Tensor = self.wrapper.gpu_experts_mask

    @property
    def backend(self) -> str:
        """kt-kernel's C++ MoE class that runs this layer (known once loaded)."""
        moe = getattr(self.wrapper, "moe", None)
        return type(moe).__name__ if moe is not None else "not loaded"

    # --- weights ---------------------------------------------------------------------------------

    def _shape(self, proj: str, kind: str) -> tuple[int, int]:
        n, k = (self.hidden_size, self.intermediate_size) if proj == "w2" else (self.intermediate_size, self.hidden_size)
        return (n, k // 2) if kind == "weight" else (n, k // 32)

    def stage(self, expert: int, proj: str, kind: str, tensor: torch.Tensor) -> bool:
        """Keep one expert's packed weight or scale (checkpoint layout) for the hand-off; when the
        layer is complete, hand it to kt-kernel at once. Returns whether the layer is loaded now."""
        name = f"layer {self.layer_idx} expert {expert} {proj}.{kind}"
        if proj not in PROJS or kind not in KINDS:
            raise ValueError(f"{name}: kt-kernel's MXFP4 experts take w1/w3/w2 weights and scales only")
        if not 0 <= expert < self.num_experts:
            raise ValueError(f"{name}: expert id outside [0, {self.num_experts})")
        if tuple(tensor.shape) != self._shape(proj, kind):
            raise ValueError(f"{name}: shape {tuple(tensor.shape)}, expected {self._shape(proj, kind)} "
                             f"(MXFP4: two E2M1 codes a byte, one E8M0 scale per 32 inputs)")
        if kind == "weight":
            if tensor.dtype not in (torch.int8, torch.uint8):
                raise ValueError(f"{name}: packed MXFP4 weights are int8/uint8, got {tensor.dtype}")
            staged = tensor.detach().to("cpu").view(torch.uint8).contiguous().clone()
        else:
            staged = e8m0_to_bf16(tensor.detach().to("cpu"), name)
        self._staged[(expert, proj, kind)] = staged
        if len(self._staged) == self.num_experts * len(PROJS) * len(KINDS):
            self.load_from_memory()
        return self.loaded

    def missing(self) -> list[str]:
        """The staged pieces still missing (empty once loaded)."""
        if self.loaded:
            return []
        return [f"expert {e} {p}.{k}" for e in range(self.num_experts) for p in PROJS for k in KINDS
                if (e, p, k) not in self._staged]

    def load_from_memory(self) -> None:
        """Hand the staged experts to kt-kernel (one C++ copy) and drop the staged host copy."""
        missing = self.missing()
        if missing:
            raise ValueError(f"layer {self.layer_idx}: kt-kernel cannot load the experts, missing "
                             f"{len(missing)} pieces: {', '.join(missing[:6])}{' ...' if len(missing) > 6 else ''}")
        s = self._staged
        names = {"gate": "w1", "up": "w3", "down": "w2"}
        experts = {key: [s[(e, proj, "weight")] for e in range(self.num_experts)] for key, proj in names.items()}
        experts.update({f"{key}_scale": [s[(e, proj, "scale")] for e in range(self.num_experts)]
                        for key, proj in names.items()})
        mask_was = self.mask.clone()
        self.mask.zero_()  # loaded all-False (module docstring), then restored
        with _loader(_MemoryExperts(self.layer_idx, experts)):
            self.wrapper.load_weights(torch.arange(self.num_experts, dtype=torch.int64))
        self.mask.copy_(mask_was)
        self._staged = {}
        self.loaded = True

    def load_from_files(self) -> None:
        """kt-kernel reads its own safetensors folder (SGLang's --kt-weight-path)."""
        mask_was = self.mask.clone()
        self.mask.zero_()
        with _LOADER_SLOT:  # kt-kernel keeps its file loader in the same class attribute
            self.wrapper.load_weights(torch.arange(self.num_experts, dtype=torch.int64))
        self.mask.copy_(mask_was)
        self.loaded = True

    # --- forward ---------------------------------------------------------------------------------

    def _check(self, x: torch.Tensor) -> None:
        if not self.loaded:
            raise RuntimeError(f"layer {self.layer_idx}: kt-kernel experts used before their weights were loaded")
        if x.device.type == "cpu" and not envs.KT_FORCE_SYNC_SUBMIT.get():
            raise SilentZeroPathError(f"layer {self.layer_idx}: CPU tensors without {SYNC_ENV}=1 would take "
                                      "kt-kernel's stream path, which returns zeros")

    def fits(self, x: torch.Tensor) -> bool:
        """Whether one submit can take x (kt-kernel's buffers hold `chunk` tokens)."""
        return x.shape[0] <= self.settings.chunk

    def submit(self, x: torch.Tensor, cpu_ids: torch.Tensor, weights: torch.Tensor) -> None:
        """Start the CPU experts on x (ids -1 are skipped). On CUDA this enqueues on the current
        stream and returns at once; on CPU tensors the work is done when it returns."""
        self._check(x)
        stream = torch.cuda.current_stream(x.device).cuda_stream if x.is_cuda else 0
        self.wrapper.submit_forward(x, cpu_ids, weights.float(), stream)

    def sync(self, x: torch.Tensor) -> torch.Tensor:
        """The CPU experts' weighted sum for the x last submitted ([T, H] in x's dtype and device;
        kt-kernel's buffer, valid until this layer's parity comes round again: use it at once)."""
        stream = torch.cuda.current_stream(x.device).cuda_stream if x.is_cuda else 0
        return self.wrapper.sync_forward(x, stream)

    def forward(self, x: torch.Tensor, cpu_ids: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """Submit + sync, in chunks of `chunk` tokens for long prefills (a new tensor)."""
        parts = []
        for start in range(0, x.shape[0], self.settings.chunk):
            end = start + self.settings.chunk
            self.submit(x[start:end], cpu_ids[start:end], weights[start:end])
            parts.append(self.sync(x[start:end]).clone())
        return torch.cat(parts) if parts else torch.zeros_like(x)
