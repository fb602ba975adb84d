"""RLDataPipeline's stages become the job overrides deploy/launch.sh takes (no launching)."""

import json

import pytest

from hybridflow import RLDataPipeline


def seed_pipeline(gpus):
    """§1.1 of the seed, with our components."""
    pipeline = RLDataPipeline(gpus=gpus)
    pipeline.add_stage("generate", "builtin:tiny", num_gpus=4)
    pipeline.add_stage("reward", "rule", weight=0.5)
    pipeline.add_stage("reward", "builtin:tiny-rm", num_gpus=2, weight=0.5)
    pipeline.add_stage("train", "grpo", num_gpus=8)
    return pipeline


def components(overrides):
    [line] = [o for o in overrides if o.startswith("reward.components=")]
    return json.loads(line.partition("=")[2])


def test_seed_pipeline_on_a_gpu_machine_gives_each_role_its_own_gpus():
    pipeline = seed_pipeline(gpus=16)
    overrides = pipeline.overrides()
    assert overrides[:5] == [
        "model=builtin:tiny",
        "rollout.device=cuda",
        "rollout.tensor_parallel_size=1",
        "rollout.replicas=4",
        'rollout.devices=["0", "1", "2", "3"]',
    ]
    assert overrides[5:8] == [
        "learner.algorithm=grpo",
        "learner.topology.device=cuda",
        "learner.topology.nproc_per_node=8",
    ]
    assert 'learner.topology.devices=["4", "5", "6", "7", "8", "9", "10", "11"]' in overrides
    assert components(overrides) == [
        {"name": "rule", "weight": 0.5, "kind": "rule"},
        {"name": "rm", "weight": 0.5, "kind": "model", "model": "builtin:tiny-rm",
         "device": "cuda:12"},
    ]  # fmt: skip
    assert pipeline.notices == []


def test_more_gpus_asked_than_there_are_share_them_and_say_so():
    pipeline = seed_pipeline(gpus=8)
    overrides = pipeline.overrides()
    assert 'learner.topology.devices=["4", "5", "6", "7", "0", "1", "2", "3"]' in overrides
    assert components(overrides)[1]["device"] == "cuda:4"
    assert pipeline.notices == [
        "stages ask for 14 GPUs, this machine has 8: devices are shared between roles"
    ]


def test_seed_pipeline_without_gpus_runs_on_cpu_and_says_so():
    pipeline = seed_pipeline(gpus=0)
    overrides = pipeline.overrides()
    assert not any("cuda" in o for o in overrides)
    assert pipeline.notices == [
        "generate: num_gpus=4 but this machine has no GPU: runs on CPU",
        "train: num_gpus=8 but this machine has no GPU: runs on CPU",
        "reward: num_gpus=2 but this machine has no GPU: runs on CPU",
    ]


def test_tensor_parallel_replicas_critic_reference_and_settings():
    pipeline = RLDataPipeline(gpus=8)
    pipeline.add_stage("generate", "/ckpt", num_gpus=4, tensor_parallel_size=2, engine="vllm")
    pipeline.add_stage("train", {"lr": 1e-3, "micro_batch_size": 4}, num_gpus=2)
    pipeline.add_stage("critic", num_gpus=2, lr=5e-4)
    pipeline.add_stage("reference", kl_coef=0.01)
    pipeline.set("coordinator.num_steps", 7).set("coordinator.data", "builtin:arith")
    assert pipeline.overrides() == [
        "model=/ckpt",
        "rollout.engine=vllm",
        "rollout.device=cuda",
        "rollout.tensor_parallel_size=2",
        "rollout.replicas=2",
        'rollout.devices=["0,1", "2,3"]',
        "learner.topology.device=cuda",
        "learner.topology.nproc_per_node=2",
        'learner.topology.devices=["4", "5"]',
        "learner.optimizer.lr=0.001",
        "learner.update.micro_batch_size=4",
        "learner.algorithm=ppo",
        "learner.topology.critic_nproc_per_node=2",
        'learner.topology.critic_devices=["6", "7"]',
        "learner.critic.lr=0.0005",
        "learner.kl.use_reference=true",
        "learner.kl.coef=0.01",
        "coordinator.num_steps=7",
        "coordinator.data=builtin:arith",
    ]
    assert pipeline.notices == []


def test_critic_ranks_on_cpu_and_the_config_loader_takes_the_result():
    pipeline = RLDataPipeline(gpus=0)
    pipeline.add_stage("generate", "builtin:tiny").add_stage("train", "ppo")
    pipeline.add_stage("critic", num_processes=1)
    job = pipeline.to_config()
    assert job.learner.algorithm == "ppo" and job.learner.topology.critic_nproc_per_node == 1


def test_reward_stages_by_data_source_and_named():
    pipeline = RLDataPipeline(gpus=0)
    pipeline.add_stage("generate", "builtin:tiny").add_stage("train", "grpo")
    pipeline.add_stage("reward", "gsm8k", data_sources=["gsm8k"], name="math")
    pipeline.add_stage("reward", "rule", data_sources=["arith"])
    assert components(pipeline.overrides()) == [
        {"name": "math", "weight": 1.0, "data_sources": ["gsm8k"], "kind": "rule",
         "scorer": "gsm8k"},
        {"name": "rule", "weight": 1.0, "data_sources": ["arith"], "kind": "rule"},
    ]  # fmt: skip


def test_bad_declarations_are_refused_before_anything_runs():
    pipeline = RLDataPipeline()
    with pytest.raises(ValueError, match="kind must be one of"):
        pipeline.add_stage("evaluate", "x")
    with pytest.raises(ValueError, match="num_gpus must be an integer >= 0"):
        pipeline.add_stage("generate", "x", num_gpus=-1)
    pipeline.add_stage("generate", "builtin:tiny")
    with pytest.raises(ValueError, match="only one 'generate' stage"):
        pipeline.add_stage("generate", "builtin:tiny")
    with pytest.raises(ValueError, match="a 'train' stage is required"):
        pipeline.overrides()
    pipeline.add_stage("train", "sac")
    with pytest.raises(ValueError, match="train stage: component must be one of"):
        pipeline.overrides()
