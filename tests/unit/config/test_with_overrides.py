"""Overrides applied to a loaded job config (the coordinator's services' addresses, which
arrive after it loaded its file) give what loading the file with them appended gives: the
same config, the same errors, no notices, and the file is not read again."""

import logging
from pathlib import Path

import pytest

from hybridflow.config.loader import ConfigError
from hybridflow.job_config import load_job_config, override_job_config

REPO = Path(__file__).resolve().parents[3]
JOBS = sorted((REPO / "deploy" / "configs").glob("*.yaml"))
ADDRESSES = [
    "coordinator.rollout_addresses=[127.0.0.1:5001,127.0.0.1:5002]",
    "coordinator.reward_address=127.0.0.1:5003",
    "coordinator.learner_address=127.0.0.1:5004",
]


def _loads(path: Path) -> bool:
    try:
        load_job_config(path)
    except ConfigError:
        return False
    return True


@pytest.mark.parametrize("path", [p for p in JOBS if _loads(p)], ids=lambda p: p.name)
def test_overrides_on_the_loaded_job_equal_loading_the_file_with_them(path):
    base = ["coordinator.num_steps=3", "coordinator.sampling.temperature=0.7"]
    job = load_job_config(path, base)
    assert override_job_config(job, path, ADDRESSES) == load_job_config(path, [*base, *ADDRESSES])


def test_a_derived_key_follows_an_overridden_source_with_no_notice(caplog):
    path = REPO / "deploy" / "configs" / "quickstart.yaml"
    job = load_job_config(path)
    with caplog.at_level(logging.WARNING, logger="hybridflow.config.loader"):
        moved = override_job_config(job, path, ["coordinator.sampling.temperature=0.5"])
    assert moved.learner.temperature == 0.5
    assert not caplog.records, [r.getMessage() for r in caplog.records]


def test_a_bad_override_is_refused_with_the_message_of_a_fresh_load():
    path = REPO / "deploy" / "configs" / "quickstart.yaml"
    job = load_job_config(path)
    bad = ["coordinator.reward_address=[1, 2]"]
    with pytest.raises(ConfigError) as fresh:
        load_job_config(path, bad)
    with pytest.raises(ConfigError) as again:
        override_job_config(job, path, bad)
    assert str(again.value) == str(fresh.value)
    assert str(again.value).startswith(f"{path}: ")


def test_the_file_is_not_read_again(tmp_path):
    path = tmp_path / "job.yaml"
    path.write_text("coordinator:\n  num_steps: 4\n")
    job = load_job_config(path)
    path.unlink()  # a second read would fail: config file not found
    assert override_job_config(job, path, ADDRESSES).coordinator.reward_address == (
        "127.0.0.1:5003"
    )
