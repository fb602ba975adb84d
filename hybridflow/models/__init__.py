"""Model locations: the built-in checkpoints and the resolution of a model spec to a directory.

``resolve_model_path("builtin:tiny")`` builds (once) and returns the built-in checkpoint (also
``builtin:tiny-random`` and the reward model ``builtin:tiny-rm``);
any other spec must be a local Hugging Face checkpoint directory. Hub names are never
downloaded. Importing this package does not import torch or transformers.
"""

from __future__ import annotations

from pathlib import Path

from hybridflow.models.builtin import ensure_builtin_model

BUILTIN_PREFIX = "builtin:"
"""Model specs starting with this name a built-in model (``builtin:tiny``, ``builtin:tiny-rm``)."""


def resolve_model_path(spec: str) -> Path:
    """Directory of the checkpoint named by ``spec`` (built-in name or local directory)."""
    if spec.startswith(BUILTIN_PREFIX):
        return ensure_builtin_model(spec[len(BUILTIN_PREFIX) :])
    path = Path(spec).expanduser()
    if not (path / "config.json").is_file():
        raise ValueError(
            f"model path {spec!r} is not a local checkpoint directory containing config.json "
            "(hub names are never downloaded; use a local dir or builtin:tiny)"
        )
    return path


__all__ = ["BUILTIN_PREFIX", "ensure_builtin_model", "resolve_model_path"]
