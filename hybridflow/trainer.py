"""``RLTrainer``: the whole RL step in one process, over the in-process twins of the services.

Each ``step`` runs one ``TrainingJob.step`` of the coordinator's own schedule (synchronous:
``max_staleness: 0``; the job continues the previous one's state) over ``LocalRollout``, ``RewardScorer`` and ``LearnerCore``
directly: no sockets, no subprocesses, and the same admission, dispatch, scoring, dynamic
sampling, ReMax baselines, metrics and audit as a job started with ``deploy/launch.sh``.

    trainer = RLTrainer(actor="builtin:tiny", reward_fn=my_reward, algo="grpo")
    result = trainer.step(prompts=["1+2=", "3+4="])
    result.metrics["reward_mean"], result.metrics["policy_loss"], result.metrics["value_loss"]

Step k samples with seed ``seed + k - 1``: step 1 of a trainer draws what step 1 of a
service job with ``coordinator.seed = seed`` draws.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from hybridflow.types import SamplingParams

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from hybridflow.clients import RewardClient
    from hybridflow.coordinator.checkpoint import CoordinatorState
    from hybridflow.coordinator.services import Services
    from hybridflow.services.learner.config import LearnerConfig
    from hybridflow.services.learner.worker import LearnerWorker

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
    """The whole RL step in one process: the coordinator's own schedule (``TrainingJob``)
    over the in-process twins of the rollout, reward and learner services, one ``step`` at a
    time. Knows no sockets; ``deploy/launch.sh`` runs the same schedule over services."""

    def __init__(
        self,
        actor: str | Path,
        reward_fn: RewardFn,
        algo: Literal["grpo", "ppo", "dpo", "rft"] = "grpo",
        group_size: int = 4,
        sampling: SamplingParams | None = None,
        seed: int = 0,
        run_dir: str | Path | None = None,
        dynamic_sampling: bool = False,
        env: str | None = None,
        max_turns: int = 4,
        max_total_tokens: int = 256,
        **learner_overrides: Any,
    ) -> None:
        """``actor``: builtin:tiny or a local HF checkpoint dir. ``algo``: the learner's preset
        (grpo, ppo, dpo: online DPO on each group's best and worst response, rft:
        rejection-sampling fine-tuning). ``run_dir``: where metrics.jsonl, trained.jsonl and
        events.jsonl go (None: a temporary directory removed by ``close``).
        ``dynamic_sampling``: DAPO's (coordinator.dynamic_sampling). ``env``: an
        environment class (``module:Class``): each prompt becomes a multi-turn episode's
        task, of at most ``max_turns`` policy turns and ``max_total_tokens`` response tokens,
        rewarded by the environment (``reward_fn`` is then not called; pass any).
        ``learner_overrides``
        set LearnerConfig keys as a job file does (e.g. ``optimizer={"lr": 1e-3}``; the old
        flat names, ``lr=1e-3``, still work)."""
        from hybridflow.config.loader import with_keys
        from hybridflow.models import resolve_model_path
        from hybridflow.services.learner.config import LearnerConfig
        from hybridflow.services.reward.scorers import RewardScorer

        self.params = replace(sampling or SamplingParams(max_new_tokens=8), n=group_size)
        self.seed = seed
        self.dynamic_sampling = dynamic_sampling
        from hybridflow.coordinator.config import MultiTurnConfig

        self.multi_turn = MultiTurnConfig(
            env=env or "", max_turns=max_turns, max_total_tokens=max_total_tokens
        )
        learner_cfg = with_keys(
            LearnerConfig(algorithm=algo, seed=seed, temperature=self.params.temperature),
            learner_overrides,
        )
        learner_cfg.validate()
        self.reward = RewardScorer()
        self.reward.registry.register(
            _DATA_SOURCE, lambda response, _truth, extra: reward_fn(extra["prompt"], response)
        )
        twins = twin_services(
            resolve_model_path(str(actor)), learner_cfg, seed, self.reward, str(actor)
        )
        self.services, self.tokenizer = twins.services, twins.tokenizer
        self.rollout = twins.services.rollouts[0]
        self.learner = twins.services.learner
        self._own_run_dir = run_dir is None
        self.run_dir = Path(run_dir or tempfile.mkdtemp(prefix="rltrainer-"))
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self._state: CoordinatorState | None = None

    def step(self, prompts: Sequence[str]) -> StepResult:
        """Generate ``group_size`` responses per prompt, score, train one step, sync weights."""
        from hybridflow.coordinator.config import CoordinatorConfig, SamplingConfig
        from hybridflow.coordinator.job import TrainingJob
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
                task_prompt=p,
            )
            for i, p in enumerate(prompts)
        ]
        if any(r.prompt_ids.size == 0 for r in records):
            raise ValueError("prompts: every prompt must tokenise to at least one token")
        step = (self._state.step if self._state else 0) + 1
        config = CoordinatorConfig(
            seed=self.seed + step - 1,
            num_steps=step,
            prompts_per_step=len(records),
            group_size=self.params.n,
            sampling=SamplingConfig(
                temperature=self.params.temperature,
                top_p=self.params.top_p,
                top_k=self.params.top_k,
                max_new_tokens=self.params.max_new_tokens,
            ),
            max_staleness=0,
            dynamic_sampling=self.dynamic_sampling,
            multi_turn=self.multi_turn,
            save_checkpoint=False,
            checkpoint_every=0,
            progress=False,
        )
        config.validate()
        job = TrainingJob(
            config,
            self.services,
            records,
            self.run_dir,
            continue_from=self._state,
            needs=self.learner.schedule_needs(),
        )
        run = job.open()
        try:
            if not job.step(run.first_step, run):
                raise RuntimeError("RLTrainer.step: the job stopped before it trained")
        finally:
            job.close(run)
        self._state = job.state
        m = job.last_metrics
        metrics = {
            **m,
            "policy_loss": m.get("actor/pg_loss", 0.0),
            "value_loss": m.get("critic/vf_loss", 0.0),
            "reward_mean": m["critic/score/mean"],
        }
        return StepResult(metrics, job.state.policy_version)

    def close(self) -> None:
        """Removes the temporary run directory (a given ``run_dir`` is kept)."""
        if self._own_run_dir:
            shutil.rmtree(self.run_dir, ignore_errors=True)


@dataclass
class Twins:
    """One job's services as in-process twins (``twin_services``)."""

    services: Services
    worker: LearnerWorker
    """The learner's worker (its weights, version)."""
    tokenizer: PreTrainedTokenizerBase
    """What ``services.decode`` uses."""


def twin_services(
    model_path: Path,
    learner_config: LearnerConfig,
    seed: int = 0,
    reward: RewardClient | None = None,
    model_name: str = "",
    lora_mode: str = "adapter",
) -> Twins:
    """A ``LocalRollout`` on the HF engine, a ``LearnerCore`` publishing to it by memory
    copy, and ``reward`` (default: the built-in scorers): what ``RLTrainer`` runs its schedule
    over, and tests that need real services without sockets. With ``learner.lora`` the
    publishes carry the adapters (applied as ``lora_mode`` says), each verified by the probe."""
    from transformers import AutoTokenizer

    from hybridflow.coordinator.services import Services
    from hybridflow.envs.runner import LocalEnvironments
    from hybridflow.services.learner.core import LearnerCore
    from hybridflow.services.learner.worker import LearnerWorker
    from hybridflow.services.reward.scorers import RewardScorer
    from hybridflow.services.rollout.engine import HFEngine
    from hybridflow.services.rollout.local import LocalRollout
    from hybridflow.weights.base import LocalWeightSender, SendPublisher

    tokenizer = AutoTokenizer.from_pretrained(str(model_path))
    lora = learner_config.lora if learner_config.lora.enabled else None
    engine = HFEngine(model_path, seed=seed, lora=lora, lora_mode=lora_mode)
    rollout = LocalRollout(engine, model_name or str(model_path))
    worker = LearnerWorker(learner_config, model_path)
    publisher = SendPublisher(
        worker.adapter_items if lora is not None else lambda: list(worker.full_state_dict_items())
    )
    publisher.attach("local", LocalWeightSender(rollout))
    core = LearnerCore(
        worker,
        publisher=publisher,
        probe_replica=lambda _target, prompt, response: rollout.probe_logprobs(prompt, response),
    )
    services = Services(
        rollouts=[rollout],
        reward=reward if reward is not None else RewardScorer(),
        learner=core,
        weight_targets=["local"],
        decode=lambda ids: str(tokenizer.decode(ids, skip_special_tokens=True)),
        environments=LocalEnvironments(),
        tokenizer=tokenizer,
    )
    return Twins(services, worker, tokenizer)
