"""The service's command line: what a job's ``tinker:`` section gives it parses back to the
same settings, and a bound that would break the service is refused up front, by name."""

from __future__ import annotations

import pytest

from hybridflow.services.tinker.config import TinkerConfig
from hybridflow.services.tinker.server import parse_args


def test_a_jobs_tinker_section_reaches_the_service_as_it_was_set() -> None:
    config = TinkerConfig(
        enabled=True, port=0, max_tenants=3, max_sample_batch=5, journal_compact_mb=7
    )
    args = parse_args(config.server_args("builtin:tiny-qwen3", "/run"))
    assert (args.model, args.port, args.state_dir) == ("builtin:tiny-qwen3", 0, "/run/tinker")
    assert (args.max_tenants, args.max_sample_batch, args.journal_compact_mb) == (3, 5, 7)


@pytest.mark.parametrize(
    ("flag", "value", "says"),
    [
        ("--max-sample-batch", "0", "--max-sample-batch must be at least 1"),
        ("--max-tenants", "0", "--max-tenants must be at least 1"),
        ("--journal-compact-mb", "0", "--journal-compact-mb must be above 0"),
        ("--session-timeout", "-1", "--session-timeout must be above 0"),
    ],
)
def test_a_bound_that_breaks_the_service_is_refused_by_name(
    flag: str, value: str, says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        parse_args([flag, value])
    assert says in capsys.readouterr().err
