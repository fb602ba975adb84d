"""Model locations: the built-in checkpoints and the resolution of a model spec to a directory.

``resolve_model_path("builtin:tiny")`` returns the built-in checkpoint, shipped and cached (also
``builtin:tiny-random``, ``builtin:tiny-qwen3``, ``builtin:tiny-tools`` and the reward model
``builtin:tiny-rm``;
``builtin:qwen2.5-0.5b-shape`` is a random-init model of a real checkpoint's dims, built on
first use: ``shapes.py``);
a local Hugging Face checkpoint directory is used as it is; a hub id ``org/name[@revision]``
(not an existing path) resolves through the Hugging Face cache, downloading where the network
allows (``hub.py``). Importing this package does not import torch, transformers or
huggingface_hub.
"""

from __future__ import annotations

from pathlib import Path

from hybridflow.models.builtin import ensure_builtin_model
from hybridflow.models.hub import parse_hub_id, resolve_hub_model
from hybridflow.models.shapes import SHAPES, ensure_shape_model

BUILTIN_PREFIX = "builtin:"
"""Model specs starting with this name a built-in model (``builtin:tiny``, ``builtin:tiny-rm``)."""


def resolve_model_path(spec: str) -> Path:
    """Directory of the checkpoint named by ``spec`` (built-in name, local directory or hub
    id); ValueError naming the spec when there is none with a config.json."""
    if spec.startswith(BUILTIN_PREFIX):
        name = spec[len(BUILTIN_PREFIX) :]
        if name in SHAPES:
            return ensure_shape_model(name)
        return ensure_builtin_model(name)
    hub_id = parse_hub_id(spec)
    if hub_id is not None:
        path = resolve_hub_model(hub_id)
        if not (path / "config.json").is_file():
            raise ValueError(f"model {spec!r}: the hub snapshot {path} has no config.json")
        return path
    path = Path(spec).expanduser()
    if not (path / "config.json").is_file():
        raise ValueError(
            f"model path {spec!r} is not a local checkpoint directory containing config.json "
            "(nor a hub id org/name[@revision]; or use builtin:tiny)"
        )
    return path


__all__ = ["BUILTIN_PREFIX", "ensure_builtin_model", "resolve_model_path"]
