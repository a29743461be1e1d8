"""torch.distributed on one machine without a socket another machine can reach.

Targets sglang 0.5.23 `srt/distributed/parallel_state.py:init_distributed_environment`, which calls
`torch.distributed.init_process_group(init_method="tcp://<--host or 127.0.0.1>:<nccl_port>")` in
every scheduler rank, and torch 2.14's gloo backend (`distributed_c10d._create_gloo_process_group`),
which SGLang uses for its CPU groups on every device (and for the collectives themselves on CPU).

Two listeners come out of that on every start-up, TP=1 included:
- rank 0's TCPStore server on the nccl_port. Whatever host the URL names, torch's TCPStore server
  binds the wildcard address (`*:<port>`): an unauthenticated key-value store open to the network,
  and the socket a Windows firewall asks about.
- gloo's transport, one listener per group, on the address the machine's host name resolves to
  (torch's default device) or on GLOO_SOCKET_IFNAME's interface: on a typical Windows or Linux
  workstation that is its LAN address.

When every rank runs on this machine (one node, no --dist-init-addr, no
SGLANG_DISTRIBUTED_INIT_METHOD_OVERRIDE), neither needs the network: the ranks meet through a
FileStore (torch's `file://` rendezvous, on Windows as on Linux: no listener at all) and every gloo
device is created for 127.0.0.1 (GLOO_SOCKET_IFNAME is then ignored: nothing outside the machine
takes part). NCCL's bootstrap sockets likewise stay on the loopback interface on Linux
(NCCL_SOCKET_IFNAME=lo unless the user set it; Windows has no NCCL). A multi-node launch keeps
upstream's TCP rendezvous untouched.

torch before 2.14 (2.11 on the GPU test machine) has no `_create_gloo_process_group` to replace: its
gloo groups take their device from GLOO_SOCKET_IFNAME, so there the ranks get GLOO_SOCKET_IFNAME=lo
unless it is set
(Linux; winport pins torch 2.14.1, so Windows installs take the first route).

The store file lives in the temporary folder, named after the launching process (the common parent
of the ranks: its pid and start time) and the nccl_port. torch's FileStore leaves the file behind
when a rank process ends without destroying its process groups (SGLang's ranks do), so `winport
serve` removes it once the server has stopped (`remove_store_files`).
"""

from __future__ import annotations

import logging
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from winport import envs
from winport.patches._base import register, require_source

TARGET = "sglang.srt.distributed.parallel_state.init_distributed_environment"
GLOO_TARGET = "torch.distributed.distributed_c10d._create_gloo_process_group"
LOOPBACK = "127.0.0.1"
STORE_PREFIX = "winport-dist-store-"
logger = logging.getLogger(__name__)


def single_host() -> bool:
    """Whether every rank of this launch runs on this machine (SGLang's own view of the launch)."""
    from sglang.srt.environ import envs as sglang_envs
    from sglang.srt.runtime_context import get_parallel

    parallel = get_parallel()
    if sglang_envs.SGLANG_DISTRIBUTED_INIT_METHOD_OVERRIDE.get():
        return False  # the user chose the rendezvous
    return parallel.nnodes == 1 and not parallel.dist_init_addr


def _launcher_pid() -> int:
    """The process that started this one. SGLang's ranks are multiprocessing children, which know
    their parent's pid from multiprocessing itself; os.getppid() on Windows needs
    PssCaptureSnapshot, which Wine does not implement (the call aborts the process there)."""
    import multiprocessing

    parent = multiprocessing.parent_process()
    return parent.pid if parent is not None and parent.pid is not None else os.getppid()


def store_path(port: int, launcher_pid: int | None = None) -> Path:
    """The FileStore of the launch whose ranks were started by `launcher_pid` (default: this process's
    parent, which every rank shares) and rendezvous on `port` (SGLang's nccl_port).

    The launcher's start time is part of the name: a file a killed run left can never be taken for
    this launch's store, even when the pid and the port come round again.
    """
    import psutil

    pid = _launcher_pid() if launcher_pid is None else launcher_pid
    try:
        started = int(psutil.Process(pid).create_time() * 1000)
    except psutil.Error:
        started = 0
    return Path(tempfile.gettempdir()) / f"{STORE_PREFIX}{pid}-{started}-{port}"


def file_init_method(path: Path) -> str:
    """torch's `file://` init_method for `path` (torch reads a Windows URL's path through url2pathname,
    a POSIX one verbatim)."""
    if sys.platform == "win32":
        return path.as_uri()
    text = str(path)
    if any(c in text for c in "?#"):
        # urlparse would cut the path at these, and torch would open another file.
        raise ValueError(f"temporary folder {path.parent} has '?' or '#' in its name; set TMPDIR to another folder")
    return "file://" + text


def remove_store_files(launcher_pid: int) -> list[Path]:
    """Delete the store files a launch by `launcher_pid` left behind (its ranks were killed before
    torch could); return them."""
    removed = []
    for path in Path(tempfile.gettempdir()).glob(f"{STORE_PREFIX}{launcher_pid}-*"):
        try:
            path.unlink()
            removed.append(path)
        except OSError:
            pass  # still open on Windows, or gone already
    return removed


def loopback_init_method(init_method: str) -> str | None:
    """The file:// init_method replacing SGLang's tcp:// one, or None where upstream's stays."""
    if not init_method.startswith("tcp://") or not single_host():
        return None
    port = int(init_method.rsplit(":", 1)[1].rstrip("/"))
    return file_init_method(store_path(port))


def create_loopback_gloo_group(opts: Any, backend_options: object | None) -> Any:
    """torch's gloo backend creator, with its one device created for 127.0.0.1 instead of the host
    name's address (what `_create_gloo_process_group` builds otherwise: same timeout, threads,
    reconfigure flag, ranks and name)."""
    from torch.distributed import ProcessGroupGloo, is_gloo_available

    if not is_gloo_available():
        raise RuntimeError("Distributed package doesn't have Gloo built in")
    options = ProcessGroupGloo._Options()
    options._timeout = opts.timeout
    options._devices = [ProcessGroupGloo.create_device(hostname=LOOPBACK)]
    options._threads = 2 * len(options._devices)  # what torch's timeout constructor picks
    options.enable_reconfigure = bool(opts.enable_reconfigure)
    options.global_ranks_in_group = opts.global_ranks_in_group
    options.group_name = opts.group_id
    return ProcessGroupGloo(opts.store, opts.group_rank, opts.group_size, options)


def has_gloo_creator() -> bool:
    """Whether this torch builds gloo groups through `_create_gloo_process_group` (torch 2.14)."""
    from torch.distributed import distributed_c10d as c10d

    return hasattr(c10d, "_create_gloo_process_group")


def use_loopback_gloo() -> None:
    """Make torch create every later gloo group on 127.0.0.1 (whether or not the builtin gloo backend
    is registered yet); on a torch without the creator, through GLOO_SOCKET_IFNAME (module docstring)."""
    from torch.distributed import distributed_c10d as c10d

    if not has_gloo_creator():
        if sys.platform == "win32":
            raise RuntimeError("torch.distributed has no _create_gloo_process_group: winport needs the pinned "
                               "torch (2.14) to keep gloo on 127.0.0.1 on Windows")
        envs.set_default(envs.GLOO_SOCKET_IFNAME, "lo")  # a user's own choice stands
        return
    c10d._create_gloo_process_group = create_loopback_gloo_group
    plugin = c10d.Backend._plugins.get("GLOO")
    if plugin is not None:
        c10d.Backend._plugins["GLOO"] = plugin._replace(creator_fn=create_loopback_gloo_group)


def _around(original: Any, *args: Any, **kwargs: Any) -> Any:
    import torch.distributed

    if torch.distributed.is_initialized():
        return original(*args, **kwargs)
    # init_distributed_environment(world_size, rank, distributed_init_method, ...)
    if len(args) > 2:
        method, set_method = args[2], lambda m: (*args[:2], m, *args[3:])
    else:
        method, set_method = kwargs.get("distributed_init_method", "env://"), None
    replacement = loopback_init_method(method) if isinstance(method, str) else None
    if replacement is None:
        return original(*args, **kwargs)
    use_loopback_gloo()
    if sys.platform != "win32":
        envs.set_default(envs.NCCL_SOCKET_IFNAME, "lo")
    logger.info("winport: ranks meet through %s, gloo on %s (one machine: no network listener)",
                replacement, LOOPBACK)
    if set_method is not None:
        return original(*set_method(replacement), **kwargs)
    return original(*args, **{**kwargs, "distributed_init_method": replacement})


def register_patch() -> None:
    """Check upstream (SGLang's rendezvous call, torch's gloo creator) and register the hook."""
    require_source(TARGET, "torch.distributed.init_process_group(", "init_method=distributed_init_method")
    if has_gloo_creator():
        require_source(GLOO_TARGET, "ProcessGroupGloo(", "opts.store", "enable_reconfigure=opts.enable_reconfigure",
                       "global_ranks_in_group", "group_name = opts.group_id")
        require_source("torch.distributed.distributed_c10d._register_builtin_gloo_backend",
                       "_create_gloo_process_group")
    register(TARGET, _around, "AROUND")
