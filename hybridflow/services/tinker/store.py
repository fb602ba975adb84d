"""What the Tinker-compatible service keeps on disk, so a killed service restarts with every
acknowledged call: an append-only journal and each model's state at its last ``optim_step``.

* ``journal.jsonl``: one JSON record a line, written and fsync'd before the caller hears of
  it: a session made, a call accepted (with everything needed to run it again), a call
  finished (with its result). A torn last line (a crash mid-write) is ignored: its call was
  never acknowledged.
* ``models/<model_id>.pt``: a model's adapter, AdamW state and step count, written atomically
  (temporary file, fsync, rename, fsync of the folder) after each ``optim_step`` and before its
  result is told, with that step's ``seq_id`` and result.
* ``checkpoints/<model_id>/{weights,sampler_weights}/<name>.pt``: what ``save_weights`` and
  ``save_weights_for_sampler`` wrote (``tinker://<model_id>/weights/<name>``).

The journal is compacted (``rewrite``) once it passes a size: what a restart no longer needs
goes (the calls whose results the service forgot, the bodies of calls a saved state holds);
``service.py`` decides what stays.

Recovery (``service.py``): each model's state file, then its calls after that state's
``seq_id`` run again in order, which rebuilds the gradients a crash lost; a call up to it keeps
its journaled result. Nothing is applied twice: the state file says which ``optim_step`` it
holds.
"""

from __future__ import annotations

import base64
import json
import os
import re
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

JOURNAL = "journal.jsonl"
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,127}$")


class Store:
    """The service's folder (created 0700 if missing)."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True, mode=0o700)
        (self.root / "models").mkdir(exist_ok=True)
        self._lock = threading.Lock()
        self._journal = open(self.root / JOURNAL, "a", encoding="utf-8")  # noqa: SIM115

    def close(self) -> None:
        with self._lock:
            self._journal.close()

    def append(self, record: dict[str, Any]) -> None:
        """One record, durable when this returns."""
        with self._lock:
            self._journal.write(json.dumps(record, separators=(",", ":")) + "\n")
            self._journal.flush()
            os.fsync(self._journal.fileno())

    def journal_bytes(self) -> int:
        with self._lock:
            return os.fstat(self._journal.fileno()).st_size

    def rewrite(self, keep: Callable[[dict[str, Any]], dict[str, Any] | None]) -> tuple[int, int]:
        """The journal as ``keep`` has each record, in order (None drops it), in place of the
        old one whole or not at all (a new file, fsync'd, renamed over it); no record is
        appended meanwhile. Its sizes before and after."""
        path = self.root / JOURNAL
        with self._lock:
            before = os.fstat(self._journal.fileno()).st_size
            tmp = path.with_name(JOURNAL + ".tmp")
            with open(tmp, "w", encoding="utf-8") as out:
                for record in self.records():
                    kept = keep(record)
                    if kept is not None:
                        out.write(json.dumps(kept, separators=(",", ":")) + "\n")
                out.flush()
                os.fsync(out.fileno())
            self._journal.close()
            os.replace(tmp, path)
            _fsync_folder(self.root)
            self._journal = open(path, "a", encoding="utf-8")  # noqa: SIM115
            return before, os.fstat(self._journal.fileno()).st_size

    def records(self) -> list[dict[str, Any]]:
        """Every whole record, in order (a torn last line left out)."""
        path = self.root / JOURNAL
        out = []
        lines = path.read_text(encoding="utf-8").split("\n")
        for number, line in enumerate(lines, 1):
            if not line:
                continue
            try:
                out.append(json.loads(line))
            except ValueError:
                if number < len(lines) - 1:
                    raise ValueError(f"{path}:{number}: a damaged record mid-journal") from None
        return out

    def model_path(self, model_id: str) -> Path:
        return self.root / "models" / f"{_safe(model_id)}.pt"

    def checkpoint_path(self, model_id: str, kind: str, name: str) -> Path:
        if kind not in ("weights", "sampler_weights"):
            raise ValueError(f"no checkpoint kind {kind!r}")
        if not _NAME.match(name) or ".." in name:
            raise ValueError(
                f"checkpoint name {name!r}: letters, digits, '_', '-' and '.', up to 128, "
                "starting with a letter or digit"
            )
        return self.root / "checkpoints" / _safe(model_id) / kind / f"{name}.pt"

    @staticmethod
    def write(path: Path, payload: dict[str, Any]) -> None:
        """``payload`` (tensors and plain values) at ``path``, whole or not at all."""
        import torch

        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        with open(tmp, "wb") as f:
            torch.save(payload, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        _fsync_folder(path.parent)

    @staticmethod
    def read(path: Path) -> dict[str, Any]:
        import torch

        payload: dict[str, Any] = torch.load(path, map_location="cpu", weights_only=True)
        return payload


def encode_bytes(raw: bytes) -> str:
    return base64.b64encode(raw).decode("ascii")


def decode_bytes(text: str) -> bytes:
    return base64.b64decode(text.encode("ascii"))


def _safe(model_id: str) -> str:
    if "/" in model_id or model_id in ("", ".", ".."):
        raise ValueError(f"model id {model_id!r} cannot name a file")
    return model_id


def _fsync_folder(folder: Path) -> None:
    """Makes a rename in ``folder`` durable."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
