"""Running untrusted programs (the policy's code) in a sandbox: ``Sandbox`` is the interface
(``run`` one program under ``SandboxLimits``, get a ``SandboxResult`` with a named outcome),
``bubblewrap.BubblewrapSandbox`` the backend on Debian's ``bubblewrap``. A machine without
the tool gets ``SandboxUnavailable``, never an unsandboxed run."""

from hybridflow.sandbox.types import (
    Sandbox,
    SandboxLimits,
    SandboxResult,
    SandboxUnavailable,
)

__all__ = ["Sandbox", "SandboxLimits", "SandboxResult", "SandboxUnavailable"]
