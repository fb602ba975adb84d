"""A tokenizer without torch, for processes that only turn text into ids and back.

The coordinator encodes prompts and decodes responses; importing transformers the usual way
also imports torch, which costs it ~3 CPU-seconds and ~300 MB before the first step. Here
transformers is imported while ``torch`` is marked absent in ``sys.modules`` (so
``importlib.util.find_spec("torch")`` is None and transformers loads its torch-free build:
tokenizers, configuration, chat templates). Where torch is already loaded (the built-in
model was just built in this process) nothing is hidden. A tokenizer class that does need
torch falls back to the ordinary import, with one log line.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

_ADVISORY = "TRANSFORMERS_NO_ADVISORY_WARNINGS"
"""Silences transformers' "PyTorch was not found" notice while torch is hidden."""


@contextmanager
def _torch_hidden() -> Iterator[bool]:
    """Yields whether torch is hidden (False when torch or transformers is already loaded)."""
    if "torch" in sys.modules or "transformers" in sys.modules:
        yield False
        return
    saved = os.environ.get(_ADVISORY)
    sys.modules["torch"] = None  # type: ignore[assignment]
    os.environ[_ADVISORY] = "1"
    try:
        yield True
    finally:
        if "torch" in sys.modules and sys.modules["torch"] is None:
            del sys.modules["torch"]
        if saved is None:
            os.environ.pop(_ADVISORY, None)
        else:
            os.environ[_ADVISORY] = saved


def _forget_transformers() -> None:
    for name in [m for m in sys.modules if m == "transformers" or m.startswith("transformers.")]:
        del sys.modules[name]


def load_tokenizer(model_dir: str | Path) -> Any:
    """``AutoTokenizer.from_pretrained(model_dir)``, without importing torch if it can."""
    with _torch_hidden() as hidden:
        try:
            from transformers import AutoTokenizer

            return AutoTokenizer.from_pretrained(str(model_dir))
        except ImportError as exc:
            if not hidden:
                raise
            reason = exc
    log.info("tokenizer of %s needs torch (%s); loading it with torch", model_dir, reason)
    _forget_transformers()
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(model_dir))
