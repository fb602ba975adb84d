"""How a service process ends once its ``main`` has returned: ``exit_service``.

Standard library only: each service's ``__main__`` imports it at module level.
"""

from __future__ import annotations

import atexit
import os
import sys
from typing import NoReturn


def exit_service(code: int) -> NoReturn:
    """Ends a service process with ``code`` once its ``main`` has returned (server stopped,
    engine closed, shared memory released): the ``atexit`` handlers run (logging's flush
    among them), then the process exits without the interpreter's teardown. With torch and
    transformers loaded, that teardown (freeing every module and object one by one) takes
    1-3 s of CPU per process for nothing, and the launcher's stop waits for it. For a
    service's ``python -m`` entry only, never inside another program."""
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
