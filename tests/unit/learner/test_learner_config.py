"""LearnerConfig: strict validation naming the field; imports without torch."""

import subprocess
import sys
from pathlib import Path

import pytest

from hybridflow.services.learner.config import LearnerConfig
from tests.helpers import learner_config


def test_defaults_validate() -> None:
    config = LearnerConfig()
    config.validate()  # raises on a bad default
    assert config.algorithm == "grpo" and config.loss.off_policy == "none"


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"optimizer": {"lr": 0.0}}, "learner.optimizer.lr"),
        ({"optimizer": {"lr": float("nan")}}, "learner.optimizer.lr"),
        ({"algorithm": "sac"}, "learner.algorithm"),
        ({"dpo": {"beta": 0.0}}, "learner.dpo.beta"),
        ({"dpo": {"beta": float("inf")}}, "learner.dpo.beta"),
        ({"rft": {"threshold": float("nan")}}, "learner.rft.threshold"),
        ({"rft": {"threshold": float("-inf")}}, "learner.rft.threshold"),
        ({"optimizer": {"betas": (0.9,)}}, "learner.optimizer.betas"),
        ({"update": {"micro_batch_size": 0}}, "learner.update.micro_batch_size"),
        ({"update": {"epochs": 0}}, "learner.update.epochs"),
        ({"loss": {"clip_ratio_low": 1.0}}, "learner.loss.clip_ratio_low"),
        ({"loss": {"clip_ratio_c": 1.0}}, "learner.loss.clip_ratio_c"),
        ({"loss": {"agg_mode": "sum"}}, "learner.loss.agg_mode"),
        ({"kl": {"estimator": "k9"}}, "learner.kl.estimator"),
        ({"kl": {"coef": 0.1}}, "learner.kl.use_reference"),
        ({"kl": {"coef": 0.1, "use_reference": True, "mode": "reward"}}, "learner.kl.mode"),
        ({"advantage": {"gamma": 1.5}}, "learner.advantage.gamma"),
        ({"critic": {"value_clip": -1.0}}, "learner.critic.value_clip"),
        ({"temperature": -1.0}, "learner.temperature"),
        ({"topology": {"device": "tpu"}}, "learner.topology.device"),
    ],
)
def test_bad_field_is_named(change: dict[str, object], field: str) -> None:
    config = learner_config(change)
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
        ({"overlong": {"buffer": -1}}, "learner.overlong.buffer"),
        ({"overlong": {"buffer": 4}}, "learner.max_new_tokens"),
        ({"overlong": {"buffer": 4, "penalty_factor": -1.0}, "max_new_tokens": 8},
         "learner.overlong.penalty_factor"),
        ({"advantage_estimator": "dr_grpo", "kl": {"coef": 0.1, "use_reference": True, "mode": "reward"}}, "learner.kl.mode"),
    ],
)  # fmt: skip
def test_estimator_loss_and_overlong_keys(change: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message.replace(".", r"\.")):
        learner_config(change).validate()


def test_presets_pick_the_estimator_and_names_or_paths_pass() -> None:
    assert LearnerConfig().resolved_advantage_estimator() == "grpo"
    assert LearnerConfig(algorithm="ppo").resolved_advantage_estimator() == "gae"
    assert LearnerConfig(algorithm="ppo", advantage_estimator="rloo").resolved_advantage_estimator() == "rloo"  # fmt: skip
    for fields in (
        {"advantage_estimator": "reinforce_plus_plus", "policy_loss": "gspo"},
        {"advantage_estimator": "my_pkg.algos:estimate", "policy_loss": "my_pkg.algos:loss"},
        {"policy_loss": "cispo", "overlong": {"buffer": 4}, "max_new_tokens": 8},
        {
            "advantage_estimator": "rloo",
            "kl": {"coef": 0.1, "use_reference": True, "mode": "reward"},
        },
    ):
        learner_config(fields).validate()


def test_job_config_checks_max_new_tokens_for_overlong_shaping() -> None:
    from hybridflow.job_config import JobConfig

    job = JobConfig()
    job.learner.overlong.buffer, job.learner.max_new_tokens = 2, 4
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
        {"kl": {"coef": 0.1, "use_reference": True}},
        {"update": {"epochs": 2}},
        {"update": {"num_mini_batches": 2}},
        {"loss": {"entropy_coef": 0.01}},
        {"loss": {"off_policy": "tis"}},
        {"overlong": {"buffer": 2}, "max_new_tokens": 4},
    ],
)
def test_preference_presets_refuse_policy_gradient_keys(
    algorithm: str, change: dict[str, object]
) -> None:
    key, value = next(iter(change.items()))
    if isinstance(value, dict):  # a section: its first key
        key = f"{key}.{next(iter(value))}"
    with pytest.raises(ValueError, match=rf"learner\.{key} does not apply to learner\.algorithm"):
        learner_config(change, algorithm=algorithm).validate()


def test_preference_presets_validate_and_dpo_needs_the_reference() -> None:
    for algorithm in ("dpo", "rft"):
        config = learner_config(algorithm=algorithm, dpo={"beta": 0.5}, rft={"threshold": -2.0})
        config.validate()
        assert not config.is_policy_gradient
        with pytest.raises(ValueError, match="has no advantage estimator"):
            config.resolved_advantage_estimator()
    assert LearnerConfig(algorithm="dpo").needs_reference
    assert not LearnerConfig(algorithm="rft").needs_reference
    assert learner_config(algorithm="rft", kl={"use_reference": True}).needs_reference
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
    assert (job.learner.algorithm, job.learner.dpo.beta) == (algorithm, 0.2)
    assert config_problems(config, overrides) == []
    assert config_problems(config, [*overrides, "learner.advantage_estimator=rloo"]) != []


def test_online_dpo_takes_a_loss_type_and_refuses_an_unknown_one() -> None:
    from hybridflow.deploy.launch import DEFAULT_CONFIG
    from hybridflow.job_config import load_job_config

    config = Path(__file__).resolve().parents[3] / DEFAULT_CONFIG
    dpo = ["learner.algorithm=dpo"]
    assert load_job_config(config, [*dpo, "learner.dpo.loss_type=ipo"]).learner.dpo.loss_type == (
        "ipo"
    )
    with pytest.raises(ValueError, match="learner.dpo.loss_type"):
        load_job_config(config, [*dpo, "learner.dpo.loss_type=orpo"])


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"topology": {"critic_nproc_per_node": -1}}, "learner.topology.critic_nproc_per_node: must be >= 0"),
        ({"topology": {"critic_nproc_per_node": 1}}, "learner.topology.critic_nproc_per_node > 0 needs a critic"),
        ({"algorithm": "ppo", "advantage_estimator": "rloo", "topology": {"critic_nproc_per_node": 1}},
         "learner.topology.critic_nproc_per_node > 0 needs a critic"),
        ({"algorithm": "dpo", "topology": {"critic_nproc_per_node": 1}},
         "learner.topology.critic_nproc_per_node > 0 needs a critic"),
        ({"algorithm": "ppo", "topology": {"critic_devices": ["1"]}}, "learner.topology.critic_devices needs"),
        ({"algorithm": "ppo", "topology": {"critic_nproc_per_node": 1, "critic_devices": ["1"]}},
         "learner.topology.devices must list one device per rank"),
        ({"algorithm": "ppo", "topology": {"critic_nproc_per_node": 2, "devices": ["0"], "critic_devices": ["1"]}}, "learner.topology.critic_devices must list one device per rank"),
    ],
)  # fmt: skip
def test_critic_ranks_need_a_critic_and_one_device_each(
    change: dict[str, object], message: str
) -> None:
    with pytest.raises(ValueError, match=message.replace(".", r"\.")):
        learner_config(change).validate()


def test_critic_ranks_add_to_the_learner_ranks_and_devices() -> None:
    colocated = learner_config(
        algorithm="ppo", topology={"nproc_per_node": 2, "devices": ["0", "1"]}
    )
    assert (colocated.topology.num_ranks, colocated.topology.visible_devices) == (2, "0,1")
    split = learner_config(
        algorithm="ppo",
        topology={
            "nproc_per_node": 2,
            "devices": ["0", "1"],
            "critic_nproc_per_node": 1,
            "critic_devices": ["3"],
        },
    )
    split.validate()
    assert (split.topology.num_ranks, split.topology.visible_devices) == (3, "0,1,3")
    # A user estimator may need a critic: the learner checks it when it loads the function.
    learner_config(
        advantage_estimator="my_pkg.algos:gae_like", topology={"critic_nproc_per_node": 1}
    ).validate()


def test_job_config_refuses_critic_ranks_for_an_offline_preference_job() -> None:
    from hybridflow.job_config import JobConfig
    from hybridflow.preference.config import PreferenceConfig

    job = JobConfig(
        model="builtin:tiny",
        learner=learner_config(algorithm="ppo", topology={"critic_nproc_per_node": 1}),
        preference=PreferenceConfig(data="builtin:arith_dpo"),
    )
    with pytest.raises(ValueError, match=r"learner\.topology\.critic_nproc_per_node must be 0"):
        job.validate()
