"""Bounds declared on config fields (``knob``) and renamed keys that still load."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import pytest

from hybridflow.config import loader
from hybridflow.config.fields import Bound, field_problems, knob
from hybridflow.config.loader import ConfigError, from_dict, load_config
from hybridflow.config.ranges import raise_problems


@dataclass
class _Optim:
    """A nested section."""

    lr: float = knob(1e-3, gt=0)
    """Learning rate."""
    betas: tuple[float, float] = knob((0.9, 0.99), ge=0, lt=1)
    """Betas."""

    def validate(self) -> None:
        raise_problems(field_problems(self, "demo.optim"))


@dataclass
class _Demo:
    """A section with one renamed key."""

    RENAMED_KEYS = {"lr": "optim.lr", "old_steps": "steps"}

    steps: int = knob(1, ge=1)
    """Steps."""
    clip: float | None = knob(3.0, gt=1)
    """Optional: None passes."""
    names: list[str] = knob(default_factory=list, choices=("a", "b"))
    """Names."""
    path: str = knob("", free="a path, checked when opened")
    """A path."""
    optim: _Optim = field(default_factory=_Optim)
    """The optimizer."""

    def validate(self) -> None:
        raise_problems(field_problems(self, "demo"))


def test_bounds_describe_themselves() -> None:
    assert Bound(ge=1).describe() == ">= 1"
    assert Bound(gt=0, le=1).describe() == "in (0, 1]"
    assert Bound(ge=0, lt=0.5).describe() == "in [0, 0.5)"
    assert Bound(choices=("x", "y")).describe() == "one of x, y"
    assert Bound(finite=True).describe() == "a finite number"


def test_every_bad_field_of_a_section_is_named_at_once() -> None:
    with pytest.raises(ConfigError) as err:
        from_dict(_Demo, {"steps": 0, "clip": 1.0, "names": ["a", "c"]})
    lines = str(err.value).split(": ", 1)[1].splitlines()
    assert lines == [
        "demo.steps: must be >= 1, got 0",
        "demo.clip: must be > 1, got 1.0",
        "demo.names: unknown 'c'; known: a, b",
    ]


def test_none_nan_and_sequences() -> None:
    assert from_dict(_Demo, {"clip": None}).clip is None
    with pytest.raises(ConfigError, match=r"demo.optim.lr: must be > 0, got nan"):
        from_dict(_Demo, {"optim": {"lr": float("nan")}})
    with pytest.raises(ConfigError, match=r"demo.optim.betas\[1\]: must be in \[0, 1\), got 1.0"):
        from_dict(_Demo, {"optim": {"betas": [0.9, 1.0]}})


def test_finite_takes_any_finite_number() -> None:
    finite = Bound(finite=True)
    assert finite.problem("w", -1e9) is None and finite.problem("w", 0) is None
    assert finite.problem("w", float("inf")) == "w: must be a finite number, got inf"


def test_skipped_fields_and_a_top_level_config() -> None:
    demo = _Demo(steps=0, clip=0.5)
    assert [p for p in field_problems(demo, "", skip=("clip",)) if p] == [
        "steps: must be >= 1, got 0"
    ]


def test_knob_needs_a_bound_or_a_reason() -> None:
    with pytest.raises(TypeError):
        knob(1)
    with pytest.raises(TypeError):
        knob(1, ge=0, free="both")


def test_a_renamed_key_loads_in_its_new_place_with_one_notice(
    caplog: pytest.LogCaptureFixture,
) -> None:
    raw = {"lr": 0.5, "old_steps": 3}
    with caplog.at_level(logging.WARNING, logger="hybridflow.config.loader"):
        cfg = from_dict(_Demo, raw, prefix="demo.")
    assert (cfg.optim.lr, cfg.steps) == (0.5, 3)
    assert raw == {"lr": 0.5, "old_steps": 3}  # the caller's mapping is left alone
    notices = [r.getMessage() for r in caplog.records]
    assert "config: 'demo.lr' is now 'demo.optim.lr' (the old key still works, for now)" in notices
    assert any("'demo.old_steps' is now 'demo.steps'" in n for n in notices)
    with pytest.raises(ConfigError, match=r"demo.optim.lr: must be > 0"):
        from_dict(_Demo, {"lr": -1.0})


def test_an_old_key_given_as_an_override_overrides_the_new_one_in_the_file(
    tmp_path, caplog: pytest.LogCaptureFixture, monkeypatch
) -> None:
    monkeypatch.setattr(loader, "_noticed", set())  # each notice once per process
    path = tmp_path / "demo.yaml"
    path.write_text("optim:\n  lr: 0.1\n")
    with caplog.at_level(logging.WARNING, logger="hybridflow.config.loader"):
        cfg = load_config(_Demo, path, ["lr=0.5", "old_steps=7"])
    assert (cfg.optim.lr, cfg.steps) == (0.5, 7)
    notices = [r.getMessage() for r in caplog.records]
    assert "config: 'lr' is now 'optim.lr' (the old key still works, for now)" in notices
    # A key nobody renamed, and one past the end of the sections, go through as written.
    assert load_config(_Demo, path, ["optim.lr=0.25"]).optim.lr == 0.25
    with pytest.raises(ConfigError, match="unknown key 'optim.nope'"):
        load_config(_Demo, path, ["optim.nope=1"])


def test_old_and_new_key_together_are_refused() -> None:
    with pytest.raises(ConfigError, match="both 'demo.lr' and its new name 'demo.optim.lr'"):
        from_dict(_Demo, {"lr": 0.5, "optim": {"lr": 0.1}}, prefix="demo.")
