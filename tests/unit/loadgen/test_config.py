"""Loadgen config: address safety, exactly one load pattern, bounds, shipped YAMLs."""

from pathlib import Path

import pytest

from hybridflow.config.loader import ConfigError, load_config
from hybridflow.loadgen.config import (
    MAX_DURATION_S,
    LoadgenConfig,
    RewardLoadConfig,
    RolloutLoadConfig,
    check_address,
    is_loopback,
)

REPO = Path(__file__).resolve().parents[3]
SHIPPED = sorted((REPO / "benchmarks" / "loadgen").glob("*.yaml"))


@pytest.mark.parametrize(
    ("address", "expected"),
    [
        ("127.0.0.1:50051", ("127.0.0.1", 50051)),
        ("localhost:1", ("localhost", 1)),
        ("[::1]:443", ("::1", 443)),
        ("rollout-0.svc.cluster.local:9000", ("rollout-0.svc.cluster.local", 9000)),
        (" 10.0.0.7:8000 ", ("10.0.0.7", 8000)),
    ],
)
def test_accepts_one_explicit_address(address, expected):
    assert check_address(address) == expected


@pytest.mark.parametrize(
    ("address", "match"),
    [
        ("", "required"),
        ("   ", "required"),
        ("0.0.0.0:50051", "not a target"),
        ("[::]:50051", "not a target"),
        ("[0:0::0]:5", "unspecified"),
        (":50051", "empty host"),
        ("*:50051", "exactly one"),
        ("127.0.0.1", "missing ':PORT'"),
        ("127.0.0.1:0", "port"),
        ("127.0.0.1:65536", "port"),
        ("127.0.0.1:5000-5100", "port"),
        ("10.0.0.1:1,10.0.0.2:1", "exactly one"),
        ("10.0.0.0/24:80", "exactly one"),
        ("unix:/tmp/sock", "exactly one"),
    ],
)
def test_refuses_empty_wildcard_and_ranges(address, match):
    with pytest.raises(ValueError, match=match):
        check_address(address)


def test_loopback_detection():
    assert is_loopback("127.0.0.1:1") and is_loopback("localhost:1") and is_loopback("[::1]:1")
    assert not is_loopback("10.1.2.3:1") and not is_loopback("example.org:1")


def ok(**kw) -> LoadgenConfig:
    base = {"address": "127.0.0.1:1", "rate": 1.0, "duration_s": 1.0}
    base.update(kw)
    return LoadgenConfig(**base)


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"rate": 0.0}, "exactly one"),
        ({"concurrency": 2}, "exactly one"),
        ({"rate": 0.0, "sweep_rates": [1.0], "sweep_concurrency": [1]}, "exactly one"),
        ({"rate": -1.0}, "rate"),
        ({"rate": 0.0, "sweep_rates": [1.0, 0.0]}, "rate"),
        ({"rate": 0.0, "concurrency": 5000}, "concurrency"),
        ({"duration_s": 0.0}, "duration_s and/or num_requests"),
        ({"duration_s": MAX_DURATION_S + 1}, "duration_s"),
        ({"num_requests": -1}, "num_requests"),
        ({"warmup_s": 1.0}, "warmup_s"),
        ({"timeout_s": 0.0}, "timeout_s"),
        ({"timeout_s": 601.0}, "timeout_s"),
        ({"target": "learner"}, "target"),
        ({"plot": "curve.svg"}, "plot"),
        ({"address": "0.0.0.0:1"}, "address"),
        ({"rollout": RolloutLoadConfig(prompt_len_min=9, prompt_len_max=8)}, "prompt_len"),
        ({"rollout": RolloutLoadConfig(top_p=0.0)}, "rollout.top_p"),
        ({"rollout": RolloutLoadConfig(prompts_per_request=0)}, "prompts_per_request"),
        ({"reward": RewardLoadConfig(items_per_request=0)}, "reward.items_per_request"),
        ({"reward": RewardLoadConfig(correct_fraction=1.5)}, "reward.correct_fraction"),
    ],
)
def test_bad_config_names_the_field(kw, match):
    with pytest.raises(ValueError, match=match):
        ok(**kw).validate()


def test_points_and_plot_path():
    assert ok().points() == [("open", 1.0)]
    assert ok(rate=0.0, concurrency=3).points() == [("closed", 3.0)]
    sweep = ok(rate=0.0, sweep_rates=[1.0, 2.0], out="res/a.b/sweep.json")
    sweep.validate()
    assert sweep.points() == [("open", 1.0), ("open", 2.0)]
    assert sweep.plot_path() == "res/a.b/sweep.png"
    assert ok(out="x.json").plot_path() == ""  # single runs plot only when asked
    assert ok(plot="p.png").plot_path() == "p.png"


def test_some_benchmark_configs_are_shipped():
    assert {p.name for p in SHIPPED} >= {"sweep_rollout.yaml", "sweep_reward.yaml"}


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.name)
def test_shipped_benchmark_config_loads(path):
    cfg = load_config(LoadgenConfig, path, ["address=127.0.0.1:50051"])
    assert cfg.is_sweep and cfg.duration_s > cfg.warmup_s


def test_unknown_yaml_key_is_an_error(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("address: 127.0.0.1:1\nrate: 1\nduration_s: 1\nrollout:\n  batch: 4\n")
    with pytest.raises(ConfigError, match="rollout.batch"):
        load_config(LoadgenConfig, path)
