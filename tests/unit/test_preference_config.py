"""The preference: section: defaults validate, bad fields are named, imports without torch."""

from __future__ import annotations

import subprocess
import sys

import pytest

from hybridflow.job_config import load_job_config
from hybridflow.preference.config import PreferenceConfig


def test_defaults_validate_and_make_no_job() -> None:
    cfg = PreferenceConfig()
    cfg.validate()
    assert cfg.data == "" and cfg.needs_reference
    assert not PreferenceConfig(loss="sft").needs_reference
    assert not PreferenceConfig(loss="orpo").needs_reference
    assert PreferenceConfig(loss="orpo").record_kind == "dpo"


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("loss", "simpo"),
        ("beta", 0.0),
        ("beta", float("nan")),
        ("label_smoothing", 0.5),
        ("dpo_loss_type", "orpo"),
        ("desirable_weight", -1.0),
        ("orpo_lambda", -0.1),
        ("orpo_lambda", float("inf")),
        ("steps", -1),
        ("batch_size", 0),
        ("eval_every", -1),
        ("num_rows", 0),
    ],
)
def test_bad_field_is_named(field: str, value: object) -> None:
    with pytest.raises(ValueError, match=f"preference.{field}"):
        PreferenceConfig(**{field: value}).validate()  # type: ignore[arg-type]


def test_job_config_has_a_preference_section() -> None:
    job = load_job_config(None, ["preference.loss=kto", "preference.data=builtin:arith_kto"])
    assert job.preference.loss == "kto" and job.preference.data == "builtin:arith_kto"


def test_config_and_package_import_without_torch() -> None:
    code = (
        "import sys, hybridflow, hybridflow.preference, hybridflow.preference.config; "
        "assert 'torch' not in sys.modules, 'torch imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_label_smoothing_is_refused_outside_the_sigmoid_loss() -> None:
    with pytest.raises(ValueError, match="label_smoothing applies to dpo_loss_type sigmoid only"):
        PreferenceConfig(label_smoothing=0.1, dpo_loss_type="hinge").validate()
    PreferenceConfig(label_smoothing=0.1).validate()
