"""Hugging Face Hub model ids (``org/name``, ``org/name@revision``) resolved through the hub's
cache.

A spec that is not an existing local path and looks like ``org/name[@revision]`` is a hub id.
It resolves to the snapshot directory ``huggingface_hub.snapshot_download`` returns: a
download where the network allows (files already cached are not fetched again), else the
cached snapshot. ``HF_HUB_OFFLINE=1`` skips the download; ``HF_HUB_CACHE`` (else the hub's
default under ``HF_HOME``) is where the cache lies. Neither way working is one ValueError
naming the id and both causes.

Knows nothing of models' contents: config.json is checked by the callers. huggingface_hub is
imported only when a hub id is resolved.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*(@[\w./-]+)?")
_TRUE = {"1", "ON", "YES", "TRUE"}  # huggingface_hub's truthy env values


@dataclass(frozen=True)
class HubId:
    """A Hugging Face hub model id with an optional revision (``org/name[@revision]``)."""

    repo_id: str
    """``org/name``."""
    revision: str | None
    """Branch, tag or commit after ``@``; None: the default branch."""

    def __str__(self) -> str:
        return self.repo_id + (f"@{self.revision}" if self.revision else "")


def parse_hub_id(spec: str) -> HubId | None:
    """The hub id ``spec`` names, or None: an existing local path, or not ``org/name[@rev]``."""
    if Path(spec).expanduser().exists() or not _HUB_ID.fullmatch(spec):
        return None
    repo_id, _, revision = spec.partition("@")
    return HubId(repo_id, revision or None)


def hub_offline() -> bool:
    """``HF_HUB_OFFLINE`` is set: only the cache is used (read now, not at import)."""
    return os.environ.get("HF_HUB_OFFLINE", "").upper() in _TRUE


def cached_snapshot(hub_id: HubId) -> Path | None:
    """The cached snapshot of ``hub_id`` without any network access; None when not cached."""
    from huggingface_hub import snapshot_download

    try:
        return Path(
            snapshot_download(
                hub_id.repo_id,
                revision=hub_id.revision,
                cache_dir=_cache_dir(),
                local_files_only=True,
            )
        )
    except FileNotFoundError:  # the hub's LocalEntryNotFoundError
        return None


def resolve_hub_model(hub_id: HubId) -> Path:
    """The snapshot directory of ``hub_id``: downloaded (unless offline), else cached;
    ValueError naming the id and why neither worked."""
    from huggingface_hub import snapshot_download

    if hub_offline():
        download_error = "HF_HUB_OFFLINE is set"
    else:
        try:
            return Path(
                snapshot_download(hub_id.repo_id, revision=hub_id.revision, cache_dir=_cache_dir())
            )
        except Exception as exc:  # any failure (network, auth, no such repo): try the cache
            download_error = f"{type(exc).__name__}: {exc}".splitlines()[0]
    cached = cached_snapshot(hub_id)
    if cached is None:
        raise ValueError(
            f"model {str(hub_id)!r}: not downloaded ({download_error}) and not in the Hugging "
            f"Face cache {_cache_dir() or '(default: HF_HOME/hub)'}"
        )
    return cached


def _cache_dir() -> str | None:
    """``HF_HUB_CACHE``, else ``HF_HOME/hub``, as set now (huggingface_hub reads them once,
    at import); None: the hub's default."""
    if os.environ.get("HF_HUB_CACHE"):
        return os.environ["HF_HUB_CACHE"]
    if os.environ.get("HF_HOME"):
        return str(Path(os.environ["HF_HOME"]) / "hub")
    return None
