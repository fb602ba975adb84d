"""LearnerConfig: strict validation naming the field; imports without torch."""

import subprocess
import sys
from pathlib import Path

import pytest

from hybridflow.services.learner.config import LearnerConfig


def test_defaults_validate() -> None:
    config = LearnerConfig()
    config.validate()  # raises on a bad default
    assert config.algorithm == "grpo" and config.off_policy == "none"


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"lr": 0.0}, "learner.optimizer.lr"),
        ({"lr": float("nan")}, "learner.optimizer.lr"),
        ({"algorithm": "sac"}, "learner.algorithm"),
        ({"dpo_beta": 0.0}, "learner.dpo.beta"),
        ({"dpo_beta": float("inf")}, "learner.dpo.beta"),
        ({"rft_threshold": float("nan")}, "learner.rft.threshold"),
        ({"rft_threshold": float("-inf")}, "learner.rft.threshold"),
        ({"betas": (0.9,)}, "learner.optimizer.betas"),
        ({"micro_batch_size": 0}, "learner.update.micro_batch_size"),
        ({"ppo_epochs": 0}, "learner.update.epochs"),
        ({"clip_ratio_low": 1.0}, "learner.loss.clip_ratio_low"),
        ({"clip_ratio_c": 1.0}, "learner.loss.clip_ratio_c"),
        ({"loss_agg_mode": "sum"}, "learner.loss.agg_mode"),
        ({"kl_estimator": "k9"}, "learner.kl.estimator"),
        ({"kl_coef": 0.1}, "learner.kl.use_reference"),
        ({"kl_coef": 0.1, "use_reference": True, "kl_mode": "reward"}, "learner.kl.mode"),
        ({"gamma": 1.5}, "learner.advantage.gamma"),
        ({"value_clip": -1.0}, "learner.critic.value_clip"),
        ({"temperature": -1.0}, "learner.temperature"),
        ({"device": "tpu"}, "learner.topology.device"),
    ],
)
def test_bad_field_is_named(change: dict[str, object], field: str) -> None:
    config = LearnerConfig(**change)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=field.replace(".", r"\.")):
        config.validate()


def test_config_imports_without_torch() -> None:
    code = (
        "import sys, hybridflow.services.learner.config as c; c.LearnerConfig().validate(); "
        "bad = [m for m in ('torch', 'grpc', 'transformers') if m in sys.modules]; "
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"advantage_estimator": "rlo"}, "learner.advantage_estimator must be one of"),
        ({"advantage_estimator": "pkg.mod:"}, "learner.advantage_estimator must be one of"),
        ({"policy_loss": "ppo"}, "learner.policy_loss must be one of"),
        ({"overlong_buffer": -1}, "learner.overlong.buffer"),
        ({"overlong_buffer": 4}, "learner.max_new_tokens"),
        ({"overlong_buffer": 4, "max_new_tokens": 8, "overlong_penalty_factor": -1.0},
         "learner.overlong.penalty_factor"),
        ({"advantage_estimator": "dr_grpo", "kl_coef": 0.1, "use_reference": True,
          "kl_mode": "reward"}, "learner.kl.mode"),
    ],
)  # fmt: skip
def test_estimator_loss_and_overlong_keys(change: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message.replace(".", r"\.")):
        LearnerConfig(**change).validate()  # type: ignore[arg-type]


def test_presets_pick_the_estimator_and_names_or_paths_pass() -> None:
    assert LearnerConfig().resolved_advantage_estimator() == "grpo"
    assert LearnerConfig(algorithm="ppo").resolved_advantage_estimator() == "gae"
    assert LearnerConfig(algorithm="ppo", advantage_estimator="rloo").resolved_advantage_estimator() == "rloo"  # fmt: skip
    for fields in (
        {"advantage_estimator": "reinforce_plus_plus", "policy_loss": "gspo"},
        {"advantage_estimator": "my_pkg.algos:estimate", "policy_loss": "my_pkg.algos:loss"},
        {"policy_loss": "cispo", "overlong_buffer": 4, "max_new_tokens": 8},
        {"advantage_estimator": "rloo", "kl_coef": 0.1, "use_reference": True, "kl_mode": "reward"},
    ):
        LearnerConfig(**fields).validate()  # type: ignore[arg-type]


def test_job_config_checks_max_new_tokens_for_overlong_shaping() -> None:
    from hybridflow.job_config import JobConfig

    job = JobConfig()
    job.learner.overlong_buffer, job.learner.max_new_tokens = 2, 4
    job.coordinator.sampling.max_new_tokens = 8
    with pytest.raises(ValueError, match="learner.max_new_tokens must equal"):
        job.validate()
    job.learner.max_new_tokens = 8
    job.validate()


@pytest.mark.parametrize("algorithm", ["dpo", "rft"])
@pytest.mark.parametrize(
    "change",
    [
        {"advantage_estimator": "grpo"},
        {"policy_loss": "gspo"},
        {"kl_coef": 0.1, "use_reference": True},
        {"ppo_epochs": 2},
        {"num_mini_batches": 2},
        {"entropy_coef": 0.01},
        {"off_policy": "tis"},
        {"overlong_buffer": 2, "max_new_tokens": 4},
    ],
)
def test_preference_presets_refuse_policy_gradient_keys(
    algorithm: str, change: dict[str, object]
) -> None:
    key = next(iter(change))
    with pytest.raises(ValueError, match=rf"learner\.{key} does not apply to learner\.algorithm"):
        LearnerConfig(algorithm=algorithm, **change).validate()  # type: ignore[arg-type]


def test_preference_presets_validate_and_dpo_needs_the_reference() -> None:
    for algorithm in ("dpo", "rft"):
        config = LearnerConfig(algorithm=algorithm, dpo_beta=0.5, rft_threshold=-2.0)  # type: ignore[arg-type]
        config.validate()
        assert not config.is_policy_gradient
        with pytest.raises(ValueError, match="has no advantage estimator"):
            config.resolved_advantage_estimator()
    assert LearnerConfig(algorithm="dpo").needs_reference
    assert not LearnerConfig(algorithm="rft").needs_reference
    assert LearnerConfig(algorithm="rft", use_reference=True).needs_reference
    assert not LearnerConfig(algorithm="grpo").needs_reference


@pytest.mark.parametrize("algorithm", ["dpo", "rft"])
def test_launch_overrides_load_the_preference_presets(algorithm: str) -> None:
    """What ``deploy/launch.sh --set learner.algorithm=...`` loads and preflight checks."""
    from hybridflow.deploy.launch import DEFAULT_CONFIG
    from hybridflow.deploy.preflight import config_problems
    from hybridflow.job_config import load_job_config

    config = Path(__file__).resolve().parents[3] / DEFAULT_CONFIG
    overrides = [f"learner.algorithm={algorithm}", "learner.dpo.beta=0.2"]
    job = load_job_config(config, overrides)
    assert (job.learner.algorithm, job.learner.dpo_beta) == (algorithm, 0.2)
    assert config_problems(config, overrides) == []
    assert config_problems(config, [*overrides, "learner.advantage_estimator=rloo"]) != []


def test_online_dpo_takes_a_loss_type_and_refuses_an_unknown_one() -> None:
    from hybridflow.deploy.launch import DEFAULT_CONFIG
    from hybridflow.job_config import load_job_config

    config = Path(__file__).resolve().parents[3] / DEFAULT_CONFIG
    dpo = ["learner.algorithm=dpo"]
    assert load_job_config(config, [*dpo, "learner.dpo.loss_type=ipo"]).learner.dpo_loss_type == (
        "ipo"
    )
    with pytest.raises(ValueError, match="learner.dpo.loss_type"):
        load_job_config(config, [*dpo, "learner.dpo.loss_type=orpo"])


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"critic_nproc_per_node": -1}, "learner.topology.critic_nproc_per_node: must be >= 0"),
        ({"critic_nproc_per_node": 1}, "learner.topology.critic_nproc_per_node > 0 needs a critic"),
        ({"algorithm": "ppo", "advantage_estimator": "rloo", "critic_nproc_per_node": 1},
         "learner.topology.critic_nproc_per_node > 0 needs a critic"),
        ({"algorithm": "dpo", "critic_nproc_per_node": 1},
         "learner.topology.critic_nproc_per_node > 0 needs a critic"),
        ({"algorithm": "ppo", "critic_devices": "1"}, "learner.topology.critic_devices needs"),
        ({"algorithm": "ppo", "critic_nproc_per_node": 1, "critic_devices": "1"},
         "learner.topology.devices must list one device per rank"),
        ({"algorithm": "ppo", "critic_nproc_per_node": 2, "devices": "0",
          "critic_devices": "1"}, "learner.topology.critic_devices must list one device per rank"),
    ],
)  # fmt: skip
def test_critic_ranks_need_a_critic_and_one_device_each(
    change: dict[str, object], message: str
) -> None:
    with pytest.raises(ValueError, match=message.replace(".", r"\.")):
        LearnerConfig(**change).validate()  # type: ignore[arg-type]


def test_critic_ranks_add_to_the_learner_ranks_and_devices() -> None:
    colocated = LearnerConfig(algorithm="ppo", nproc_per_node=2, devices="0,1")
    assert (colocated.num_ranks, colocated.visible_devices) == (2, "0,1")
    split = LearnerConfig(
        algorithm="ppo",
        nproc_per_node=2,
        devices="0,1",
        critic_nproc_per_node=1,
        critic_devices="3",
    )
    split.validate()
    assert (split.num_ranks, split.visible_devices) == (3, "0,1,3")
    # A user estimator may need a critic: the learner checks it when it loads the function.
    LearnerConfig(advantage_estimator="my_pkg.algos:gae_like", critic_nproc_per_node=1).validate()


def test_job_config_refuses_critic_ranks_for_an_offline_preference_job() -> None:
    from hybridflow.job_config import JobConfig
    from hybridflow.preference.config import PreferenceConfig
    from hybridflow.services.learner.config import LearnerConfig as Learner

    job = JobConfig(
        model="builtin:tiny",
        learner=Learner(algorithm="ppo", critic_nproc_per_node=1),
        preference=PreferenceConfig(data="builtin:arith_dpo"),
    )
    with pytest.raises(ValueError, match=r"learner\.critic_nproc_per_node must be 0"):
        job.validate()
