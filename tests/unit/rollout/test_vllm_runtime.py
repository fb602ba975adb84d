"""Watching vLLM's worker processes (``vllm_runtime.VLLMRuntime``) without vLLM: a fake
engine core whose workers are real child processes this test starts and kills. A worker
that dies makes the runtime dead at once, naming it, with the death callback called exactly
once (also when it is registered after the death); a close ends the workers with no death.
The same path with a real vLLM replica: ``tests/fault/test_vllm_replica_exit.py``."""

from __future__ import annotations

import multiprocessing
import threading
from collections.abc import Iterator
from multiprocessing.connection import Connection
from types import SimpleNamespace
from typing import Any

import pytest

from hybridflow.errors import Unavailable
from hybridflow.services.rollout.vllm_runtime import VLLMRuntime

DEADLINE_S = 30.0


def _wait_for_end(conn: Connection) -> None:
    try:
        conn.recv()
    except EOFError:
        pass


@pytest.fixture()
def workers() -> Iterator[list[Any]]:
    """Two child processes that live until killed or their pipe closes."""
    ctx = multiprocessing.get_context("fork")
    pipes = [ctx.Pipe(duplex=False) for _ in range(2)]
    procs = [
        ctx.Process(target=_wait_for_end, args=(reader,), name=f"VllmWorker-{i}")
        for i, (reader, _writer) in enumerate(pipes)
    ]
    for proc in procs:
        proc.start()
    yield procs
    for proc in procs:
        if proc.is_alive():
            proc.kill()
        proc.join(DEADLINE_S)


def _fake_core(procs: list[Any], rpc_calls: list[str]) -> Any:
    """What the runtime reads of vLLM's LLMEngine: the workers, collective_rpc, shutdown."""

    def shutdown() -> None:
        for proc in procs:
            proc.kill()
            proc.join(DEADLINE_S)

    def collective_rpc(method: str, args: tuple[Any, ...] = ()) -> list[Any]:
        rpc_calls.append(method)
        return [method for _ in procs]

    executor = SimpleNamespace(workers=[SimpleNamespace(proc=p) for p in procs])
    return SimpleNamespace(
        engine_core=SimpleNamespace(
            engine_core=SimpleNamespace(model_executor=executor), shutdown=shutdown
        ),
        collective_rpc=collective_rpc,
    )


def test_a_worker_that_dies_makes_the_runtime_dead_once_naming_it(workers) -> None:
    rpc_calls: list[str] = []
    runtime = VLLMRuntime(_fake_core(workers, rpc_calls))
    assert runtime.dead_reason is None and runtime.rpc("hf_ping") == ["hf_ping", "hf_ping"]
    reasons: list[str] = []
    called = threading.Event()

    def on_dead(reason: str) -> None:
        reasons.append(reason)
        called.set()

    runtime.on_dead(on_dead)
    workers[1].kill()
    assert called.wait(DEADLINE_S)
    assert len(reasons) == 1 and runtime.dead_reason == reasons[0]
    assert f"VllmWorker-1 (pid {workers[1].pid}) died with exit code -9" in reasons[0]
    with pytest.raises(Unavailable, match="VllmWorker-1"):
        runtime.check_alive()
    with pytest.raises(Unavailable, match="VllmWorker-1"):
        runtime.rpc("hf_ping")
    assert rpc_calls == ["hf_ping"]  # a dead runtime's workers are not called
    late: list[str] = []
    runtime.on_dead(late.append)  # registered after the death: called at once
    assert late == reasons and len(reasons) == 1


def test_closing_ends_the_workers_without_a_death(workers) -> None:
    runtime = VLLMRuntime(_fake_core(workers, []))
    reasons: list[str] = []
    runtime.on_dead(reasons.append)
    runtime.close()
    assert not any(proc.is_alive() for proc in workers)
    watchers = [t for t in threading.enumerate() if t.name == "vllm-worker-watch"]
    for thread in watchers:
        thread.join(DEADLINE_S)
    assert not any(t.is_alive() for t in watchers)
    assert reasons == [] and runtime.dead_reason is None


def test_an_rpc_that_fails_while_alive_raises_its_own_error(workers) -> None:
    core = _fake_core(workers, [])

    def broken(method: str, args: tuple[Any, ...] = ()) -> list[Any]:
        raise RuntimeError(f"{method} failed")

    core.collective_rpc = broken
    runtime = VLLMRuntime(core)
    with pytest.raises(RuntimeError, match="hf_ping failed"):
        runtime.rpc("hf_ping")
