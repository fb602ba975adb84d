"""The resume matrix over the schedule (fake services): for every key of the coordinator and
learner sections, a resume with that key changed either is refused at once naming the key,
or completes with the exactly-once audit clean and the new value in effect where the
schedule shows it. The run being resumed crashed at step 6 with prompts in flight
(max_staleness 1), so the resume has work to regenerate. That the learner applies its keys
(lr above all) is tests/fault/test_resume_changes.py, on the real learner."""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Iterable
from dataclasses import asdict
from pathlib import Path

import pytest

from hybridflow.coordinator.checkpoint_config import ResumeRefused
from hybridflow.coordinator.job import TrainingJob
from hybridflow.coordinator.resume_policy import Change, Policy, compare, flatten
from hybridflow.coordinator.services import Services
from hybridflow.job_config import JobConfig, load_job_config
from tests.fault.harness import audit

from .fakes import FakeLearner, FakeReward, FakeRollout, Unavailable, records

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

# One valid change per key (several keys where one needs another to validate); the
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
    "coordinator.dynamic_sampling": ("coordinator.dynamic_sampling=true",),
    "coordinator.dynamic_sampling_max_rounds": ("coordinator.dynamic_sampling_max_rounds=3",),
    "coordinator.multi_turn.env": ("coordinator.multi_turn.env=m:Env",),
    "coordinator.multi_turn.max_turns": ("coordinator.multi_turn.max_turns=2",),
    "coordinator.multi_turn.max_total_tokens": ("coordinator.multi_turn.max_total_tokens=64",),
    "coordinator.rollout_addresses": ("coordinator.rollout_addresses=[h:1]",),
    "coordinator.reward_address": ("coordinator.reward_address=h:2",),
    "coordinator.learner_address": ("coordinator.learner_address=h:3",),
    "coordinator.environment_address": ("coordinator.environment_address=h:4",),
    "coordinator.channel.*": ("coordinator.channel.timeout_s=30",),
    "coordinator.server.*": ("coordinator.server.max_workers=4",),
    "coordinator.save_checkpoint": ("coordinator.save_checkpoint=false",),
    "coordinator.checkpoint_every": ("coordinator.checkpoint_every=3",),
    "coordinator.keep_checkpoints": ("coordinator.keep_checkpoints=3",),
    "coordinator.replica_rejoin_timeout_s": ("coordinator.replica_rejoin_timeout_s=10",),
    "coordinator.replica_stall_timeout_s": ("coordinator.replica_stall_timeout_s=10",),
    "coordinator.service_wait_s": ("coordinator.service_wait_s=10",),
    "coordinator.progress": ("coordinator.progress=true",),
    "coordinator.loggers": ("coordinator.loggers=[]",),
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
    "learner.memory.max_tokens_per_micro_batch": ("learner.memory.max_tokens_per_micro_batch=256",),
    "learner.memory.logprob_chunk_tokens": ("learner.memory.logprob_chunk_tokens=64",),
    "learner.memory.cpu_offload": ("learner.memory.cpu_offload=true",),
    "learner.lora.rank": ("learner.lora.rank=8", "learner.algorithm=grpo"),
    "learner.lora.alpha": ("learner.lora.alpha=8",),
    "learner.lora.target_modules": ("learner.lora.target_modules=[q_proj]",),
    "learner.checkpoint_dir": ("learner.checkpoint_dir=/elsewhere",),
}


def _services(root: Path) -> tuple[Services, FakeLearner]:
    rollouts = [FakeRollout() for _ in range(2)]
    learner = FakeLearner(rollouts, root)
    svc = Services(
        rollouts, FakeReward(), learner, ["r0", "r1"], decode=lambda ids: "".join(map(str, ids))
    )
    return svc, learner


def _job(job: JobConfig, run_dir: Path, resume: bool) -> tuple[TrainingJob, FakeLearner]:
    svc, learner = _services(run_dir / "checkpoints")
    training = TrainingJob(
        job.coordinator,
        svc,
        records(NUM_ROWS),
        run_dir,
        resume=resume,
        checkpoint_root=run_dir / "checkpoints",
        resolved_config=asdict(job),
    )
    return training, learner


@pytest.fixture(scope="module")
def crashed_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run_dir = tmp_path_factory.mktemp("crashed")
    training, learner = _job(load_job_config(None, BASE), run_dir, resume=False)
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
def test_resume_with_one_change(case: str, crashed_run: Path, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    shutil.copytree(crashed_run, run_dir)
    old = load_job_config(None, BASE)
    new = load_job_config(None, (*BASE, *CHANGES[case]))
    changes = compare(asdict(old), asdict(new)).changes
    key = case.rstrip("+")
    assert changed(key, changes), f"{key} is not among the changes: {changes}"
    training, learner = _job(new, run_dir, resume=True)
    refused = [c for c in changes if c.rule.policy is Policy.REFUSE]
    if refused:
        start = time.monotonic()
        with pytest.raises(ResumeRefused) as err:
            training.run()
        assert time.monotonic() - start < 1.0
        message = str(err.value)
        assert "\n" not in message
        assert all(f"{c.key} {c.old!r} -> {c.new!r}" in message for c in refused)
        assert learner.version == 0, "refused after the learner's state was loaded"
        return
    summary = training.run()
    cfg = new.coordinator
    assert summary.resumed_from_step == 4 and summary.num_steps == cfg.num_steps
    per_step = {s: 4 for s in range(1, 5)} | {
        s: cfg.prompts_per_step for s in range(5, cfg.num_steps + 1)
    }
    audit(run_dir, cfg.num_steps, per_step)
    resumed = learner.batches
    assert len(resumed) == cfg.num_steps - 4
    assert all(len(b) == cfg.prompts_per_step * cfg.group_size for b in resumed)
    saved = json.loads((run_dir / f"checkpoints/step_{cfg.num_steps:08d}/config.json").read_text())
    assert flatten(saved) == flatten(json.loads(json.dumps(asdict(new))))  # the new config


ONLY_DEFAULT = {"learner.lora.dropout"}
"""Keys whose only valid value is the default (validation refuses any other): no change to
resume with."""


def test_every_key_is_in_the_matrix() -> None:
    covered = {k.rstrip("+") for k in CHANGES} | ONLY_DEFAULT
    for key in flatten(asdict(JobConfig())):
        section, _, rest = key.partition(".")
        if section in ("coordinator", "learner"):
            sub = f"{section}.{rest.split('.')[0]}.*"
            assert key in covered or sub in covered, f"add a change of {key} to CHANGES"
