"""The nested learner config: every flat key of before still loads (to the same config as
its nested form), temperature / max_new_tokens come from coordinator.sampling, and the
devices lists take the old comma-separated strings. Imports without torch."""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

import pytest
import yaml

from hybridflow.config.fields import bound_of, derived_from, typed_bound
from hybridflow.config.loader import ConfigError, load_config
from hybridflow.job_config import JobConfig, load_job_config
from hybridflow.services.learner import config as learner_config_module
from hybridflow.services.learner.config import LearnerConfig

# Every key of the flat learner section (before the sections), a non-default value each.
FLAT: dict[str, object] = {
    "algorithm": "ppo",
    "dpo_beta": 0.2,
    "dpo_loss_type": "ipo",
    "rft_threshold": 0.5,
    "lr": 2.0e-4,
    "weight_decay": 0.0,
    "betas": [0.8, 0.99],
    "grad_clip": 0.5,
    "micro_batch_size": 4,
    "ppo_epochs": 2,
    "num_mini_batches": 2,
    "clip_ratio_low": 0.1,
    "clip_ratio_high": 0.28,
    "clip_ratio_c": None,
    "loss_agg_mode": "seq-mean-token-sum",
    "norm_adv_by_std": False,
    "norm_adv_eps": 1.0e-4,
    "kl_coef": 0.05,
    "kl_estimator": "k1",
    "off_policy": "tis",
    "is_cap": 3.0,
    "moe_router_replay": True,
    "kl_mode": "reward",
    "use_reference": True,
    "entropy_coef": 0.01,
    "temperature": 0.7,
    "critic_lr": 1.0e-4,
    "gamma": 0.9,
    "lam": 0.95,
    "value_clip": None,
    "advantage_estimator": "gae",
    "policy_loss": "gspo",
    "overlong_buffer": 2,
    "overlong_penalty_factor": 0.5,
    "max_new_tokens": 6,
    "seed": 3,
    "num_threads": 2,
    "device": "cuda",
    "peak_tflops": 100.0,
    "nproc_per_node": 2,
    "devices": "0,1",
    "critic_nproc_per_node": 1,
    "critic_devices": "2",
    "nnodes": 2,
    "node_rank": 1,
    "rdzv_endpoint": "h:29500",
    "local_addr": "h",
    "server": {"max_workers": 4},
    "checkpoint_dir": "/elsewhere",
}
NESTED: dict[str, object] = {
    "algorithm": "ppo",
    "advantage_estimator": "gae",
    "policy_loss": "gspo",
    "moe_router_replay": True,
    "seed": 3,
    "peak_tflops": 100.0,
    "checkpoint_dir": "/elsewhere",
    "server": {"max_workers": 4},
    "optimizer": {"lr": 2.0e-4, "weight_decay": 0.0, "betas": [0.8, 0.99], "grad_clip": 0.5},
    "update": {"micro_batch_size": 4, "epochs": 2, "num_mini_batches": 2},
    "loss": {
        "clip_ratio_low": 0.1,
        "clip_ratio_high": 0.28,
        "clip_ratio_c": None,
        "agg_mode": "seq-mean-token-sum",
        "entropy_coef": 0.01,
        "off_policy": "tis",
        "is_cap": 3.0,
    },
    "advantage": {"norm_by_std": False, "norm_eps": 1.0e-4, "gamma": 0.9, "lam": 0.95},
    "kl": {"coef": 0.05, "estimator": "k1", "mode": "reward", "use_reference": True},
    "critic": {"lr": 1.0e-4, "value_clip": None},
    "overlong": {"buffer": 2, "penalty_factor": 0.5},
    "dpo": {"beta": 0.2, "loss_type": "ipo"},
    "rft": {"threshold": 0.5},
    "topology": {
        "device": "cuda",
        "num_threads": 2,
        "nproc_per_node": 2,
        "devices": ["0", "1"],
        "critic_nproc_per_node": 1,
        "critic_devices": ["2"],
        "nnodes": 2,
        "node_rank": 1,
        "rdzv_endpoint": "h:29500",
        "local_addr": "h",
    },
}
SAMPLING = {"temperature": 0.7, "max_new_tokens": 6}
DERIVED = ("temperature", "max_new_tokens")


def _job(tmp_path: Path, learner: dict[str, object], name: str) -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump({"learner": learner, "coordinator": {"sampling": SAMPLING}}))
    return path


def test_every_flat_key_is_renamed_or_kept_or_derived() -> None:
    kept = {f.name for f in dataclasses.fields(LearnerConfig)}
    for key in FLAT:
        assert key in LearnerConfig.RENAMED_KEYS or key in kept, key
    assert set(LearnerConfig.RENAMED_KEYS) <= set(FLAT)


def test_a_job_file_with_every_flat_key_loads_as_its_nested_form(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="hybridflow.config.loader"):
        flat = load_job_config(_job(tmp_path, FLAT, "flat"))
    nested_raw = {k: v for k, v in NESTED.items() if k not in DERIVED}
    nested = load_job_config(_job(tmp_path, nested_raw, "nested"))
    assert flat.learner == nested.learner
    assert (nested.learner.temperature, nested.learner.max_new_tokens) == (0.7, 6)
    notices = "\n".join(r.getMessage() for r in caplog.records)
    for old, new in LearnerConfig.RENAMED_KEYS.items():
        assert f"'learner.{old}' is now 'learner.{new}'" in notices
    for key in DERIVED:
        assert f"'learner.{key}' is now taken from 'coordinator.sampling.{key}'" in notices
    assert "'learner.topology.devices' is now a list of devices" in notices


def test_the_learner_takes_temperature_and_max_new_tokens_from_sampling() -> None:
    job = load_job_config(None, ["coordinator.sampling.temperature=0.5"])
    assert (job.learner.temperature, job.learner.max_new_tokens) == (0.5, 8)
    job = load_job_config(None, ["learner.overlong.buffer=4"])  # within the default 8
    assert job.learner.max_new_tokens == 8
    with pytest.raises(ConfigError, match=r"learner\.overlong\.buffer \(9\) needs"):
        load_job_config(None, ["learner.overlong.buffer=9"])


@pytest.mark.parametrize(
    ("old", "source"),
    [
        ("learner.temperature=0.7", "coordinator.sampling.temperature"),
        ("learner.max_new_tokens=6", "coordinator.sampling.max_new_tokens"),
    ],
)
def test_an_old_twin_key_that_differs_from_sampling_is_refused(old: str, source: str) -> None:
    key = old.partition("=")[0]
    with pytest.raises(ConfigError, match=rf"'{key}' is taken from '{source}'"):
        load_job_config(None, [old])
    value = old.partition("=")[2]
    job = load_job_config(None, [old, f"{source}={value}"])  # equal: accepted
    assert str(getattr(job.learner, key.split(".")[1])) == value


def test_a_learner_section_loaded_on_its_own_keeps_its_twins() -> None:
    # Without a job around it there is no sampling section to derive from.
    cfg = load_config(LearnerConfig, None, ["temperature=0.5", "topology.devices=['0']"])
    assert (cfg.temperature, cfg.topology.devices) == (0.5, ["0"])


def test_code_built_jobs_must_keep_the_twins_equal() -> None:
    job = JobConfig()
    job.coordinator.sampling.temperature = 0.5
    with pytest.raises(ValueError, match="learner.temperature must equal"):
        job.validate()


def test_devices_lists_and_comma_strings() -> None:
    listed = load_job_config(None, ["learner.topology.devices=['0', '1']"])
    string = load_job_config(None, ["learner.topology.devices=0,1"])
    assert listed.learner.topology == string.learner.topology
    assert listed.learner.topology.visible_devices == "0,1"
    empty = load_job_config(None, ["learner.devices=''"])
    assert empty.learner.topology.devices == []


def test_every_learner_field_is_bounded_or_free() -> None:
    sections = [LearnerConfig] + [
        cls
        for cls in vars(learner_config_module).values()
        if isinstance(cls, type) and dataclasses.is_dataclass(cls) and cls.__name__.endswith("Config")
        and cls.__module__ == learner_config_module.__name__
    ]  # fmt: skip
    import typing

    for cls in sections:
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            ok = bound_of(f) or f.metadata.get("free") or typed_bound(hints[f.name])
            assert ok or derived_from(f), f"{cls.__name__}.{f.name}: no bound, type or reason"
