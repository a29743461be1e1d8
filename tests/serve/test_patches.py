"""Each winport patch to SGLang: it applies to the installed SGLang, does what it says, and refuses
to apply blindly when the upstream code it targets has changed."""

from __future__ import annotations

import dataclasses
import signal
import types

import pytest

from tests.helpers import run_python
from winport import patches
from winport.patches import _base


def test_every_patch_matches_the_installed_sglang() -> None:
    # register_patch() checks each upstream fingerprint first; a changed SGLang stops here. In a
    # fresh interpreter, because the patches change module state for the rest of the process.
    proc = run_python("from winport import patches; patches.register_all(); print('applied', len(patches.PATCHES))")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip() == f"applied {len(patches.PATCHES)}"


def test_require_source_fails_loudly_on_changed_upstream() -> None:
    with pytest.raises(_base.UpstreamChangedError, match="changed upstream"):
        _base.require_source("sglang.srt.utils.common.parse_lscpu_topology", "this text is not there")
    with pytest.raises(_base.UpstreamChangedError, match="no longer exists"):
        _base.require_source("sglang.srt.utils.common.no_such_function_anywhere")


def test_register_all_turns_a_changed_upstream_into_exit(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken() -> None:
        raise _base.UpstreamChangedError("fake change")

    fake = types.ModuleType("winport.patches.fake_broken")
    fake.register_patch = broken  # type: ignore[attr-defined]
    monkeypatch.setitem(__import__("sys").modules, "winport.patches.fake_broken", fake)
    monkeypatch.setattr(patches, "PATCHES", ("fake_broken",))
    with pytest.raises(SystemExit, match="winport patch 'fake_broken' cannot be applied: fake change"):
        patches.register_all()


def test_zmq_endpoints_become_loopback_tcp() -> None:
    from winport.patches.zmq_tcp_endpoints import tcp_instead_of_ipc

    @dataclasses.dataclass
    class FakePortArgs:
        tokenizer_ipc_name: str
        scheduler_input_ipc_name: str
        detokenizer_ipc_name: str
        rpc_ipc_name: str
        metrics_ipc_name: str
        tokenizer_worker_ipc_name: str | None
        nccl_port: int

    args = FakePortArgs("ipc:///tmp/a", "ipc:///tmp/b", "ipc:///tmp/c", "ipc:///tmp/d", "ipc:///tmp/e", None, 5)
    out = tcp_instead_of_ipc(args)
    names = [out.tokenizer_ipc_name, out.scheduler_input_ipc_name, out.detokenizer_ipc_name,
             out.rpc_ipc_name, out.metrics_ipc_name]
    assert all(n.startswith("tcp://127.0.0.1:") for n in names)
    assert len(set(names)) == 5 and out.tokenizer_worker_ipc_name is None and out.nccl_port == 5
    already = FakePortArgs(*(["tcp://127.0.0.1:1"] * 5), None, 5)
    assert tcp_instead_of_ipc(already) is already


def test_sigquit_becomes_sigterm_only_where_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    from winport.patches import windows_signals

    assert windows_signals.apply() is False  # Linux has SIGQUIT: untouched
    monkeypatch.delattr(signal, "SIGQUIT")
    assert windows_signals.apply() is True
    assert signal.SIGQUIT == signal.SIGTERM


def test_topology_without_lscpu(monkeypatch: pytest.MonkeyPatch) -> None:
    import psutil

    from winport.patches import cpu_topology_without_lscpu as topo

    rows = topo.topology_from_psutil()
    assert [r[0] for r in rows] == list(range(psutil.cpu_count(logical=True)))
    assert {r[3] for r in rows} == {0}
    monkeypatch.setattr(topo.shutil, "which", lambda name: None)
    assert topo._parse(lambda: pytest.fail("lscpu must not run")) == rows
    monkeypatch.setattr(topo.shutil, "which", lambda name: "/usr/bin/lscpu")
    assert topo._parse(lambda: "upstream") == "upstream"


def test_chat_template_replaces_the_recipe_only_when_it_is_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    from winport.patches import chat_template_without_recipe as chat

    with_template = types.SimpleNamespace(chat_template="{{ x }}")
    without = types.SimpleNamespace(chat_template=None)
    monkeypatch.setattr(chat, "recipe_available", lambda: False)
    assert chat._resolve(lambda **kw: "dsv4", tokenizer=with_template) is None
    assert chat._resolve(lambda **kw: "dsv32", tokenizer=with_template) == "dsv32"
    with pytest.raises(RuntimeError, match="deepseek-recipe package .* or a chat template"):
        chat._resolve(lambda **kw: "dsv41", tokenizer=without)
    monkeypatch.setattr(chat, "recipe_available", lambda: True)
    assert chat._resolve(lambda **kw: "dsv4", tokenizer=with_template) == "dsv4"


def test_pin_memory_is_a_no_op_without_cuda() -> None:
    import torch

    from winport.patches import cpu_pin_memory

    if torch.cuda.is_available():
        pytest.skip("only meaningful without CUDA")
    assert cpu_pin_memory.apply() is True
    t = torch.empty(4, pin_memory=True)
    assert t.shape == (4,) and not t.is_pinned()
    assert torch.zeros(2, pin_memory=True).pin_memory() is not None


def test_dsv4_modules_take_the_xpu_route_with_shim_functions() -> None:
    code = (
        "import sglang.kernels.ops.attention.dsv4.compress as c, sglang.kernels.ops.attention.dsv4.topk as t\n"
        "import sglang.srt.models.deepseek_v4 as m\n"
        "assert m._is_xpu is False and c._is_xpu is False\n"
        "from winport.patches import dsv4_generic_device; dsv4_generic_device.apply()\n"
        "print(m._is_xpu, c._is_xpu, t.is_xpu(), c.plan_compress_prefill.__qualname__, sorted(c._XPU_COMPRESS_FNS))\n"
    )
    proc = run_python(code)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split("\n")[-2] == "True True True sgl_kernel.plan_compress_prefill [4, 128]"


def test_fp8_kv_check_is_relaxed_for_deepseek_v4_only() -> None:
    from sglang.srt.mem_cache import kv_cache_configurator as mod

    from winport.patches.cpu_dsv4_fp8_kv import _configure

    seen = {}

    def original(self):  # type: ignore[no-untyped-def]
        seen["amx"] = mod.cpu_has_amx_support()
        seen["backends"] = list(mod.attention_backends())
        return "configured"

    class DeepseekV4ForCausalLM:  # the class name is what the patch checks
        pass

    dsv4 = types.SimpleNamespace(model=DeepseekV4ForCausalLM())
    assert _configure(original, dsv4) == "configured"
    assert seen == {"amx": True, "backends": ["intel_amx"]}
    assert mod.cpu_has_amx_support.__name__ != "<lambda>"  # restored after the call


def test_windows_compat_fills_what_windows_lacks() -> None:
    from winport.platform import windows_compat

    fake_mmap = types.ModuleType("mmap")
    env: dict[str, str] = {}
    changed = windows_compat.apply(fake_mmap, env)
    assert fake_mmap.PROT_READ == 1 and fake_mmap.MAP_SHARED == 1  # type: ignore[attr-defined]
    assert env["SGLANG_DISAGGREGATION_ZMQ_MAX_SOCKETS"] == "8192"
    assert "mmap.PROT_READ" in changed
    env2 = {"SGLANG_DISAGGREGATION_ZMQ_MAX_SOCKETS": "4096"}
    windows_compat.apply(fake_mmap, env2)
    assert env2["SGLANG_DISAGGREGATION_ZMQ_MAX_SOCKETS"] == "4096"  # a user's choice is kept
