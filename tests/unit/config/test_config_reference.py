"""docs/configuration.md is generated from the config dataclasses and must be current; every
key has a docstring to put there."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[3] / "scripts" / "gen_config_docs.py"


def _generator():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("gen_config_docs", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["gen_config_docs"] = module
    spec.loader.exec_module(module)
    return module


def test_every_config_key_has_a_docstring() -> None:
    from hybridflow.job_config import JobConfig

    rows = _generator().rows(JobConfig)
    assert len(rows) > 150  # it walked the nested sections
    assert [key for key, _, _, doc in rows if not doc] == []


def test_the_reference_page_is_current() -> None:
    gen = _generator()
    assert gen.PAGE.read_text() == gen.render(), (
        "docs/configuration.md is stale: run python scripts/gen_config_docs.py"
    )
