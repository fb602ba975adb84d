"""Config values that name user code: "package.module:function" or "path/to/file.py:function".

``load_callable`` imports the named object when the service (or worker) starts, so a bad path
fails at start-up with a ValueError naming the path, not on the first batch. It checks that the
object is callable and accepts a probe argument list; it never calls it. Used by the reward
service's scorers and the learner's advantage estimators and policy losses.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import inspect
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any


def is_import_path(value: str) -> bool:
    """True when ``value`` has the form "module:attr" (both parts non-empty)."""
    module_name, sep, attr_path = value.rpartition(":")
    return bool(sep and module_name and attr_path)


def load_callable(
    path: str, kind: str, probe_args: Sequence[Any], signature: str
) -> Callable[..., Any]:
    """Import ``path`` and return the callable it names; ValueError if it is bad.

    ``kind`` names what is loaded in messages ("scorer"); the callable must accept
    ``probe_args`` positionally (``signature`` describes them in the message).
    """
    module_name, _, attr_path = path.rpartition(":")
    if not is_import_path(path):
        raise ValueError(
            f"{kind} path {path!r}: expected 'package.module:function' or 'file.py:function'"
        )
    is_file = module_name.endswith(".py")
    if is_file and not Path(module_name).is_file():
        raise ValueError(f"{kind} path {path!r}: file {module_name!r} does not exist")
    try:
        module = (
            _import_file(Path(module_name), kind)
            if is_file
            else importlib.import_module(module_name)
        )
    except Exception as exc:  # any import-time failure of user code is a config error
        raise ValueError(
            f"{kind} path {path!r}: cannot import {module_name!r}: {type(exc).__name__}: {exc}"
        ) from exc
    target: Any = module
    for attr in attr_path.split("."):
        if not hasattr(target, attr):
            raise ValueError(
                f"{kind} path {path!r}: {module_name!r} has no attribute {attr_path!r}"
            )
        target = getattr(target, attr)
    if not callable(target):
        raise ValueError(f"{kind} path {path!r}: {attr_path!r} is not callable")
    try:
        inspect.signature(target).bind(*probe_args)
    except TypeError as exc:
        raise ValueError(f"{kind} path {path!r}: must accept {signature}: {exc}") from exc
    except ValueError:
        pass  # builtins without an introspectable signature: trust the caller
    return target  # type: ignore[no-any-return]


def _import_file(file_path: Path, kind: str) -> Any:
    resolved = str(file_path.resolve())
    digest = hashlib.sha1(resolved.encode()).hexdigest()[:12]
    module_name = f"hybridflow_user_{kind.replace(' ', '_')}_{file_path.stem}_{digest}"
    spec = importlib.util.spec_from_file_location(module_name, resolved)
    if spec is None or spec.loader is None:
        raise ImportError(f"{resolved} cannot be loaded as a module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    spec.loader.exec_module(module)
    return module
