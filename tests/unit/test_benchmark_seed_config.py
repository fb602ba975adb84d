"""The seed guide's §3.2 benchmark config mapped onto a suite config, field by field."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from benchmarks.common.runner import main
from benchmarks.common.seed_config import (
    SHAREGPT_SAMPLE,
    Machine,
    SeedConfig,
    SeedModel,
    SeedResources,
    SeedWorkload,
    is_seed_layout,
    translate_seed_config,
)
from hybridflow.config.loader import ConfigError, load_config

REPO = Path(__file__).resolve().parents[2]
SEED_FILE = REPO / "benchmarks" / "throughput" / "seed_config.yaml"
TWO_CPUS = Machine(num_cpus=2)


def overrides_of(seed: SeedConfig, machine: Machine = TWO_CPUS, **kwargs: Any) -> dict[str, str]:
    config = translate_seed_config(seed, machine, **kwargs).config
    return dict(o.split("=", 1) for o in config.overrides)


def notices_of(seed: SeedConfig, machine: Machine = TWO_CPUS, **kwargs: Any) -> list[str]:
    return translate_seed_config(seed, machine, **kwargs).notices


def test_the_shipped_seed_file_on_two_cpus() -> None:
    seed = load_config(SeedConfig, SEED_FILE)
    assert seed == SeedConfig(
        SeedModel("meta-llama/Llama-3-8b-instruct", 1024, 4),
        SeedResources(actor_gpus=4, critic_gpus=2, reward_gpus=2),
        "fsdp",
        SeedWorkload(100, "sharegpt"),
    )
    translated = translate_seed_config(seed, TWO_CPUS)
    assert translated.config.overrides == [
        "model=builtin:tiny",
        f"coordinator.data=sharegpt:{SHAREGPT_SAMPLE}",
        "coordinator.num_steps=20",
        "coordinator.prompts_per_step=8",  # 4 per device x 2 learner ranks
        "coordinator.max_prompt_tokens=64",  # 128 positions split in halves
        "coordinator.sampling.max_new_tokens=64",
        "learner.algorithm=ppo",
        "learner.update.micro_batch_size=4",
        "learner.topology.nproc_per_node=2",
        "rollout.replicas=2",
        "coordinator.save_checkpoint=false",
        "coordinator.progress=false",
    ]
    (variant,) = translated.config.variants
    assert (variant.name, variant.overrides) == (
        "async",
        ["coordinator.max_staleness=1", "learner.loss.off_policy=tis"],
    )
    cfg = translated.config
    assert (cfg.suite, cfg.job, cfg.repeats, cfg.warmup_steps, cfg.profile_steps) == (
        "throughput", "deploy/configs/quickstart.yaml", 1, 3, 10,
    )  # fmt: skip
    assert translated.notices == [
        "seed config: model.name=meta-llama/Llama-3-8b-instruct: hub models are not "
        "downloaded here, using builtin:tiny",
        "seed config: model.seq_length=1024: builtin:tiny holds 128 positions, using 64 prompt "
        "+ 64 response tokens (coordinator.max_prompt_tokens, coordinator.sampling.max_new_tokens)",
        "seed config: resources.actor_gpus=4: no GPU here, using 2 CPU learner ranks and 2 "
        "rollout replicas",
        "seed config: resources.critic_gpus=2: PPO's critic trains on the learner ranks (no "
        "devices of its own)",
        "seed config: resources.reward_gpus=2: the reward service has no device of its own yet "
        "(rule scorers on CPU)",
        "seed config: workload.num_episodes=100: capped at 20 steps to fit this machine",
        "seed config: workload.prompt_dataset=sharegpt: ShareGPT is not downloaded here, using "
        "the 64-conversation sample benchmarks/data/sharegpt_sample.json",
    ]
    assert all("\n" not in line for line in translated.notices)


def test_without_scaling_counts_and_steps_are_taken_as_written() -> None:
    seed = load_config(SeedConfig, SEED_FILE)
    got = overrides_of(seed, scale_to_machine=False)
    assert got["learner.topology.nproc_per_node"] == got["rollout.replicas"] == "4"
    assert got["coordinator.prompts_per_step"] == "16"
    assert got["coordinator.num_steps"] == "100"
    assert not any("num_episodes" in n for n in notices_of(seed, scale_to_machine=False))
    # Steps under the cap are kept; the cap itself is an argument.
    assert overrides_of(seed, max_steps=7)["coordinator.num_steps"] == "7"
    assert "capped at 7 steps" in notices_of(seed, max_steps=7)[5]


def test_actor_gpus_are_capped_at_the_cpus_and_gpus_are_named_as_unmapped() -> None:
    seed = SeedConfig(resources=SeedResources(actor_gpus=3))
    assert overrides_of(seed, Machine(num_cpus=8))["learner.topology.nproc_per_node"] == "3"
    assert overrides_of(seed, Machine(num_cpus=1))["rollout.replicas"] == "1"
    (line,) = [n for n in notices_of(seed, Machine(8, num_gpus=1)) if "actor_gpus" in n]
    assert line == (
        "seed config: resources.actor_gpus=3: GPU placement is not mapped, using 3 CPU learner "
        "ranks and 3 rollout replicas"
    )


def test_model_names_and_sequence_split(tmp_path: Path) -> None:
    short = SeedConfig(model=SeedModel("builtin:tiny", seq_length=101, batch_size_per_gpu=2))
    got = overrides_of(short)
    assert got["model"] == "builtin:tiny"
    assert (got["coordinator.max_prompt_tokens"], got["coordinator.sampling.max_new_tokens"]) == (
        "50", "51",
    )  # fmt: skip
    assert (
        got["learner.update.micro_batch_size"] == "2" and got["coordinator.prompts_per_step"] == "2"
    )
    assert notices_of(short)[0] == (
        "seed config: model.seq_length=101: using 50 prompt + 51 response tokens "
        "(coordinator.max_prompt_tokens, coordinator.sampling.max_new_tokens)"
    )
    local = tmp_path / "ckpt"
    local.mkdir()
    (local / "config.json").write_text(json.dumps({"max_position_embeddings": 512}))
    got = overrides_of(SeedConfig(model=SeedModel(str(local), seq_length=1024)))
    assert got["model"] == str(local)
    assert got["coordinator.max_prompt_tokens"] == "256"


def test_algorithm_reward_and_strategy_notices() -> None:
    seed = SeedConfig(resources=SeedResources(critic_gpus=0, reward_gpus=0))
    assert overrides_of(seed)["learner.algorithm"] == "grpo"
    assert not any("critic" in n or "reward_gpus" in n for n in notices_of(seed))
    megatron = SeedConfig(parallel_strategy="megatron")
    assert "seed config: parallel_strategy=megatron: not honoured, the learner runs FSDP2" in (
        notices_of(megatron)
    )
    assert not any(
        "parallel_strategy" in n for n in notices_of(SeedConfig(parallel_strategy="FSDP2"))
    )


def test_prompt_datasets(tmp_path: Path) -> None:
    def data(name: str) -> str:
        return overrides_of(SeedConfig(workload=SeedWorkload(prompt_dataset=name)))[
            "coordinator.data"
        ]

    chats, rows = tmp_path / "chats.json", tmp_path / "rows.jsonl"
    chats.write_text("[]")
    rows.write_text("")
    assert data("builtin:arith") == "builtin:arith"
    assert data(f"sharegpt:{rows}") == f"sharegpt:{rows}"
    assert data(str(chats)) == f"sharegpt:{chats}"  # a JSON list: ShareGPT's own format
    assert data(str(rows)) == str(rows)  # JSONL: verl rows
    assert data("openai/gsm8k") == "builtin:arith"
    assert notices_of(SeedConfig(workload=SeedWorkload(prompt_dataset="openai/gsm8k")))[-1] == (
        "seed config: workload.prompt_dataset=openai/gsm8k: hub datasets are not downloaded "
        "here, using builtin:arith"
    )


def test_layout_detection_and_strict_loading(tmp_path: Path) -> None:
    assert is_seed_layout(yaml.safe_load(SEED_FILE.read_text()))
    assert is_seed_layout({"workload": {"num_episodes": 3}})
    ours = yaml.safe_load((REPO / "benchmarks" / "throughput" / "config.yaml").read_text())
    assert not is_seed_layout(ours) and not is_seed_layout({"model": "builtin:tiny"})
    bad = tmp_path / "bad.yaml"
    bad.write_text("model: {name: x, seq_len: 5}\n")
    with pytest.raises(ConfigError, match="unknown key 'model.seq_len'"):
        load_config(SeedConfig, bad)
    bad.write_text("resources: {actor_gpus: 0}\n")
    with pytest.raises(ConfigError, match="resources.actor_gpus must be >= 1, got 0"):
        load_config(SeedConfig, bad)


def test_runner_refuses_a_bad_seed_file_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "seed.yaml"
    bad.write_text("model: {name: x}\nworkload: {episodes: 3}\n")
    assert main("unused.yaml", lambda figures: {}, ["--config", str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("config error: ")
    assert "unknown key 'workload.episodes'" in err
