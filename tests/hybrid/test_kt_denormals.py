"""kt-kernel's extension turns on flush-to-zero where it loads; winport turns it off again in every
interpreter of the venv (winport.ktkernel.denormals, installed by the .pth bootstrap), so an import of
kt_kernel by SGLang leaves torch's CPU math with IEEE subnormals."""

from __future__ import annotations

from tests.helpers import run_python_ok

PROBE = "import torch; print(torch.tensor([2.0 ** -130]).mul(3.0).item() == 3.0 * 2.0 ** -130)"


def test_import_of_kt_kernel_keeps_subnormals() -> None:
    out = run_python_ok(f"import kt_kernel\n{PROBE}")
    assert out.strip().splitlines()[-1] == "True"


def test_kt_kernel_flushes_without_winport() -> None:
    """The control: with winport's hook cancelled, the same import flushes subnormals."""
    code = ("from winport import importhooks\nimporthooks.cancel('kt_kernel')\n"
            f"import kt_kernel\n{PROBE}")
    out = run_python_ok(code)
    assert out.strip().splitlines()[-1] == "False"
