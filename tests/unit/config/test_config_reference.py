"""docs/configuration.md is generated from the config dataclasses and must be current; every
key has a docstring to put there."""

from __future__ import annotations

from tests.scripts import load_script


def _generator():  # type: ignore[no-untyped-def]
    return load_script("gen_config_docs")


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
