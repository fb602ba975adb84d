"""The schedule imports no transport: gRPC stays in the clients and the process entry point."""

import subprocess
import sys

SCHEDULE_MODULES = [
    "hybridflow.clients",
    "hybridflow.coordinator.services",
    "hybridflow.coordinator.job",
    "hybridflow.coordinator.job_checkpoints",
    "hybridflow.coordinator.dispatch",
    "hybridflow.coordinator.buffer",
    "hybridflow.coordinator.dynamic_sampling",
    "hybridflow.coordinator.checkpoint",
]


def test_the_schedule_imports_no_grpc():
    code = (
        "import sys\n"
        + "".join(f"import {m}\n" for m in SCHEDULE_MODULES)
        + "print(sorted(m for m in sys.modules if m == 'grpc' or m.startswith('grpc.')))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    assert out.stdout.strip() == "[]", out.stdout
