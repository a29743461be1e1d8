"""winport.patches.zmq_tcp_endpoints: SGLang's ipc:// endpoints become loopback tcp."""

from __future__ import annotations

import dataclasses


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
