"""Every numeric config field has a range: out-of-range values are refused at load, all of a
section's at once, naming the key (finding 9: num_threads -3 and health_timeout_s -5 passed)."""

import pytest

from hybridflow.config.loader import ConfigError
from hybridflow.job_config import load_job_config

BAD = [
    ("rollout.num_threads", "-3"),
    ("rollout.seed", "-1"),
    ("rollout.kv_cache_gib", "0"),
    ("rollout.max_model_len", "-1"),
    ("rollout.prompts_per_message", "0"),
    ("rollout.server.max_workers", "0"),
    ("rollout.server.grace_s", "-1"),
    ("reward.server.max_workers", "0"),
    ("reward.score_workers", "0"),
    ("reward.max_batch_size", "0"),
    ("reward.format_score", ".nan"),
    ("learner.server.max_workers", "0"),
    ("learner.update.micro_batch_size", "0"),
    ("learner.seed", "-2"),
    ("learner.topology.nproc_per_node", "0"),
    ("coordinator.server.max_workers", "0"),
    ("coordinator.channel.retries", "-1"),
    ("coordinator.channel.initial_backoff_s", "-0.1"),
    ("coordinator.channel.max_message_bytes", "1"),
    ("coordinator.channel.timeout_s", ".inf"),
    ("coordinator.max_prompt_tokens", "0"),
    ("coordinator.max_prompt_bytes", "0"),
    ("coordinator.seed", "-1"),
    ("coordinator.sampling.max_new_tokens", "0"),
    ("coordinator.sampling.top_p", "0"),
    ("coordinator.sampling.top_k", "-1"),
    ("weight_sync.timeout_s", "-1"),
    ("weight_sync.bucket_bytes", "1"),
    ("deploy.health_timeout_s", "-5"),
]


@pytest.mark.parametrize(("key", "value"), BAD)
def test_out_of_range_value_is_refused_naming_the_key(key, value):
    with pytest.raises(ConfigError) as info:
        load_job_config(None, [f"{key}={value}"])
    # Shared sections (server, channel) name themselves relative to their owner.
    assert key.split(".", 1)[-1] in str(info.value) or key in str(info.value)
    assert f"got {value.lstrip('.')}" in str(info.value)


def test_in_range_edges_are_accepted():
    job = load_job_config(
        None,
        [
            "rollout.server.max_workers=1",
            "coordinator.channel.retries=0",
            "coordinator.sampling.top_p=1.0",
            "coordinator.sampling.top_k=0",
            "deploy.health_timeout_s=0.5",
            "rollout.max_model_len=0",
        ],
    )
    assert job.rollout.server.max_workers == 1


def test_all_range_problems_of_a_section_are_reported_together():
    with pytest.raises(ConfigError) as info:
        load_job_config(None, ["rollout.num_threads=-3", "rollout.replicas=0", "rollout.seed=-1"])
    lines = str(info.value).splitlines()
    assert len(lines) == 3
    assert any(line.endswith("rollout.num_threads: must be >= 1, got -3") for line in lines)
    assert any("rollout.replicas: must be >= 1, got 0" in line for line in lines)
