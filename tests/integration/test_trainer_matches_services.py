"""One schedule: ``RLTrainer`` (in-process twins) and the services (gRPC servers, the weights
streamed over gRPC) give the same completions, rewards and losses for the same seeded steps.

Two steps each: step 2 samples from the weights step 1 published, so it also checks that
both weight paths deliver the same policy. Servers run in this process on loopback ports.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from hybridflow import RLTrainer
from hybridflow.coordinator.config import CoordinatorConfig, SamplingConfig
from hybridflow.coordinator.job import TrainingJob
from hybridflow.coordinator.services import Services
from hybridflow.rpc.config import ServerConfig
from hybridflow.rpc.server import start_server
from hybridflow.testing import mock_reward
from hybridflow.types import SamplingParams
from tests.helpers import MIB, start_learner_server, start_rollout_server

PROMPTS = [["3+4=", "1+1=", "9+8=", "2+7="], ["5+5=", "0+6=", "4+4=", "7+1="]]
LEARNER = {"optimizer": {"lr": 2e-3}, "update": {"micro_batch_size": 16}}
GROUP, MAX_NEW = 4, 4
COMPARED = [
    "critic/score/mean",
    "response_length/mean",
    "actor/pg_loss",
    "actor/entropy",
    "actor/grad_norm",
    "critic/advantages/mean",
]


def start_reward_server():
    from hybridflow.services.reward.scorers import RewardScorer
    from hybridflow.services.reward.servicer import SERVICE_NAME, RewardServicer
    from hybridflow.v1 import reward_pb2_grpc

    scorer = RewardScorer()
    scorer.registry.register(
        "rltrainer", lambda response, _truth, extra: mock_reward(extra["prompt"], response)
    )
    servicer = RewardServicer(scorer)
    return start_server(
        ServerConfig(max_message_bytes=4 * MIB),
        lambda s: reward_pb2_grpc.add_RewardServiceServicer_to_server(servicer, s),
        [SERVICE_NAME],
    )


def service_steps(model: Path, run_dir: Path, algo: str) -> list[dict[str, float]]:
    """The prompts of ``PROMPTS`` as steps of a service job, seeded as RLTrainer seeds them."""
    from transformers import AutoTokenizer

    from hybridflow.data.datasets import PromptRecord
    from hybridflow.services.learner.client import GrpcLearnerClient
    from hybridflow.services.reward.client import GrpcRewardClient
    from hybridflow.services.rollout.client import GrpcRolloutClient

    tokenizer = AutoTokenizer.from_pretrained(str(model))
    servers = [
        start_rollout_server(model, seed=0, max_bytes=4 * MIB)[0],
        start_learner_server(model, max_bytes=4 * MIB, algorithm=algo, seed=0, **LEARNER)[0],
        start_reward_server(),
    ]
    rollout_addr, learner_addr, reward_addr = (s.address for s in servers)
    clients = [
        GrpcRolloutClient(rollout_addr),
        GrpcRewardClient(reward_addr),
        GrpcLearnerClient(learner_addr),
    ]
    services = Services(
        [clients[0]],
        clients[1],
        clients[2],
        [rollout_addr],
        decode=lambda ids: str(tokenizer.decode(ids, skip_special_tokens=True)),
    )
    state, out = None, []
    try:
        for step, prompts in enumerate(PROMPTS, start=1):
            records = [
                PromptRecord(
                    p,
                    tokenizer.encode(p, add_special_tokens=False),
                    "rltrainer",
                    None,
                    {"prompt": p},
                    i,
                )
                for i, p in enumerate(prompts)
            ]
            cfg = CoordinatorConfig(
                seed=step - 1,
                num_steps=step,
                prompts_per_step=len(prompts),
                group_size=GROUP,
                sampling=SamplingConfig(temperature=1.0, max_new_tokens=MAX_NEW),
                save_checkpoint=False,
                checkpoint_every=0,
                progress=False,
            )
            job = TrainingJob(cfg, services, records, run_dir, continue_from=state)
            job.run()
            state = job.state
            out.append(job.last_metrics)
    finally:
        for client in clients:
            client.close()  # type: ignore[attr-defined]
        for server in servers:
            server.stop(0)
    return out


@pytest.mark.parametrize("algo", ["grpo", "ppo"])
def test_rltrainer_and_services_give_the_same_steps(tiny_model_path, tmp_path, algo):
    trainer = RLTrainer(
        actor=tiny_model_path,
        reward_fn=mock_reward,
        algo=algo,
        group_size=GROUP,
        sampling=SamplingParams(temperature=1.0, max_new_tokens=MAX_NEW),
        seed=0,
        **LEARNER,
    )
    local = [trainer.step(prompts).metrics for prompts in PROMPTS]
    trainer.close()
    remote = service_steps(tiny_model_path, tmp_path, algo)
    for step, (a, b) in enumerate(zip(local, remote, strict=True), start=1):
        for key in COMPARED:
            assert a[key] == pytest.approx(b[key], rel=1e-5, abs=1e-6), (step, key)
        assert a["training/policy_version"] == b["training/policy_version"] == step
    # The steps learned something different from each other: the comparison is not vacuous.
    assert local[0]["actor/pg_loss"] != local[1]["actor/pg_loss"]
