"""SGLang's inter-process zmq channels over tcp://127.0.0.1 instead of ipc:// files.

Targets sglang 0.5.23 `srt/server_args.py:PortArgs.init_new`, which names the tokenizer, scheduler,
detokenizer, rpc and metrics channels `ipc://<temp file>` on a single node. Windows' libzmq has no
ipc transport ("Protocol not supported"); SGLang's own DP-attention branch already uses
tcp://127.0.0.1 ports, so the consumers handle tcp. On winport's platforms every ipc:// name
PortArgs returns is replaced by a free loopback port: one code path on Linux and Windows, never
reachable from another machine.
"""

from __future__ import annotations

import dataclasses
import socket
from typing import Any

from winport.patches._base import register, require_source

TARGET = "sglang.srt.server_args.PortArgs.init_new"
FIELDS = ("tokenizer_ipc_name", "scheduler_input_ipc_name", "detokenizer_ipc_name", "rpc_ipc_name",
          "metrics_ipc_name", "tokenizer_worker_ipc_name")


def free_loopback_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def tcp_instead_of_ipc(port_args: Any) -> Any:
    """Return port_args with each ipc:// endpoint replaced by tcp://127.0.0.1:<free port>."""
    changes = {}
    for name in FIELDS:
        value = getattr(port_args, name, None)
        if isinstance(value, str) and value.startswith("ipc://"):
            changes[name] = f"tcp://127.0.0.1:{free_loopback_port()}"
    if not changes:
        return port_args
    if dataclasses.is_dataclass(port_args):
        return dataclasses.replace(port_args, **changes)
    for name, value in changes.items():
        setattr(port_args, name, value)
    return port_args


def _after(result: Any, *args: Any, **kwargs: Any) -> Any:
    return tcp_instead_of_ipc(result)


def register_patch() -> None:
    """Check upstream and register the hook."""
    require_source(TARGET, 'tokenizer_ipc_name=f"ipc://', 'rpc_ipc_name=f"ipc://')
    register(TARGET, _after, "AFTER")
