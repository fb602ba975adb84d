"""Every benchmark suite's runner end to end on a tiny config, into tmp_path.

Each runner runs as a user runs it (``python benchmarks/<suite>/run_benchmark.py --config
... --results ...``), on a few steps and at most two variants, then the files it writes and
the fields of its summary.json are checked. The pure figure arithmetic the suites add
(scaling efficiency, convergence, pacing) is checked against hand-computed values; the
side-by-side verdict of `make bench-compare` is tests/unit/test_bench_compare.py.
The default suite runs the throughput and integration runners (``make bench``'s default and the
widest); the scalability, algorithm and pacing runners are ``slow``.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from benchmarks.algorithm.convergence import (
    check_same_budget,
    first_reach,
    learning_curve,
    trailing_mean,
)
from benchmarks.common.config import BenchmarkConfig, Variant
from benchmarks.pacing.run_pacing import mean_staleness, split_name
from benchmarks.pacing.run_pacing import ratios as pacing_ratios
from benchmarks.scalability.scaling import scaling_ratios

REPO = Path(__file__).resolve().parents[2]

TINY_JOB = [
    "coordinator.num_steps=3",
    "coordinator.prompts_per_step=4",
    "coordinator.group_size=4",
    "coordinator.save_checkpoint=false",
    "coordinator.progress=false",
]


def run_suite(tmp_path: Path, suite: str, config: dict[str, Any], *extra: str) -> Path:
    """Writes the tiny config, runs the suite's runner, returns its results/<stamp>/ dir."""
    cfg_path = tmp_path / f"{suite}.yaml"
    cfg_path.write_text(yaml.safe_dump(config))
    results = tmp_path / "results"
    proc = subprocess.run(
        [
            sys.executable,
            str(REPO / "benchmarks" / suite / "run_benchmark.py"),
            "--config",
            str(cfg_path),
            "--results",
            str(results),
            *extra,
        ],  # fmt: skip
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=170,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    (out,) = [p for p in results.iterdir() if p.is_dir()]
    return out


def check_common(
    out: Path, suite: str, variants: list[str], profile: bool, num_steps: int = 3
) -> dict[str, Any]:
    summary = json.loads((out / "summary.json").read_text())
    assert summary["suite"] == suite
    assert list(summary["variants"]) == variants
    for name in variants:
        fig = summary["variants"][name]
        assert fig["steps_timed"] >= 1
        assert fig["e2e_samples_per_s"] > 0 and fig["generation_tokens_per_s"] > 0
        assert set(fig["peak_rss_bytes"]) >= {"reward", "learner", "rollout0"}
        assert (out / name / "metrics.jsonl").read_text().count("\n") == num_steps
    assert summary["hardware"]["cpus"] >= 1 and summary["versions"]["torch"]
    log = (out / "detailed.log").read_text()
    assert all(f"[{name}] generate" in log for name in variants)
    assert (out / "profile.svg").exists() == profile
    for png in ("reward_throughput.png", "timeline.png"):
        assert (out / png).stat().st_size > 1000
    return summary


@pytest.mark.parametrize("profile", [False, pytest.param(True, marks=pytest.mark.slow)])
def test_throughput_suite_tiny(tmp_path: Path, profile: bool) -> None:
    """The suite's runner end to end; its py-spy run (a third launch) is slow, the timed
    launches and the figures are the default suite's."""
    config = {
        # 5 steps: nothing is generated beyond the run's last batch, so with k = 1 a 3-step
        # run has generated everything before its timed steps begin.
        "suite": "throughput", "overrides": [*TINY_JOB, "coordinator.num_steps=5"],
        "warmup_steps": 1, "profile": profile,
        "profile_steps": 2,
        "variants": [
            {"name": "sync", "overrides": ["coordinator.max_staleness=0"]},
            {"name": "async", "overrides": ["coordinator.max_staleness=1",
                                            "learner.loss.off_policy=tis"]},
        ],
    }  # fmt: skip
    out = run_suite(tmp_path, "throughput", config)
    summary = check_common(out, "throughput", ["sync", "async"], profile=profile, num_steps=5)
    ratios = summary["ratios"]
    assert ratios["async_over_sync_samples_per_s"] > 0
    assert ratios["async_share_of_ideal"] == pytest.approx(
        ratios["async_over_sync_samples_per_s"] / ratios["ideal_async_over_sync"]
    )


@pytest.mark.slow  # two launches (timed and profiled) with 2 learner ranks, ~80 s on 2 cores
def test_throughput_suite_runs_the_seed_config(tmp_path: Path) -> None:
    """benchmarks/throughput/seed_config.yaml (the seed guide's §3.2 file) runs as shipped,
    scaled to this machine; 5 steps instead of the scaled 20 (--max-steps)."""
    results = tmp_path / "results"
    proc = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "throughput" / "run_benchmark.py"),
         "--config", str(REPO / "benchmarks" / "throughput" / "seed_config.yaml"),
         "--results", str(results), "--max-steps", "5"],  # fmt: skip
        cwd=REPO, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    assert "Traceback" not in proc.stderr
    notices = [line for line in proc.stderr.splitlines() if line.startswith("seed config: ")]
    assert len(notices) == 7 and "workload.num_episodes=100: capped at 5 steps" in notices[5]
    (out,) = [p for p in results.iterdir() if p.is_dir()]
    summary = check_common(out, "throughput", ["async"], profile=True, num_steps=5)
    assert summary["seed_config"]["notices"] == notices
    job = yaml.safe_load((out / "async" / "config.yaml").read_text())
    assert job["model"] == "builtin:tiny" and job["learner"]["algorithm"] == "ppo"
    assert job["coordinator"]["data"].endswith("benchmarks/data/sharegpt_sample.json")
    assert job["coordinator"]["sampling"]["max_new_tokens"] == 64
    trained = (out / "async" / "trained.jsonl").read_text()
    assert trained.count("\n") == 5 * job["coordinator"]["prompts_per_step"]


@pytest.mark.slow  # two launches; the scaling figures are covered below without one
def test_scalability_suite_tiny(tmp_path: Path) -> None:
    config = {
        "suite": "scalability", "warmup_steps": 1, "profile": False,
        # 5 steps: admission starts nothing beyond the run's last batch, so with k = 1 a
        # 3-step run generates everything before its timed steps begin.
        "overrides": [*TINY_JOB, "coordinator.max_staleness=1", "learner.loss.off_policy=tis",
                      "coordinator.prompts_per_request=2", "coordinator.num_steps=5"],
        "variants": [
            {"name": "rollout1", "overrides": ["rollout.replicas=1"]},
            {"name": "rollout2", "overrides": ["rollout.replicas=2"]},
        ],
    }  # fmt: skip
    out = run_suite(
        tmp_path, "scalability", config, "--sim-replicas", "2,8", "--sim-prompts", "16",
        "--sim-steps", "3", "--plan-layers", "2", "--plan-num-src", "4", "--plan-tp", "2",
        "--plan-replicas", "2",
    )  # fmt: skip
    summary = check_common(out, "scalability", ["rollout1", "rollout2"], profile=False, num_steps=5)
    assert summary["variant_sizes"] == {
        "rollout1": {"rollout_replicas": 1, "learner_ranks": 1},
        "rollout2": {"rollout_replicas": 2, "learner_ranks": 1},
    }
    rollout = summary["ratios"]["rollout_scaling"]
    assert [p["size"] for p in rollout["points"]] == [1, 2]
    two = rollout["points"][1]
    assert two["generation_tokens_per_s_efficiency"] == pytest.approx(
        two["generation_tokens_per_s_speedup"] / 2
    )
    assert summary["ratios"]["verdict"][0].startswith("rollout replicas")
    sim = summary["simulated"]
    assert [r["replicas"] for r in sim["dispatch_overhead"]] == [2, 8]
    for row in sim["dispatch_overhead"]:
        assert row["steps_timed"] == 2 and row["samples_timed"] == 2 * 16 * 8
        assert row["us_per_sample"] > 0
    assert sim["planner"]["num_transfers"] > 0 and sim["planner"]["layers"] == 2
    assert (out / "scaling.png").stat().st_size > 1000


@pytest.mark.slow  # two launches; the convergence figures are covered below without one
def test_algorithm_suite_tiny(tmp_path: Path) -> None:
    config = {
        "suite": "algorithm", "overrides": TINY_JOB, "warmup_steps": 1, "profile": False,
        "variants": [
            {"name": "grpo", "overrides": ["learner.algorithm=grpo"]},
            {"name": "ppo", "overrides": ["learner.algorithm=ppo", "learner.critic.lr=1.0e-3"]},
        ],
    }  # fmt: skip
    out = run_suite(tmp_path, "algorithm", config, "--target", "0.0")
    summary = check_common(out, "algorithm", ["grpo", "ppo"], profile=False)
    conv = summary["convergence"]
    assert conv["target_reward"] == 0.0
    for name in ("grpo", "ppo"):
        row = conv["variants"][name]
        assert [p["samples"] for p in row["curve"]] == [16.0, 32.0, 48.0]
        # Any reward reaches 0.0 at the first step: 16 samples.
        assert row["samples_to_target"] == 16.0 and row["step_to_target"] == 1
        assert 0.0 <= row["final_reward"] <= 1.0 and row["steps_per_s"] > 0
        assert f"| {name} |" in summary["table_markdown"]
    assert (out / "algorithm_reward.png").stat().st_size > 1000


def test_integration_suite_tiny(tmp_path: Path) -> None:
    config = {
        "suite": "integration", "profile": True,
        "rollout": {"prompts": 2, "n": 2, "max_new_tokens": 8, "repeats": 2, "warmup": 1},
        "transfer": {"num_samples": 16, "prompt_tokens": 16, "response_tokens": 32,
                     "repeats": 2, "warmup": 1},
        "weight_sync": {"repeats": 2, "warmup": 1},
        "reward": {"num_items": 64, "batch_size": 32, "repeats": 2, "warmup": 1},
    }  # fmt: skip
    out = run_suite(tmp_path, "integration", config)
    summary = json.loads((out / "summary.json").read_text())
    bench = summary["benchmarks"]
    assert list(bench) == ["rollout", "transfer", "weight_sync", "reward"]
    assert bench["rollout"]["batch_rows"] == 4
    assert bench["rollout"]["hf_engine"]["tokens_per_s"] > 0
    assert bench["rollout"]["transformers_generate"]["tokens_per_s"] > 0
    assert bench["transfer"]["raw_tcp"]["mb_per_s"] > 0
    assert bench["transfer"]["grpc_train_step"]["repeats"] == 2
    assert bench["weight_sync"]["verified"] is True
    assert bench["weight_sync"]["planner"]["raw_broadcast"]["ok"] is True
    assert bench["reward"]["num_items"] == 64 and bench["reward"]["correct_fraction"] == 0.5
    assert set(summary["ratios"]) >= {
        "engine_over_transformers_tokens_per_s", "grpc_over_tcp_mb_per_s",
        "planner_over_raw_bandwidth", "reward_service_samples_per_s",
    }  # fmt: skip
    log = (out / "detailed.log").read_text()
    for what in ("hf_engine", "transformers_generate", "grpc_train_step", "raw_tcp",
                 "planner", "raw_broadcast", "reward_service"):  # fmt: skip
        assert f"] {what} " in log
    assert (out / "profile.svg").stat().st_size > 1000
    assert (out / "integration.png").stat().st_size > 1000


@pytest.mark.slow  # two launches, ~50 s on 2 cores
def test_pacing_suite_tiny(tmp_path: Path) -> None:
    cfg = tmp_path / "pacing.yaml"
    cfg.write_text(yaml.safe_dump({
        "suite": "pacing", "overrides": TINY_JOB, "warmup_steps": 1, "profile": False,
        "variants": [
            {"name": "genfast_greedy", "overrides": ["coordinator.max_staleness=2",
                                                     "coordinator.admission=greedy"]},
            {"name": "genfast_pace", "overrides": ["coordinator.max_staleness=2"]},
        ],
    }))  # fmt: skip
    results = tmp_path / "results"
    proc = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "pacing" / "run_pacing.py"), "--config",
         str(cfg), "--results", str(results), "--steps", "3"],  # fmt: skip
        cwd=REPO, capture_output=True, text=True, timeout=170,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    (out,) = [p for p in results.iterdir() if p.is_dir()]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["ratios"]["genfast_pace_over_greedy_samples_per_s"] > 0
    assert summary["pacing"]["genfast_greedy"]["final_lead_steps"] == 2.0
    assert 1.0 <= summary["pacing"]["genfast_pace"]["final_lead_steps"] <= 2.0
    assert "| genfast_pace |" in summary["table_markdown"]
    assert (out / "pacing_reward.png").stat().st_size > 1000


# --- the suites' own arithmetic, against hand-computed values ------------------------------


def _fig(gen: float, train: float, e2e: float) -> dict[str, float]:
    return {"generation_tokens_per_s": gen, "training_samples_per_s": train,
            "e2e_samples_per_s": e2e}  # fmt: skip


def test_scaling_efficiency_and_saturation() -> None:
    figures = {
        "r1": _fig(100, 50, 10), "r2": _fig(180, 50, 16), "r4": _fig(190, 50, 17),
        "l2": _fig(100, 80, 12),
    }  # fmt: skip
    sizes = {"r1": (1, 1), "r2": (2, 1), "r4": (4, 1), "l2": (1, 2)}
    out = scaling_ratios(figures, sizes, cpus=2)
    rollout = out["rollout_scaling"]["points"]
    assert [p["size"] for p in rollout] == [1, 2, 4]
    assert rollout[1]["generation_tokens_per_s_efficiency"] == pytest.approx(0.9)
    assert rollout[2]["generation_tokens_per_s_efficiency"] == pytest.approx(1.9 / 4)
    # 2 -> 4: 1.9 / 1.8 - 1 = 0.0556 of an ideal 1.0 extra: saturated at 2.
    assert rollout[2]["marginal_gain"] == pytest.approx(1.9 / 1.8 - 1)
    assert out["rollout_scaling"]["saturated_at"] == 2
    learner = out["learner_scaling"]
    assert learner["points"][1]["training_samples_per_s_efficiency"] == pytest.approx(0.8)
    assert learner["saturated_at"] is None  # 1 -> 2 gave 0.6 of the ideal extra
    assert "saturates at 2 replicas" in out["verdict"][0]
    assert "no saturation up to 2 ranks" in out["verdict"][1]


def test_convergence_figures() -> None:
    rows = [
        {"step": i + 1, "time": 10.0 + i, "timing_s/step": 1.0, "batch/num_samples": 8.0,
         "critic/score/mean": r}
        for i, r in enumerate([0.2, 0.8, 1.0, 1.0])
    ]  # fmt: skip
    curve = learning_curve(rows)
    assert [p["samples"] for p in curve] == [8.0, 16.0, 24.0, 32.0]
    assert [p["time_s"] for p in curve] == [1.0, 2.0, 3.0, 4.0]
    assert trailing_mean([0.2, 0.8, 1.0, 1.0], 2) == pytest.approx([0.2, 0.5, 0.9, 1.0])
    reached = first_reach(curve, 0.9, 2)
    assert reached is not None and reached["samples"] == 24.0 and reached["step"] == 3
    assert first_reach(curve, 0.95, 4) is None  # (0.2 + 0.8 + 1 + 1) / 4 = 0.75
    cfg = BenchmarkConfig(variants=[Variant("a", ["coordinator.num_steps=5"])])
    with pytest.raises(ValueError, match=r"variants\[a\].*coordinator.num_steps"):
        check_same_budget(cfg)


def test_pacing_figures() -> None:
    assert split_name("genslow_pace") == ("genslow", "pace")
    with pytest.raises(ValueError, match="expected <workload>_<sync|greedy|pace>"):
        split_name("pace")
    assert mean_staleness({"0": 1, "1": 2, "2": 1}) == pytest.approx(1.0)
    fig = {"genfast_sync": {"e2e_samples_per_s": 100.0, "mean_gen_s_per_step": 0.1,
                            "mean_train_s_per_step": 0.3},
           "genfast_greedy": {"e2e_samples_per_s": 125.0},
           "genfast_pace": {"e2e_samples_per_s": 120.0}}  # fmt: skip
    out = pacing_ratios(fig)
    assert out["genfast_pace_over_greedy_samples_per_s"] == pytest.approx(0.96)
    assert out["genfast_pace_over_sync_samples_per_s"] == pytest.approx(1.2)
    assert out["genfast_generation_faster_than_training"] is True


def test_cold_start_parity_figures() -> None:
    from benchmarks.algorithm.cold_start_parity import second_half_mean, summarize, table

    assert second_half_mean([0.0, 0.0, 0.2, 0.4]) == pytest.approx(0.3)
    summary = summarize({"trl": {0: [0.0, 0.0, 0.2, 0.4], 1: [0.0, 0.1, 0.1, 0.1]}})
    row = summary["trl"]
    assert row["per_seed"] == {0: pytest.approx(0.3), 1: pytest.approx(0.1)}
    assert (row["mean"], row["min"], row["max"]) == pytest.approx((0.2, 0.1, 0.3))
    assert "| trl | 0.200 | 0.100-0.300 | 2 |" in table(summary, 4)


@pytest.mark.parametrize(
    "parts", ["memory", pytest.param("sync", marks=pytest.mark.slow)], ids=["memory", "sync"]
)
def test_lora_suite_tiny(tmp_path: Path, parts: str) -> None:
    """benchmarks/lora/run_lora.py runs on the tiny model and writes its ratios (the sync part
    starts three vLLM replicas: slow)."""
    proc = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "lora" / "run_lora.py"), "--model",
         "builtin:tiny", "--rank", "8", "--syncs", "1", "--rounds", "1", "--steps", "1",
         "--samples", "2", "--tokens", "16", "--parts", parts, "--results", str(tmp_path)],
        capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(next(tmp_path.glob("lora_*/summary.json")).read_text())
    ratios = summary[parts]["ratios"]
    if parts == "memory":
        rows = summary["memory"]["rows"]
        assert rows["lora"]["trainable_params"] < rows["full"]["trainable_params"] / 4
        assert rows["lora"]["optimizer_state_mb"] < rows["full"]["optimizer_state_mb"] / 4
        assert ratios["lora_over_full_peak_rss"] > 0
    else:
        assert 0 < ratios["lora_adapter_over_full_bytes"] < 0.5
