"""One synchronous RL step over the service clients: generate → score → train → publish.

Used by the coordinator's schedule and by the in-process ``RLTrainer`` alike; works against
the client Protocols, so gRPC clients and in-process twins are interchangeable.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import grpc

from hybridflow.arrays import TokenArray
from hybridflow.coordinator.dataflow import (
    Prompt,
    attach_scores,
    rollout_metrics,
    score_items,
    split_round_robin,
    train_samples,
)
from hybridflow.services.learner.client import LearnerClient
from hybridflow.services.reward.client import RewardClient
from hybridflow.services.rollout.client import RolloutClient
from hybridflow.types import Completion, SamplingParams, TrainStepResult

log = logging.getLogger(__name__)


@dataclass
class Services:
    """The clients one job drives; ``weight_targets`` name the replicas for weight publishes."""

    rollouts: list[RolloutClient]
    reward: RewardClient
    learner: LearnerClient
    weight_targets: list[str]
    decode: Callable[[TokenArray], str]
    pool: ThreadPoolExecutor = field(init=False)

    def __post_init__(self) -> None:
        if not self.rollouts:
            raise ValueError("at least one rollout replica is required")
        self.pool = ThreadPoolExecutor(
            max_workers=len(self.rollouts), thread_name_prefix="dispatch"
        )

    def close(self) -> None:
        self.pool.shutdown(wait=True)


@dataclass
class StepOutcome:
    result: TrainStepResult
    metrics: dict[str, float]
    num_requeued: int
    num_stale: int


def generate_groups(
    services: Services, prompts: Sequence[Prompt], params: SamplingParams, request_id: str
) -> tuple[list[list[Completion]], int]:
    """Spreads prompts over replicas round-robin; a failed replica's prompts are re-queued on
    the next replica (counted). Returns groups in prompt order and the re-queue count."""
    shares = split_round_robin(len(prompts), len(services.rollouts))
    groups: list[list[Completion] | None] = [None] * len(prompts)
    requeued = 0
    pending = [(w, idx) for w, idx in enumerate(shares) if idx]
    failed: set[int] = set()
    while pending:
        futures = {
            w: services.pool.submit(
                services.rollouts[w].generate,
                [prompts[i].prompt_ids for i in idx],
                params,
                f"{request_id}-r{w}",
            )
            for w, idx in pending
        }
        retry = []
        for w, idx in pending:
            try:
                for i, group in zip(idx, futures[w].result()):
                    groups[i] = group
            except grpc.RpcError as exc:
                if exc.code() == grpc.StatusCode.INVALID_ARGUMENT:  # type: ignore[attr-defined]
                    raise
                failed.add(w)
                alive = [r for r in range(len(services.rollouts)) if r not in failed]
                if not alive:
                    raise RuntimeError("every rollout replica failed") from exc
                log.warning("replica %d failed (%s); re-queueing %d prompts", w, exc, len(idx))
                requeued += len(idx)
                retry.append((alive[w % len(alive)], idx))
        pending = retry
    assert all(g is not None for g in groups)
    return [g for g in groups if g is not None], requeued


def run_step(
    services: Services,
    prompts: Sequence[Prompt],
    params: SamplingParams,
    step_index: int,
    publish: bool = True,
    expected_version: int | None = None,
    max_staleness: int = 0,
) -> StepOutcome:
    """One step: generate → score → train → publish. Metrics use verl's names.

    ``expected_version`` is the learner's version before the step; a sample more than
    ``max_staleness`` versions behind it is counted (``async/num_stale``) and reported: with
    a correct schedule the count is always 0.
    """
    start = time.perf_counter()
    groups, requeued = generate_groups(services, prompts, params, f"step{step_index}")
    t_gen = time.perf_counter()
    stale = 0
    if expected_version is not None:
        stale = sum(expected_version - c.policy_version > max_staleness for g in groups for c in g)
        if stale:
            log.error(
                "step %d: %d samples exceed max_staleness=%d", step_index, stale, max_staleness
            )
    items = score_items(prompts, groups, services.decode)
    results = services.reward.score_batch(items)
    scored = attach_scores(prompts, groups, results)
    t_reward = time.perf_counter()
    samples = train_samples(scored, first_group_id=step_index * len(prompts))
    result = services.learner.train_step(samples)
    t_train = time.perf_counter()
    sync_s = 0.0
    if publish:
        services.learner.publish_weights(services.weight_targets)
        sync_s = time.perf_counter() - t_train
    total_s = time.perf_counter() - start
    num_tokens = sum(len(s.prompt_ids) + len(s.response_ids) for s in samples)
    metrics = {
        **rollout_metrics(scored),
        **result.metrics,
        "timing_s/gen": t_gen - start,
        "timing_s/reward": t_reward - t_gen,
        "timing_s/update_actor": t_train - t_reward,
        "timing_s/update_weights": sync_s,
        "timing_s/step": total_s,
        "perf/throughput": num_tokens / total_s,
        "perf/samples_per_s": len(samples) / total_s,
        "async/requeued": float(requeued),
        "training/policy_version": float(result.policy_version),
    }
    metrics["async/num_stale"] = float(stale)
    return StepOutcome(result, metrics, requeued, stale)
