"""winport's SGLang platforms: upstream's CPU and CUDA platforms with the Windows differences."""

from __future__ import annotations

from typing import Any

from sglang.srt.platforms.cpu import CpuSRTPlatform
from sglang.srt.platforms.cuda import CudaSRTPlatform

from winport.platform.launch_policy import apply_server_defaults


class WinportCpuPlatform(CpuSRTPlatform):
    """CPU platform: gloo for collectives (there is no NCCL on Windows)."""

    def get_torch_distributed_backend_str(self) -> str:
        """Collective backend name for torch.distributed."""
        return "gloo"

    def apply_server_args_defaults(self, server_args: Any) -> None:
        """winport's CPU defaults (winport.platform.launch_policy), for every way the server starts."""
        apply_server_defaults(server_args, "cpu")


class WinportCudaPlatform(CudaSRTPlatform):
    """CUDA platform without NCCL: gloo, no custom all-reduce."""

    def get_torch_distributed_backend_str(self) -> str:
        """Collective backend name for torch.distributed."""
        return "gloo"

    def apply_server_args_defaults(self, server_args: Any) -> None:
        """winport's CUDA defaults (winport.platform.launch_policy), for every way the server starts."""
        apply_server_defaults(server_args, "cuda")
