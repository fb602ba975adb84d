"""``RLTrainer``: the whole RL step in one process, over the in-process twins of the services.

The same ``run_step`` the coordinator drives over gRPC runs here against ``LocalRollout``,
``RewardScorer`` and ``LearnerCore`` directly: no sockets, no subprocesses.

    trainer = RLTrainer(actor="builtin:tiny", reward_fn=my_reward, algo="grpo")
    result = trainer.step(prompts=["1+2=", "3+4="])
    result.metrics["reward_mean"], result.metrics["policy_loss"], result.metrics["value_loss"]
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

from hybridflow.types import SamplingParams

RewardFn = Callable[[str, str], float]
"""reward_fn(prompt, response) -> float."""

_DATA_SOURCE = "rltrainer"


@dataclass
class StepResult:
    """What one ``RLTrainer.step`` returns."""

    metrics: dict[str, float]
    """``policy_loss``, ``value_loss``, ``reward_mean`` plus every verl-style metric."""
    policy_version: int
    """Learner version after the step (rollout weights are synced to it)."""


class RLTrainer:
    def __init__(
        self,
        actor: str | Path,
        reward_fn: RewardFn,
        algo: Literal["grpo", "ppo", "dpo", "rft"] = "grpo",
        group_size: int = 4,
        sampling: SamplingParams | None = None,
        seed: int = 0,
        **learner_overrides: Any,
    ) -> None:
        """``actor``: builtin:tiny or a local HF checkpoint dir. ``learner_overrides`` set
        LearnerConfig fields (e.g. ``lr=1e-3``)."""
        from transformers import AutoTokenizer

        from hybridflow.coordinator.step import Services
        from hybridflow.models import resolve_model_path
        from hybridflow.services.learner.config import LearnerConfig
        from hybridflow.services.learner.core import LearnerCore
        from hybridflow.services.learner.worker import LearnerWorker
        from hybridflow.services.reward.scorers import RewardScorer
        from hybridflow.services.rollout.engine import HFEngine
        from hybridflow.services.rollout.local import LocalRollout
        from hybridflow.weights.base import LocalWeightSender, SendPublisher

        path = resolve_model_path(str(actor))
        self.tokenizer = AutoTokenizer.from_pretrained(str(path))
        self.params = replace(sampling or SamplingParams(max_new_tokens=8), n=group_size)
        learner_cfg = LearnerConfig(
            algorithm=algo, seed=seed, temperature=self.params.temperature, **learner_overrides
        )
        learner_cfg.validate()
        self.rollout = LocalRollout(HFEngine(path, seed=seed), str(actor))
        worker = LearnerWorker(learner_cfg, path)
        publisher = SendPublisher(lambda: list(worker.full_state_dict_items()))
        publisher.attach("local", LocalWeightSender(self.rollout))
        self.learner = LearnerCore(worker, publisher=publisher)
        self.reward = RewardScorer()
        self.reward.registry.register(
            _DATA_SOURCE, lambda response, _truth, extra: reward_fn(extra["prompt"], response)
        )
        self.services = Services(
            rollouts=[self.rollout],
            reward=self.reward,
            learner=self.learner,
            weight_targets=["local"],
            decode=lambda ids: str(self.tokenizer.decode(ids, skip_special_tokens=True)),
        )
        self._step = 0

    def step(self, prompts: Sequence[str]) -> StepResult:
        """Generate ``group_size`` responses per prompt, score, train one step, sync weights."""
        from hybridflow.coordinator.step import run_step
        from hybridflow.data.datasets import PromptRecord

        if not prompts:
            raise ValueError("prompts: at least one prompt is required")
        records = [
            PromptRecord(
                prompt_text=p,
                prompt_ids=self.tokenizer.encode(p, add_special_tokens=False),
                data_source=_DATA_SOURCE,
                ground_truth=None,
                extra_info={"prompt": p},
                index=i,
            )
            for i, p in enumerate(prompts)
        ]
        if any(r.prompt_ids.size == 0 for r in records):
            raise ValueError("prompts: every prompt must tokenise to at least one token")
        self._step += 1
        outcome = run_step(self.services, records, self.params, self._step)
        m = outcome.metrics
        metrics = {
            **m,
            "policy_loss": m.get("actor/pg_loss", 0.0),
            "value_loss": m.get("critic/vf_loss", 0.0),
            "reward_mean": m["critic/score/mean"],
        }
        return StepResult(metrics, outcome.result.policy_version)

    def close(self) -> None:
        self.services.close()
