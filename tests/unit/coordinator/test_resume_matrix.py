"""The resume matrix over the schedule (fake services): for every key of the coordinator and
learner sections, a resume with that key changed either is refused at once naming the key,
or completes with the exactly-once audit clean and every coordinator key it changed observed
at its new value in the running job: what the rollouts were asked to generate, what the
learner trained, published and saved, the files the run wrote, the live settings of its
dispatchers and pacer (``OBSERVERS``), never the config the test wrote. The run being resumed
crashed at step 6 with prompts in flight (max_staleness 1), so the resume has work to
regenerate.

The learner's keys take effect in the learner, which the fakes do not have: they are
observed on the real learner after it restored a crashed run's train state
(tests/fault/test_resume_matrix_twins.py). The keys no in-process run can show are
``NOT_OBSERVED``, each with why; ``test_every_key_is_in_the_matrix`` lets no accepted key
in without an observer or a reason. With ``pytest -s`` the module prints the table of
what was observed (also written to a file under the session's temp dir)."""

from __future__ import annotations

import json
import re
import shutil
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import pytest

from hybridflow.coordinator.checkpoint import CheckpointStore
from hybridflow.coordinator.checkpoint_config import ResumeRefused
from hybridflow.coordinator.evaluation import EvalSet
from hybridflow.coordinator.job import TrainingJob
from hybridflow.coordinator.resume_policy import Change, Policy, compare, flatten, rule_for
from hybridflow.coordinator.services import Services
from hybridflow.job_config import JobConfig, load_job_config
from hybridflow.services.tinker.config import TinkerConfig
from hybridflow.types import SamplingParams
from tests.fault.harness import audit
from tests.fault.test_resume_matrix_twins import OBSERVERS as TWIN_OBSERVERS
from tests.resume_observed import NOTHING, ObservedTable, Observer, one

from .fakes import AheadFakeLearner, FakeReward, FakeRollout, Unavailable, records

NUM_ROWS = 12
BASE = (
    "coordinator.num_steps=8",
    "coordinator.prompts_per_step=4",
    "coordinator.group_size=2",
    "coordinator.checkpoint_every=2",
    "coordinator.progress=false",
    "coordinator.max_staleness=1",
    "learner.algorithm=ppo",  # a critic: every learner key, the critic's included, is valid
)
CRASH_STEP = 6  # checkpoints at steps 2 and 4; step 5 trained and lost with the crash
EVAL_ON = "coordinator.eval.sets=[{name: held, data: 'builtin:arith:test'}]"
EVAL_PROMPTS = 3
"""Prompts of the matrix's held-out set (fake records)."""

# One valid change per key (several keys where one needs another to validate or to act); the
# server / channel sub-configs by one key each: they share one rule.
CHANGES: dict[str, tuple[str, ...]] = {
    "coordinator.data": ("coordinator.data=other.jsonl",),
    "coordinator.data_size": ("coordinator.data_size=100",),
    "coordinator.max_prompt_tokens": ("coordinator.max_prompt_tokens=100",),
    "coordinator.max_prompt_bytes": ("coordinator.max_prompt_bytes=1000",),
    "coordinator.seed": ("coordinator.seed=7",),
    "coordinator.num_steps": ("coordinator.num_steps=11",),
    "coordinator.prompts_per_step": ("coordinator.prompts_per_step=2",),
    "coordinator.prompts_per_step+": ("coordinator.prompts_per_step=8",),
    "coordinator.group_size": ("coordinator.group_size=3",),
    "coordinator.sampling.temperature": ("coordinator.sampling.temperature=0.7",),
    "coordinator.sampling.top_p": ("coordinator.sampling.top_p=0.9",),
    "coordinator.sampling.top_k": ("coordinator.sampling.top_k=4",),
    "coordinator.sampling.max_new_tokens": ("coordinator.sampling.max_new_tokens=4",),
    "coordinator.prompts_per_request": ("coordinator.prompts_per_request=1",),
    "coordinator.sync_every": ("coordinator.sync_every=2",),
    "coordinator.max_staleness": ("coordinator.max_staleness=0",),
    "coordinator.max_staleness+": ("coordinator.max_staleness=2",),
    "coordinator.admission": ("coordinator.admission=greedy",),
    "coordinator.overlap_publish": ("coordinator.overlap_publish=false",),
    "coordinator.train_ahead": ("coordinator.train_ahead=false",),
    "coordinator.overlap_scoring": ("coordinator.overlap_scoring=false",),
    "coordinator.dynamic_sampling": ("coordinator.dynamic_sampling=true",),
    "coordinator.dynamic_sampling_max_rounds": (
        "coordinator.dynamic_sampling=true",  # without it the key has nothing to act on
        "coordinator.dynamic_sampling_max_rounds=3",
    ),
    "coordinator.multi_turn.env": ("coordinator.multi_turn.env=m:Env",),
    "coordinator.multi_turn.agent": (
        "coordinator.multi_turn.agent=m:agent",
        "environment.envs=[m:agent]",  # agents run in the environment service
    ),
    "coordinator.multi_turn.max_turns": ("coordinator.multi_turn.max_turns=2",),
    "coordinator.multi_turn.max_total_tokens": ("coordinator.multi_turn.max_total_tokens=64",),
    "coordinator.multi_turn.env_concurrency": ("coordinator.multi_turn.env_concurrency=2",),
    "coordinator.rollout_addresses": ("coordinator.rollout_addresses=[h:1]",),
    "coordinator.reward_address": ("coordinator.reward_address=h:2",),
    "coordinator.learner_address": ("coordinator.learner_address=h:3",),
    "coordinator.environment_address": ("coordinator.environment_address=h:4",),
    "coordinator.channel.*": ("coordinator.channel.timeout_s=30",),
    "coordinator.server.*": ("coordinator.server.max_workers=4",),
    "coordinator.save_checkpoint": ("coordinator.save_checkpoint=false",),
    # 5: the first step after the resume; 2, 3, 4 or 6 would checkpoint other steps
    "coordinator.checkpoint_every": ("coordinator.checkpoint_every=5",),
    "coordinator.keep_checkpoints": ("coordinator.keep_checkpoints=3",),
    "coordinator.replica_rejoin_timeout_s": ("coordinator.replica_rejoin_timeout_s=10",),
    "coordinator.replica_stall_timeout_s": ("coordinator.replica_stall_timeout_s=10",),
    "coordinator.service_wait_s": ("coordinator.service_wait_s=10",),
    "coordinator.progress": ("coordinator.progress=true",),
    # An evaluation is due at the last step (at_end); each case changes one key besides.
    "coordinator.eval.sets": (EVAL_ON,),
    "coordinator.eval.every": (EVAL_ON, "coordinator.eval.every=2"),
    "coordinator.eval.before_training": (EVAL_ON, "coordinator.eval.before_training=false"),
    "coordinator.eval.at_end": (
        EVAL_ON,
        "coordinator.eval.every=4",
        "coordinator.num_steps=9",  # the last step is not one every=4 evaluates
        "coordinator.eval.at_end=false",
    ),
    "coordinator.eval.k": (EVAL_ON, "coordinator.eval.k=3"),
    "coordinator.eval.sampling.temperature": (EVAL_ON, "coordinator.eval.sampling.temperature=0.5"),
    "coordinator.eval.sampling.top_p": (EVAL_ON, "coordinator.eval.sampling.top_p=0.8"),
    "coordinator.eval.sampling.top_k": (EVAL_ON, "coordinator.eval.sampling.top_k=5"),
    "coordinator.eval.sampling.max_new_tokens": (
        EVAL_ON,
        "coordinator.eval.sampling.max_new_tokens=3",
    ),
    "coordinator.eval.pass_threshold": (EVAL_ON, "coordinator.eval.pass_threshold=0.5"),
    "coordinator.eval.prompts_per_request": (EVAL_ON, "coordinator.eval.prompts_per_request=1"),
    "coordinator.eval.timeout_s": (EVAL_ON, "coordinator.eval.timeout_s=60"),
    "coordinator.loggers": ("coordinator.loggers=[jsonl, tensorboard]",),
    "learner.algorithm": ("learner.algorithm=grpo",),
    "learner.dpo.beta": ("learner.dpo.beta=0.2",),
    "learner.dpo.loss_type": ("learner.dpo.loss_type=ipo",),
    "learner.rft.threshold": ("learner.rft.threshold=0.5",),
    "learner.optimizer.lr": ("learner.optimizer.lr=0.001",),
    "learner.optimizer.weight_decay": ("learner.optimizer.weight_decay=0.0",),
    "learner.optimizer.betas": ("learner.optimizer.betas=[0.8, 0.99]",),
    "learner.optimizer.grad_clip": ("learner.optimizer.grad_clip=0.5",),
    "learner.update.micro_batch_size": ("learner.update.micro_batch_size=4",),
    "learner.update.epochs": ("learner.update.epochs=2",),
    "learner.update.num_mini_batches": ("learner.update.num_mini_batches=2",),
    "learner.loss.clip_ratio_low": ("learner.loss.clip_ratio_low=0.1",),
    "learner.loss.clip_ratio_high": ("learner.loss.clip_ratio_high=0.28",),
    "learner.loss.clip_ratio_c": ("learner.loss.clip_ratio_c=null",),
    "learner.loss.agg_mode": ("learner.loss.agg_mode=seq-mean-token-sum",),
    "learner.advantage.norm_by_std": ("learner.advantage.norm_by_std=false",),
    "learner.advantage.norm_eps": ("learner.advantage.norm_eps=0.001",),
    "learner.kl.coef": ("learner.kl.coef=0.1", "learner.kl.use_reference=true"),
    "learner.kl.estimator": ("learner.kl.estimator=k1",),
    "learner.loss.off_policy": ("learner.loss.off_policy=tis",),
    "learner.loss.is_cap": ("learner.loss.is_cap=3.0",),
    "learner.moe_router_replay": ("learner.moe_router_replay=true",),
    "learner.kl.mode": ("learner.kl.mode=reward",),
    "learner.kl.use_reference": ("learner.kl.use_reference=true",),
    "learner.loss.entropy_coef": ("learner.loss.entropy_coef=0.01",),
    "learner.temperature": ("coordinator.sampling.temperature=0.7",),  # derived
    "learner.critic.lr": ("learner.critic.lr=0.0001",),
    "learner.advantage.gamma": ("learner.advantage.gamma=0.9",),
    "learner.advantage.lam": ("learner.advantage.lam=0.9",),
    "learner.critic.value_clip": ("learner.critic.value_clip=null",),
    "learner.advantage_estimator": ("learner.advantage_estimator=rloo",),
    "learner.policy_loss": ("learner.policy_loss=gspo",),
    "learner.overlong.buffer": ("learner.overlong.buffer=2",),
    "learner.overlong.penalty_factor": ("learner.overlong.penalty_factor=0.5",),
    "learner.max_new_tokens": ("coordinator.sampling.max_new_tokens=4",),  # derived
    "learner.seed": ("learner.seed=3",),
    "learner.topology.num_threads": ("learner.topology.num_threads=2",),
    "learner.topology.device": ("learner.topology.device=cuda",),
    "learner.peak_tflops": ("learner.peak_tflops=100",),
    "learner.topology.nproc_per_node": ("learner.topology.nproc_per_node=2",),
    "learner.topology.devices": ("learner.topology.devices=['0']",),
    "learner.topology.critic_nproc_per_node": ("learner.topology.critic_nproc_per_node=1",),
    "learner.topology.critic_devices": (
        "learner.topology.critic_nproc_per_node=1",
        "learner.topology.devices=['0']",
        "learner.topology.critic_devices=['1']",
    ),
    "learner.topology.nnodes": (
        "learner.topology.nnodes=2",
        "learner.topology.rdzv_endpoint=h:29500",
    ),
    "learner.topology.node_rank": (
        "learner.topology.nnodes=2",
        "learner.topology.node_rank=1",
        "learner.topology.rdzv_endpoint=h:29500",
    ),
    "learner.topology.rdzv_endpoint": ("learner.topology.rdzv_endpoint=h:29500",),
    "learner.topology.local_addr": ("learner.topology.local_addr=h",),
    "learner.server.*": ("learner.server.max_workers=4",),
    "learner.memory.dtype": ("learner.memory.dtype=bfloat16",),
    "learner.memory.activation_checkpointing": ("learner.memory.activation_checkpointing=true",),
    "learner.memory.packing": ("learner.memory.packing=true",),
    "learner.memory.shared_prompts": ("learner.memory.shared_prompts=false",),
    "learner.memory.max_tokens_per_micro_batch": ("learner.memory.max_tokens_per_micro_batch=256",),
    "learner.memory.logprob_chunk_tokens": ("learner.memory.logprob_chunk_tokens=64",),
    "learner.memory.full_logits": ("learner.memory.full_logits=true",),
    "learner.memory.cpu_offload": ("learner.memory.cpu_offload=true",),
    "learner.lora.rank": ("learner.lora.rank=8", "learner.algorithm=grpo"),
    "learner.lora.alpha": ("learner.lora.alpha=8",),
    "learner.lora.target_modules": ("learner.lora.target_modules=[q_proj]",),
    "learner.checkpoint_dir": ("learner.checkpoint_dir=/elsewhere",),
}


@dataclass
class Resumed:
    """What the resumed run's running parts saw and did (the fakes record it)."""

    training: TrainingJob
    learner: AheadFakeLearner
    rollouts: list[FakeRollout]
    run_dir: Path
    stderr: str
    restored_step: int

    def trained(self) -> list[dict]:
        """trained.jsonl's groups of the steps after the resume (filtered ones left out)."""
        rows = [json.loads(x) for x in (self.run_dir / "trained.jsonl").read_text().splitlines()]
        return [r for r in rows if r["step"] > self.restored_step and not r.get("filtered")]

    def metrics(self) -> list[dict]:
        """metrics.jsonl's lines of the steps after the resume."""
        rows = [json.loads(x) for x in (self.run_dir / "metrics.jsonl").read_text().splitlines()]
        return [r for r in rows if r["step"] > self.restored_step]

    def requests(self) -> list[tuple[int, SamplingParams]]:
        """(prompts, sampling) of every Generate call of the resumed run."""
        return [request for rollout in self.rollouts for request in rollout.requests]

    def eval_requests(self) -> list[tuple[int, SamplingParams]]:
        """(prompts, sampling) of the resumed run's evaluation requests."""
        return [
            request
            for rollout in self.rollouts
            for request, rid in zip(rollout.requests, rollout.request_ids, strict=True)
            if rid.startswith("eval")
        ]

    def evaluations(self) -> list[dict]:
        """eval.jsonl's records of the steps from the restored one on."""
        path = self.run_dir / "eval.jsonl"
        rows = [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []
        return [r for r in rows if r["step"] >= self.restored_step]

    def saved_steps(self) -> list[int]:
        """The steps whose train state the learner saved after the resume."""
        return [int(name.split("/")[0].removeprefix("step_")) for name in self.learner.saved]


def _sampling(field: str) -> Observer[Resumed]:
    return Observer(
        f"SamplingParams.{field} of the Generate calls",
        lambda r: one(getattr(params, field) for _, params in r.requests()),
    )


def _eval_sampling(field: str) -> Observer[Resumed]:
    return Observer(
        f"SamplingParams.{field} of the evaluation requests",
        lambda r: one(getattr(params, field) for _, params in r.eval_requests()),
    )


def _eval_sets(r: Resumed) -> list[dict]:
    evaluated = {e["name"] for e in r.evaluations()}
    assert r.training.evaluations is not None
    return [asdict(s) for s in r.training.evaluations.evaluator.config.sets if s.name in evaluated]


def _gaps(steps: list[int]) -> object:
    return one(b - a for a, b in zip(steps, steps[1:], strict=False))


def _checkpoint_every(r: Resumed) -> object:
    """The period that checkpoints exactly the steps the learner saved before the last one
    (several fitting, all of them; none, ``NOTHING``)."""
    saved = r.saved_steps()
    last = max(saved)
    periodic = set(saved) - {last}
    fits = [
        k
        for k in range(1, last + 1)
        if periodic == {s for s in range(r.restored_step + 1, last) if s % k == 0}
    ]
    return one(fits)


def _staleness_bound(r: Resumed) -> int:
    """The job's bound, after checking every group trained after the resume kept to it."""
    bound = r.training.buffer.bound
    lags = [g["version"] - bound.versions_per_step - g["generated_version"] for g in r.trained()]
    assert max(lags) <= bound.max_versions, f"a group lagged {max(lags)} versions"
    return bound.max_versions


def _max_rounds(r: Resumed) -> object:
    group_filter = r.training.buffer.group_filter
    if group_filter is None:
        return NOTHING
    return group_filter.limit // r.training.buffer.admission.batch_groups


def _sinks(r: Resumed) -> list[str]:
    """The loggers whose output the resumed run wrote."""
    out = ["jsonl"] if r.metrics() else []
    if any((r.run_dir / "tensorboard").glob("events.out.tfevents.*")):
        out.append("tensorboard")
    return out


OBSERVERS: dict[str, Observer[Resumed]] = {
    "coordinator.num_steps": Observer(
        "the last step in trained.jsonl", lambda r: max(g["step"] for g in r.trained())
    ),
    "coordinator.prompts_per_step": Observer(
        "groups trained per step (trained.jsonl)",
        lambda r: one(Counter(g["step"] for g in r.trained()).values()),
    ),
    "coordinator.group_size": Observer(
        "n of the Generate calls, and samples per group of the batches trained",
        lambda r: one(
            [
                *(params.n for _, params in r.requests()),
                *(n for b in r.learner.batches for n in Counter(s.group_id for s in b).values()),
            ]
        ),
    ),
    "coordinator.sampling.temperature": _sampling("temperature"),
    "coordinator.sampling.top_p": _sampling("top_p"),
    "coordinator.sampling.top_k": _sampling("top_k"),
    "coordinator.sampling.max_new_tokens": _sampling("max_new_tokens"),
    "coordinator.prompts_per_request": Observer(
        "the largest Generate call (prompts)", lambda r: max(n for n, _ in r.requests())
    ),
    "coordinator.sync_every": Observer(
        "steps between weight publishes",
        lambda r: _gaps(sorted({*r.learner.published, *r.learner.background})),
    ),
    "coordinator.max_staleness": Observer(
        "the job's staleness bound (each trained group within it)", _staleness_bound
    ),
    "coordinator.admission": Observer(
        "the job's pacer", lambda r: "greedy" if r.training.pacer.greedy else "pace"
    ),
    "coordinator.overlap_publish": Observer(
        "publishes run in the background", lambda r: bool(r.learner.background)
    ),
    "coordinator.train_ahead": Observer(
        "the learner's steps start their own publishes", lambda r: bool(r.learner.in_step)
    ),
    "coordinator.overlap_scoring": Observer(
        "the dispatchers score on a lane",
        lambda r: one(d._lane is not None for d in r.training.dispatchers),
    ),
    "coordinator.dynamic_sampling": Observer(
        "dynamic_sampling/* in metrics.jsonl",
        lambda r: one("dynamic_sampling/filtered" in m for m in r.metrics()),
    ),
    "coordinator.dynamic_sampling_max_rounds": Observer(
        "the buffer's group filter (groups filtered before equal ones pass / batch)",
        _max_rounds,
    ),
    "coordinator.save_checkpoint": Observer(
        "a Hugging Face export was saved", lambda r: bool(r.learner.checkpoints)
    ),
    "coordinator.checkpoint_every": Observer(
        "the steps whose train state was saved", _checkpoint_every
    ),
    "coordinator.keep_checkpoints": Observer(
        "complete checkpoints left on disk",
        lambda r: len(CheckpointStore(r.run_dir / "checkpoints").complete_steps()),
    ),
    "coordinator.replica_rejoin_timeout_s": Observer(
        "the dispatchers' setting",
        lambda r: one(d.rejoin_timeout_s for d in r.training.dispatchers),
    ),
    "coordinator.replica_stall_timeout_s": Observer(
        "the dispatchers' setting", lambda r: one(d.stall_timeout_s for d in r.training.dispatchers)
    ),
    "coordinator.service_wait_s": Observer(
        "the dispatchers' setting", lambda r: one(d.service_wait_s for d in r.training.dispatchers)
    ),
    "coordinator.progress": Observer(
        "progress lines on stderr", lambda r: bool(re.search(r"\] \d+/\d+ reward", r.stderr))
    ),
    "coordinator.loggers": Observer("sinks whose files the resumed run wrote", _sinks),
    "coordinator.eval.sets": Observer(
        "the sets the resumed run evaluated (eval.jsonl), as configured", _eval_sets
    ),
    "coordinator.eval.every": Observer(
        "steps between the resumed run's evaluations",
        lambda r: _gaps(sorted({e["step"] for e in r.evaluations()})),
    ),
    "coordinator.eval.at_end": Observer(
        "the last step was evaluated (every=4 leaves step 9 to at_end)",
        lambda r: any(e["step"] == r.training.config.num_steps for e in r.evaluations()),
    ),
    "coordinator.eval.k": Observer(
        "n of the evaluation requests", lambda r: one(p.n for _, p in r.eval_requests())
    ),
    "coordinator.eval.sampling.temperature": _eval_sampling("temperature"),
    "coordinator.eval.sampling.top_p": _eval_sampling("top_p"),
    "coordinator.eval.sampling.top_k": _eval_sampling("top_k"),
    "coordinator.eval.sampling.max_new_tokens": _eval_sampling("max_new_tokens"),
    "coordinator.eval.prompts_per_request": Observer(
        "the largest evaluation request (prompts)",
        lambda r: max(n for n, _ in r.eval_requests()),
    ),
}
"""Coordinator keys, read from the resumed run of this matrix."""

_IN_PROCESS = "the matrix's services are in process: no gRPC channel, no socket"
NOT_OBSERVED: dict[str, str] = {
    "coordinator.multi_turn.env_concurrency": (
        "how many environment steps of one turn run at once, not what any of them does "
        "(test_episodes_concurrency.py: a turn's steps run together, up to the bound)"
    ),
    "coordinator.eval.before_training": (
        "acts at step 0 only, which a resumed run never starts at (test_evaluation.py: a "
        "fresh run evaluates step 0)"
    ),
    "coordinator.eval.pass_threshold": (
        "moves which scores the metrics count as passing, not anything a run does: "
        "test_eval_metrics.py checks the metrics against it"
    ),
    "coordinator.eval.timeout_s": (
        "bounds an evaluation that hangs, which none here does (test_evaluation.py: one "
        "that hangs is given up at its deadline)"
    ),
    "coordinator.max_prompt_bytes": (
        "read where the coordinator loads its dataset (run.load_dataset), before any job: "
        "a row over it fails the load, so a resumed job that runs has the same rows"
    ),
    "coordinator.rollout_addresses": f"where run.py connects its clients; {_IN_PROCESS}",
    "coordinator.reward_address": f"where run.py connects its clients; {_IN_PROCESS}",
    "coordinator.learner_address": f"where run.py connects its clients; {_IN_PROCESS}",
    "coordinator.environment_address": f"where run.py connects its clients; {_IN_PROCESS}",
    "coordinator.channel.*": f"the gRPC clients' settings (run.py); {_IN_PROCESS}",
    "coordinator.server.*": f"the control API's gRPC server (run.py); {_IN_PROCESS}",
    "learner.moe_router_replay": (
        "needs a mixture-of-experts model and a rollout reporting its routing (vllm): the "
        "tiny model is dense, and the learner refuses the key for it at start"
    ),
    "learner.topology.device": "cuda: the default suite runs where there may be no GPU",
    "learner.topology.nproc_per_node": (
        "another world size needs torchrun's ranks; the resharded resume is "
        "tests/integration/test_fsdp_train_state.py"
    ),
    "learner.topology.critic_nproc_per_node": (
        "critic ranks need torchrun's ranks; the split/co-located resume is "
        "tests/integration/test_critic_ranks.py"
    ),
    "learner.topology.devices": "the learner processes' CUDA_VISIBLE_DEVICES (launcher): GPUs",
    "learner.topology.critic_devices": "the critic ranks' CUDA_VISIBLE_DEVICES (launcher): GPUs",
    "learner.topology.nnodes": "torchrun's rendezvous over several hosts (launcher)",
    "learner.topology.node_rank": "torchrun's rendezvous over several hosts (launcher)",
    "learner.topology.rdzv_endpoint": "torchrun's rendezvous over several hosts (launcher)",
    "learner.topology.local_addr": "torchrun's rendezvous over several hosts (launcher)",
    "learner.server.*": "the learner's gRPC server (its __main__); the twin serves no socket",
    "learner.memory.cpu_offload": (
        "FSDP2's CPUOffloadPolicy, set when sharding over 2+ ranks; a single CPU process "
        "has nowhere else to keep its state"
    ),
    "rollout.*": "the rollout service's process settings: its engine is not the twin's",
    "reward.*": (
        "the reward service's process settings (workers, bounds, server, reward models), read "
        "when it starts; its rule scorers' format_score is observed on the twins"
    ),
    "environment.*": "the environment service's process settings, read when it starts",
    "weight_sync.*": "the transport between learner and rollout processes",
    "deploy.*": "the launcher's settings",
    **{  # every tinker key but the refused tinker.enabled
        f"tinker.{f.name}": (
            "a setting of the Tinker-compatible service, read when it starts; an RL job never "
            "starts it (tests/e2e/test_tinker_launch.py resumes one)"
        )
        for f in fields(TinkerConfig)
        if f.name != "enabled"
    },
}
"""Accepted keys whose effect no in-process resume shows, each with why (``section.*``: every
key under it; the sections the matrix leaves out are the stateless services' settings)."""


@pytest.fixture(scope="module")
def table(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ObservedTable]:
    observed = ObservedTable("resume matrix (fake services): coordinator keys after resume")
    yield observed
    observed.report(tmp_path_factory.mktemp("resume_matrix") / "coordinator_keys.txt")


def _services(root: Path) -> tuple[Services, AheadFakeLearner, list[FakeRollout]]:
    rollouts = [FakeRollout() for _ in range(2)]
    learner = AheadFakeLearner(rollouts, root)
    svc = Services(
        rollouts, FakeReward(), learner, ["r0", "r1"], decode=lambda ids: "".join(map(str, ids))
    )
    return svc, learner, rollouts


def _job(
    job: JobConfig, run_dir: Path, resume: bool
) -> tuple[TrainingJob, AheadFakeLearner, list[FakeRollout]]:
    svc, learner, rollouts = _services(run_dir / "checkpoints")
    training = TrainingJob(
        job.coordinator,
        svc,
        records(NUM_ROWS),
        run_dir,
        resume=resume,
        checkpoint_root=run_dir / "checkpoints",
        resolved_config=asdict(job),
        eval_sets=[EvalSet(s.name, records(EVAL_PROMPTS)) for s in job.coordinator.eval.sets],
    )
    return training, learner, rollouts


@pytest.fixture(scope="module")
def crashed_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run_dir = tmp_path_factory.mktemp("crashed")
    training, learner, _ = _job(load_job_config(None, BASE), run_dir, resume=False)
    learner.fail_at_step = CRASH_STEP
    with pytest.raises(Unavailable):
        training.run()
    state = json.loads((run_dir / "checkpoints/step_00000004/coordinator.json").read_text())
    assert state["pending"], "the resume should have prompts to regenerate"
    manifest = json.loads((run_dir / "checkpoints/step_00000004/MANIFEST.json").read_text())
    assert "config.json" in manifest["files"]  # the config is verified with the checkpoint
    return run_dir


def changed(key: str, changes: Iterable[Change]) -> bool:
    """Whether ``key`` itself (``section.*``: a key under it) is among ``changes``."""
    if key.endswith(".*"):
        return any(c.key.startswith(key[:-1]) for c in changes)
    return any(c.key == key for c in changes)


@pytest.mark.parametrize("case", sorted(CHANGES))
def test_resume_with_one_change(
    case: str,
    crashed_run: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    table: ObservedTable,
) -> None:
    run_dir = tmp_path / "run"
    shutil.copytree(crashed_run, run_dir)
    old = load_job_config(None, BASE)
    new = load_job_config(None, (*BASE, *CHANGES[case]))
    changes = compare(asdict(old), asdict(new)).changes
    key = case.rstrip("+")
    assert changed(key, changes), f"{key} is not among the changes: {changes}"
    training, learner, rollouts = _job(new, run_dir, resume=True)
    refused = [c for c in changes if c.rule.policy is Policy.REFUSE]
    if refused:
        with pytest.raises(ResumeRefused) as err:
            training.run()
        message = str(err.value)
        assert "\n" not in message
        assert all(f"{c.key} {c.old!r} -> {c.new!r}" in message for c in refused)
        assert learner.version == 0, "refused after the learner's state was loaded"
        return
    capsys.readouterr()
    summary = training.run()
    cfg = new.coordinator
    assert summary.resumed_from_step == 4 and summary.num_steps == cfg.num_steps
    per_step = {s: 4 for s in range(1, 5)} | {
        s: cfg.prompts_per_step for s in range(5, cfg.num_steps + 1)
    }
    audit(run_dir, cfg.num_steps, per_step)
    resumed = Resumed(training, learner, rollouts, run_dir, capsys.readouterr().err, 4)
    assert key in OBSERVERS or key in TWIN_OBSERVERS or reason(key), f"{key}: not observed"
    for c in (c for c in changes if c.key in OBSERVERS):
        value = OBSERVERS[c.key].read(resumed)
        table.add(case, c.key, c.new, value, OBSERVERS[c.key].source)
        assert value == c.new, f"{c.key}: resumed with {c.new!r}, the run used {value!r}"


def reason(key: str) -> str | None:
    """Why ``key`` is not observed: its own entry in ``NOT_OBSERVED``, else its nearest
    ``prefix.*`` one; None when it has none."""
    parts = key.split(".")
    for end in range(len(parts), 0, -1):
        name = ".".join(parts[:end]) + ("" if end == len(parts) else ".*")
        if name in NOT_OBSERVED:
            return NOT_OBSERVED[name]
    return None


ONLY_DEFAULT = {"learner.lora.dropout"}
"""Keys whose only valid value is the default (validation refuses any other): no change to
resume with."""


def test_every_key_is_in_the_matrix() -> None:
    """Every key of the coordinator and learner sections has a change in ``CHANGES``, and
    every key a resume accepts, of any section, is observed after a resume (here or on the
    real learner) or has a reason not to be: a new key enters with one of them."""
    keys = flatten(asdict(JobConfig()))
    covered = {k.rstrip("+") for k in CHANGES} | ONLY_DEFAULT
    for key in keys:
        section, _, rest = key.partition(".")
        if section in ("coordinator", "learner"):
            sub = f"{section}.{rest.split('.')[0]}.*"
            assert key in covered or sub in covered, f"add a change of {key} to CHANGES"
        if rule_for(key).policy is Policy.REFUSE:
            continue
        observed = [key in OBSERVERS, key in TWIN_OBSERVERS]
        # A key observed by name needs no reason (its section's ``.*`` reason is for the rest).
        ways = [*observed, not any(observed) and reason(key) is not None]
        assert sum(ways) == 1, (
            f"{key}: accepted on resume, so it needs exactly one of an observer (OBSERVERS "
            "here, or tests/fault/test_resume_matrix_twins.py's) or a reason in NOT_OBSERVED"
        )
    for name in (*OBSERVERS, *TWIN_OBSERVERS, *NOT_OBSERVED):
        under = [k for k in keys if k == name or (name.endswith(".*") and k.startswith(name[:-1]))]
        assert under, f"{name}: no such key any more"
        assert all(rule_for(k).policy is not Policy.REFUSE for k in under), f"{name}: refused"
