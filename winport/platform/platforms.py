"""winport's SGLang platforms: upstream's CPU and CUDA platforms with the Windows differences."""

from __future__ import annotations

from sglang.srt.platforms.cpu import CpuSRTPlatform
from sglang.srt.platforms.cuda import CudaSRTPlatform


class WinportCpuPlatform(CpuSRTPlatform):
    """CPU platform: gloo for collectives (there is no NCCL on Windows)."""

    def get_torch_distributed_backend_str(self) -> str:
        """Collective backend name for torch.distributed."""
        return "gloo"


class WinportCudaPlatform(CudaSRTPlatform):
    """CUDA platform without NCCL: gloo, no custom all-reduce."""

    def get_torch_distributed_backend_str(self) -> str:
        """Collective backend name for torch.distributed."""
        return "gloo"
