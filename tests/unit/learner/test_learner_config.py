"""LearnerConfig: strict validation naming the field; imports without torch."""

import subprocess
import sys

import pytest

from hybridflow.services.learner.config import LearnerConfig


def test_defaults_validate() -> None:
    config = LearnerConfig()
    config.validate()  # raises on a bad default
    assert config.algorithm == "grpo" and config.off_policy == "none"


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"lr": 0.0}, "learner.lr"),
        ({"lr": float("nan")}, "learner.lr"),
        ({"algorithm": "dpo"}, "learner.algorithm"),
        ({"betas": (0.9,)}, "learner.betas"),
        ({"micro_batch_size": 0}, "learner.micro_batch_size"),
        ({"ppo_epochs": 0}, "learner.ppo_epochs"),
        ({"clip_ratio_low": 1.0}, "learner.clip_ratio_low"),
        ({"clip_ratio_c": 1.0}, "learner.clip_ratio_c"),
        ({"loss_agg_mode": "sum"}, "learner.loss_agg_mode"),
        ({"kl_estimator": "k9"}, "learner.kl_estimator"),
        ({"kl_coef": 0.1}, "learner.use_reference"),
        ({"kl_coef": 0.1, "use_reference": True, "kl_mode": "reward"}, "learner.kl_mode"),
        ({"gamma": 1.5}, "learner.gamma"),
        ({"value_clip": -1.0}, "learner.value_clip"),
        ({"temperature": -1.0}, "learner.temperature"),
        ({"device": "tpu"}, "learner.device"),
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
