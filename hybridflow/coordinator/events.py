"""Timestamped events of a run (events.jsonl): each generate, score, train step and weight
sync with its start and duration, for detailed logs and timeline plots. Thread-safe."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any


class EventLog:
    """Appends one timestamped line per event to ``events.jsonl`` (None: discards them)."""

    def __init__(self, path: Path | None) -> None:
        self._lock = threading.Lock()
        self._file = path.open("a") if path is not None else None
        self.t0 = time.time()

    def record(self, kind: str, start: float, end: float, **fields: Any) -> None:
        """``start``/``end`` are time.time() stamps; ``kind`` e.g. "generate", "train"."""
        if self._file is None:
            return
        line = json.dumps({"kind": kind, "start": start, "duration_s": end - start, **fields})
        with self._lock:
            self._file.write(line + "\n")
            self._file.flush()

    def close(self) -> None:
        if self._file is not None:
            with self._lock:
                self._file.close()
                self._file = None
