from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import pytest

from hybridflow.config.loader import ConfigError, dump_yaml, load_config


@dataclass
class Inner:
    rate: float = 0.5
    mode: Literal["a", "b"] = "a"


@dataclass
class Outer:
    name: str = "x"
    count: int = 1
    tags: list[str] = field(default_factory=list)
    inner: Inner = field(default_factory=Inner)
    maybe: int | None = None

    def validate(self) -> None:
        if self.count < 0:
            raise ValueError("count must be >= 0")


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "c.yaml"
    path.write_text(text)
    return path


def test_loads_nested_values_and_overrides(tmp_path):
    path = write(tmp_path, "name: y\ninner:\n  rate: 2\n")
    cfg = load_config(Outer, path, ["inner.mode=b", "count=7", "tags=[p, q]", "maybe=3"])
    assert cfg == Outer(
        name="y", count=7, tags=["p", "q"], inner=Inner(rate=2.0, mode="b"), maybe=3
    )
    assert isinstance(cfg.inner.rate, float)


def test_unknown_key_names_key_and_file(tmp_path):
    path = write(tmp_path, "inner:\n  rat: 1\n")
    with pytest.raises(ConfigError, match=r"c\.yaml: unknown key 'inner\.rat'"):
        load_config(Outer, path)


def test_unknown_override_key_is_an_error():
    with pytest.raises(ConfigError, match="unknown key 'nope'"):
        load_config(Outer, None, ["nope=1"])


def test_type_errors_name_the_field(tmp_path):
    with pytest.raises(ConfigError, match="'count' must be an integer"):
        load_config(Outer, write(tmp_path, "count: many\n"))
    with pytest.raises(ConfigError, match=r"'inner.mode' must be one of \['a', 'b'\]"):
        load_config(Outer, None, ["inner.mode=c"])


def test_validate_runs_and_reports_the_file(tmp_path):
    with pytest.raises(ConfigError, match="c.yaml: count must be >= 0"):
        load_config(Outer, write(tmp_path, "count: -1\n"))


def test_missing_file_and_bad_override():
    with pytest.raises(ConfigError, match="not found"):
        load_config(Outer, "/nonexistent/x.yaml")
    with pytest.raises(ConfigError, match="key.sub=value"):
        load_config(Outer, None, ["novalue"])


def test_dump_round_trips(tmp_path):
    cfg = load_config(Outer, None, ["name=z", "inner.rate=0.25"])
    out = tmp_path / "resolved.yaml"
    dump_yaml(cfg, out)
    assert load_config(Outer, out) == cfg


def test_exponent_floats_without_a_dot_are_numbers(tmp_path):
    """YAML 1.1 reads 2e-4 as a string; a float field takes it (file and --set alike)."""
    cfg = load_config(Outer, write(tmp_path, "inner:\n  rate: 2e-4\n"))
    assert cfg.inner.rate == 2e-4
    assert load_config(Outer, None, ["inner.rate=1E3"]).inner.rate == 1000.0
    with pytest.raises(ConfigError, match="'inner.rate' must be a number, got 'fast'"):
        load_config(Outer, None, ["inner.rate=fast"])
    with pytest.raises(ConfigError, match="'inner.rate' must be a number, got 'inf'"):
        load_config(Outer, None, ["inner.rate=inf"])


def test_yaml11_booleans_are_the_words_a_literal_expects(tmp_path):
    """YAML 1.1 reads off / on as booleans; a Literal of those words takes them back."""

    @dataclass
    class Switch:
        mode: Literal["auto", "off"] = "auto"
        onoff: Literal["on", "off"] = "on"

    cfg = load_config(Switch, write(tmp_path, "mode: off\nonoff: off\n"))
    assert (cfg.mode, cfg.onoff) == ("off", "off")
    assert load_config(Switch, None, ["onoff=on"]).onoff == "on"
    with pytest.raises(ConfigError, match=r"'mode' must be one of \['auto', 'off'\], got True"):
        load_config(Switch, None, ["mode=on"])
