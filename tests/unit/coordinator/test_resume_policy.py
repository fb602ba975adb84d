"""The resume key table (``resume_policy``): every config key is classified, and the
comparison of a checkpoint's config with a resuming job's names what it refuses."""

from dataclasses import asdict
from pathlib import Path

import pytest

from hybridflow.coordinator.resume_policy import (
    RULES,
    UNCLASSIFIED,
    Policy,
    compare,
    flatten,
    rebased_num_started,
    rule_for,
)
from hybridflow.job_config import JobConfig

SECTIONS_BY_KEY = ("coordinator", "learner")
"""Sections whose keys are classified one by one (sub-configs like ``server`` by prefix)."""


def _leaf_keys() -> list[str]:
    return sorted(flatten(asdict(JobConfig())))


def test_every_key_is_classified() -> None:
    unclassified = [k for k in _leaf_keys() if rule_for(k) is UNCLASSIFIED]
    assert not unclassified, f"classify these in resume_policy.RULES: {unclassified}"


def test_coordinator_and_learner_keys_have_their_own_rule() -> None:
    """A section-wide ``*`` rule would classify a new schedule or learner key unexamined:
    only the transport sub-configs (server, channel) may share one."""
    for key in _leaf_keys():
        section, _, rest = key.partition(".")
        if section not in SECTIONS_BY_KEY:
            continue
        if key in RULES:
            continue
        head = rest.split(".")[0]
        assert head in ("server", "channel") and f"{section}.{head}.*" in RULES, key


def test_no_rule_names_a_key_that_does_not_exist() -> None:
    keys = set(_leaf_keys())
    for name in RULES:
        if name.endswith(".*"):
            assert any(k.startswith(name[:-1]) for k in keys), name
        else:
            assert name in keys, name


@pytest.mark.parametrize(
    ("key", "policy"),
    [
        ("model", Policy.REFUSE),
        ("coordinator.seed", Policy.REFUSE),
        ("coordinator.data", Policy.REFUSE),
        ("coordinator.data_size", Policy.REFUSE),
        ("coordinator.prompts_per_step", Policy.REBASE),
        ("coordinator.group_size", Policy.APPLY),
        ("coordinator.num_steps", Policy.APPLY),
        ("learner.optimizer.lr", Policy.APPLY),
        ("learner.algorithm", Policy.REFUSE),
        ("learner.loss.clip_ratio_high", Policy.APPLY),
        ("learner.kl.coef", Policy.APPLY),
        ("coordinator.loggers", Policy.APPLY),
        ("coordinator.server.port", Policy.APPLY),
        ("rollout.replicas", Policy.APPLY),
        ("preference.data", Policy.REFUSE),
    ],
)
def test_key_policy(key: str, policy: Policy) -> None:
    assert rule_for(key).policy is policy


def test_refusal_is_one_line_naming_key_old_and_new() -> None:
    old = asdict(JobConfig())
    new = asdict(JobConfig())
    new["coordinator"]["seed"] = 7
    new["learner"]["optimizer"]["lr"] = 1e-3
    decision = compare(old, new)
    line = decision.refusal()
    assert line is not None and "\n" not in line
    assert "coordinator.seed 0 -> 7" in line and "learner.optimizer.lr" not in line
    assert [c.key for c in decision.accepted] == ["learner.optimizer.lr"]


def test_equal_configs_and_json_round_trip_are_no_change() -> None:
    old = asdict(JobConfig())  # betas is a tuple here, a list once saved as JSON
    saved = flatten(old)
    assert compare(old, asdict(JobConfig())).changes == ()
    assert saved["learner.optimizer.betas"] == [0.9, 0.999]
    assert compare({"learner": {"optimizer": {"betas": [0.9, 0.999]}}}, old).changes == ()


def test_a_checkpoint_with_the_flat_learner_keys_compares_on_the_new_ones() -> None:
    old = {"learner": {"lr": 1e-5, "dpo_loss_type": "sigmoid"}}
    new = asdict(JobConfig())
    new["learner"]["dpo"]["loss_type"] = "ipo"
    decision = compare(old, new)
    assert [c.describe() for c in decision.refused] == ["learner.dpo.loss_type 'sigmoid' -> 'ipo'"]
    assert decision.accepted == []  # the same lr under its new name


def test_a_key_only_one_side_has_is_not_a_change() -> None:
    assert compare({"coordinator": {"new_key": 1}}, {"coordinator": {}}).changes == ()


def test_a_checkpoint_from_before_a_rename_resumes() -> None:
    """reward.num_threads is now reward.score_workers: each name is on one side only."""
    old = asdict(JobConfig())
    old["reward"]["num_threads"] = old["reward"].pop("score_workers")
    assert compare(old, asdict(JobConfig())).changes == ()
    assert rule_for("reward.score_workers").policy is Policy.APPLY


def test_admission_count_rebased_to_the_new_batch() -> None:
    # step 22 of 16-prompt batches, 352 started: the hang with 8 per step
    assert rebased_num_started(352, 22, 16, 8) == 176
    assert rebased_num_started(350, 22, 16, 8) == 174  # dynamic sampling's difference kept
    assert rebased_num_started(64, 4, 16, 32) == 128
    assert rebased_num_started(0, 0, 16, 8) == 0


def test_docs_table_is_current() -> None:
    doc = (Path(__file__).resolve().parents[3] / "docs" / "resume.md").read_text()
    rows = [line for line in doc.splitlines() if line.startswith("| `")]
    want = [f"| `{k}` | {r.policy.value} | {r.why} |" for k, r in RULES.items()]
    assert rows == want, "regenerate the table in docs/resume.md from resume_policy.RULES"
