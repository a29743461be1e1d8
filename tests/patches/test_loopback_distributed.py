"""winport.patches.loopback_distributed: one machine's ranks meet through a file and gloo on 127.0.0.1.

torch.distributed keeps process-wide state, so each case runs its ranks in fresh interpreters.
GLOO_SOCKET_IFNAME names a non-loopback interface of this machine: torch's gloo then listens on
that interface's address, as it does on a workstation whose host name resolves to its LAN address
(the usual case on Windows); the control runs show those listeners exist without the patch.
"""

from __future__ import annotations

import ipaddress
import json
import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import REPO_ROOT, run_python

# One rank: rendezvous, a gloo group, an all-reduce of fresh random numbers, then the listeners.
RANK = textwrap.dedent("""
    import json, os, sys
    import psutil, torch, torch.distributed as dist
    from winport.patches import loopback_distributed as lb
    mode, init, rank, world, seed = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
    if mode == "patched":
        lb.use_loopback_gloo()
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    group = dist.new_group(list(range(world)), backend="gloo")
    x = torch.randn(64, generator=torch.Generator().manual_seed(seed + rank), dtype=torch.float64)
    dist.all_reduce(x, group=group)
    listen = sorted({c.laddr.ip for c in psutil.Process().net_connections(kind="inet")
                     if c.status == psutil.CONN_LISTEN or c.type == 2})
    dist.barrier()
    print(json.dumps({"sum": x.tolist(), "listen": listen}))
    dist.destroy_process_group()
""")


def _lan_interface() -> str | None:
    import psutil

    for name, addrs in psutil.net_if_addrs().items():
        for a in addrs:
            if a.family == socket.AF_INET and not ipaddress.ip_address(a.address).is_loopback:
                return name
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _run_ranks(mode: str, init: str, world: int, seed: int, iface: str) -> list[dict]:
    env = {**os.environ, "GLOO_SOCKET_IFNAME": iface}
    env.pop("WINPORT_EMULATE_WINDOWS", None)
    procs = [subprocess.Popen([sys.executable, "-c", RANK, mode, init, str(r), str(world), str(seed)], env=env,
                              cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for r in range(world)]
    out = []
    for p in procs:
        stdout, stderr = p.communicate(timeout=240)
        assert p.returncode == 0, stderr[-3000:]
        out.append(json.loads(stdout.strip().splitlines()[-1]))
    return out


def _non_loopback(addrs: list[str]) -> list[str]:
    return [a for a in addrs if not ipaddress.ip_address(a).is_loopback]


@pytest.fixture(scope="module")
def iface() -> str:
    name = _lan_interface()
    if name is None:
        pytest.fail("this machine has no non-loopback IPv4 interface to show gloo's default listener on")
    return name


def test_tp2_ranks_meet_through_a_file_and_gloo_listens_on_loopback_only(iface: str, tmp_path: Path) -> None:
    import torch

    from winport.patches.loopback_distributed import file_init_method

    seed = int.from_bytes(os.urandom(4), "little")
    store = tmp_path / "store"
    ranks = _run_ranks("patched", file_init_method(store), 2, seed, iface)
    want = sum(torch.randn(64, generator=torch.Generator().manual_seed(seed + r), dtype=torch.float64)
               for r in range(2))
    for r in ranks:
        got = torch.tensor(r["sum"], dtype=torch.float64)
        assert not torch.isnan(got).any()
        torch.testing.assert_close(got, want, rtol=0, atol=1e-12)
        assert r["listen"], "gloo should still listen (on loopback) for its pairs"
        assert _non_loopback(r["listen"]) == [], r["listen"]


def test_without_the_patch_gloo_and_the_tcp_store_listen_beyond_loopback(iface: str) -> None:
    """The control: what SGLang's tcp://127.0.0.1 rendezvous gives in stock torch."""
    ranks = _run_ranks("stock", f"tcp://127.0.0.1:{_free_port()}", 1, 0, iface)
    listen = ranks[0]["listen"]
    assert any(ipaddress.ip_address(a).is_unspecified for a in listen), listen  # the TCPStore server
    assert any(not ipaddress.ip_address(a).is_loopback and not ipaddress.ip_address(a).is_unspecified
               for a in listen), listen  # gloo on the interface's address


def test_init_method_is_replaced_on_one_machine_only(monkeypatch: pytest.MonkeyPatch) -> None:
    from winport.patches import loopback_distributed as lb

    monkeypatch.setattr(lb, "single_host", lambda: True)
    got = lb.loopback_init_method("tcp://127.0.0.1:29517")
    assert got is not None and got == lb.file_init_method(lb.store_path(29517))
    assert lb.store_path(29517).name.startswith(f"{lb.STORE_PREFIX}{os.getppid()}-")
    assert lb.store_path(29517).name.endswith("-29517")
    assert lb.loopback_init_method("env://") is None
    monkeypatch.setattr(lb, "single_host", lambda: False)
    assert lb.loopback_init_method("tcp://10.0.0.1:29517") is None


def test_hook_hands_the_file_method_to_sglang_and_switches_gloo(monkeypatch: pytest.MonkeyPatch) -> None:
    from torch.distributed import distributed_c10d as c10d

    from winport.patches import loopback_distributed as lb

    seen: list[tuple[tuple, dict]] = []
    monkeypatch.setattr(lb, "single_host", lambda: True)
    monkeypatch.setattr(c10d, "_create_gloo_process_group", c10d._create_gloo_process_group)
    if "GLOO" in c10d.Backend._plugins:
        monkeypatch.setitem(c10d.Backend._plugins, "GLOO", c10d.Backend._plugins["GLOO"])
    monkeypatch.delenv("NCCL_SOCKET_IFNAME", raising=False)
    lb._around(lambda *a, **k: seen.append((a, k)), world_size=2, rank=0,
               distributed_init_method="tcp://127.0.0.1:29999", backend="gloo")
    assert seen[0][1]["distributed_init_method"] == lb.file_init_method(lb.store_path(29999))
    assert seen[0][1]["world_size"] == 2
    assert c10d._create_gloo_process_group is lb.create_loopback_gloo_group
    if sys.platform != "win32":
        assert os.environ["NCCL_SOCKET_IFNAME"] == "lo"
    lb._around(lambda *a, **k: seen.append((a, k)), 2, 0, "tcp://127.0.0.1:29998")
    assert seen[1][0][2] == lb.file_init_method(lb.store_path(29998))


def test_leftover_store_files_of_a_launch_are_removed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import tempfile

    from winport.patches import loopback_distributed as lb

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    mine, other = lb.store_path(1234, launcher_pid=777), lb.store_path(1234, launcher_pid=778)
    mine.write_bytes(b"x")
    other.write_bytes(b"x")
    assert lb.remove_store_files(777) == [mine]
    assert not mine.exists() and other.exists()


def test_targets_still_look_as_expected() -> None:
    # In a fresh interpreter: registering changes SGLang's hook registry for the rest of the process.
    proc = run_python("from winport.patches import loopback_distributed as p; p.register_patch(); print('ok')")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().endswith("ok")


def _child_store_name(q: Any) -> None:
    from winport.patches import loopback_distributed as lb

    def getppid() -> int:
        raise OSError("os.getppid: stands in for Wine's abort")

    os.getppid = getppid
    q.put(lb.store_path(4321).name)


def test_ranks_name_the_store_after_their_multiprocessing_parent() -> None:
    """Every rank (a multiprocessing child of the launcher) names the same file after the launcher,
    taken from multiprocessing rather than os.getppid() (which aborts under Wine: the Wine tier's
    demo server died in rank start-up that way)."""
    import multiprocessing

    from winport.patches import loopback_distributed as lb

    ctx = multiprocessing.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=_child_store_name, args=(q,)) for _ in range(2)]
    for p in procs:
        p.start()
    names = {q.get(timeout=120) for _ in procs}
    for p in procs:
        p.join(timeout=60)
    assert names == {lb.store_path(4321, launcher_pid=os.getpid()).name}
