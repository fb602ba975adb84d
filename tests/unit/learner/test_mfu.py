"""MFU of a learner step: the FLOPs estimate, the peak table and the step metrics."""

from pathlib import Path

import pytest

from hybridflow.services.learner.config import LearnerConfig
from hybridflow.services.learner.mfu import (
    StepPasses,
    mfu,
    peak_tflops_for,
    policy_gradient_passes,
    step_flops,
    utilisation_metrics,
)
from tests.helpers import learner_config


def test_mfu_of_a_hand_computed_step():
    # 1e9 params, 2,000 tokens, one train pass + a reference forward: (6 + 2) * 1e9 * 2e3.
    flops = step_flops(10**9, 2_000, StepPasses(num_train_passes=1, num_extra_forwards=1))
    assert flops == 16e12
    # 16 TFLOP in 0.5 s on 2 devices of 100 TFLOP/s: 32 of 200 TFLOP/s.
    assert mfu(flops, seconds=0.5, peak_tflops=100.0, num_devices=2) == pytest.approx(0.16)
    assert utilisation_metrics(2_000, 0.5, 2, flops, 100.0) == {
        "perf/tokens_per_s_per_device": 2_000.0,
        "perf/mfu": pytest.approx(0.16),
    }


def test_unknown_peak_or_flops_reports_no_mfu():
    assert utilisation_metrics(100, 2.0, 1, None, 100.0) == {"perf/tokens_per_s_per_device": 50.0}
    assert utilisation_metrics(100, 2.0, 1, 1e9, None) == {"perf/tokens_per_s_per_device": 50.0}


def test_passes_of_grpo_and_ppo_steps():
    # GRPO, one update, no reference: the update's forward gives the old log-probs.
    assert policy_gradient_passes(1, False, False, False) == StepPasses(1, 0)
    # PPO, 2 epochs, reference: actor + critic trained twice; old, ref, values forwards.
    assert policy_gradient_passes(2, True, True, True) == StepPasses(4, 3)


def test_peak_table_matches_device_names_specific_first():
    assert peak_tflops_for("NVIDIA H200") == 989.0
    assert peak_tflops_for("NVIDIA H100 PCIe") == 756.0
    assert peak_tflops_for("NVIDIA A100-SXM4-80GB") == 312.0
    assert peak_tflops_for("NVIDIA L40S") == 362.0
    assert peak_tflops_for("NVIDIA L4") == 121.0
    assert peak_tflops_for("cpu") is None


def test_peak_tflops_config_must_be_positive():
    with pytest.raises(ValueError, match="learner.peak_tflops: must be > 0"):
        LearnerConfig(peak_tflops=0.0).validate()


def test_worker_step_metrics_carry_mfu(tiny_checkpoint: Path, make_samples) -> None:
    from hybridflow.services.learner.core import LearnerCore
    from hybridflow.services.learner.worker import LearnerWorker

    cfg = learner_config(
        algorithm="grpo", peak_tflops=2.0, update={"epochs": 2, "micro_batch_size": 4}
    )
    worker = LearnerWorker(cfg, tiny_checkpoint)
    samples = make_samples([1.0, 0.0, 0.5, 0.0])
    num_tokens = sum(len(s.prompt_ids) + len(s.response_ids) for s in samples)
    metrics = LearnerCore(worker).train_step(samples).metrics
    seconds = metrics["timing_s/learner_compute"]
    # 2 epochs: two train passes, and the old log-probs' own forward.
    flops = worker.num_params * num_tokens * (6 * 2 + 2 * 1)
    assert metrics["perf/mfu"] == pytest.approx(flops / (seconds * 2e12), rel=1e-12)
    assert metrics["perf/tokens_per_s_per_device"] == pytest.approx(num_tokens / seconds)
    assert worker.num_params == sum(p.numel() for p in worker.actor.parameters())


def test_cpu_worker_without_a_peak_reports_no_mfu(tiny_checkpoint: Path, make_samples) -> None:
    from hybridflow.services.learner.core import LearnerCore
    from hybridflow.services.learner.worker import LearnerWorker

    worker = LearnerWorker(LearnerConfig(algorithm="grpo"), tiny_checkpoint)
    metrics = LearnerCore(worker).train_step(make_samples([1.0, 0.0])).metrics
    assert "perf/mfu" not in metrics
    assert metrics["perf/tokens_per_s_per_device"] > 0
