"""Child-interpreter side of the Triton launch recorder (tests/ops/triton_specializations.py).

The recorder puts this folder on PYTHONPATH only while `WINPORT_RECORD_TRITON=1 pytest tests/ops`
runs, so interpreters started by tests (tests.helpers.run_python) record their kernel launches too.
The recorder is loaded by file path: the repository root need not be on sys.path this early.
"""

import importlib.util
import os
from pathlib import Path

if os.environ.get("RECORD_TRITON_SPECS_DIR"):
    _path = Path(__file__).resolve().parents[1] / "triton_specializations.py"
    _spec = importlib.util.spec_from_file_location("_winport_triton_recorder", _path)
    _mod = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(_mod)
    _mod.start_child_recording()
