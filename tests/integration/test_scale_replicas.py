"""A running job grows from one rollout replica to three and shrinks back to one, against real
services on loopback sockets: the learner (FSDP, weights over its torch.distributed groups,
every sync checked), three HF-engine rollout servers and a reward server, all in this process.

What it shows: an added replica gets a catch-up sync through a weight-sync group of its own
(the learner forms one group per replica, and never forms the first replica's again), serves
only after that, and generates; drained replicas get no more requests, and the learner closes
their groups at the next publish; every prompt is trained exactly once. The test waits for
states, never for a time."""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

from hybridflow.coordinator.config import CoordinatorConfig, SamplingConfig
from hybridflow.coordinator.control import JobControl
from hybridflow.coordinator.job import TrainingJob
from hybridflow.coordinator.services import Services
from hybridflow.weights.config import WeightSyncConfig
from tests.helpers import MIB, start_learner_server, start_rollout_server
from tests.integration.test_trainer_matches_services import start_reward_server

WAIT_S = 300.0
PROMPTS = ["3+4=", "1+1=", "9+8=", "2+7=", "5+5=", "0+6=", "4+4=", "7+1="]


class CountingRollout:
    """A replica's gRPC client that counts its Generate calls."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.calls = 0

    def generate(self, *args: Any, **kwargs: Any) -> Any:
        self.calls += 1
        return self.inner.generate(*args, **kwargs)

    def status(self, *args: Any, **kwargs: Any) -> Any:
        return self.inner.status(*args, **kwargs)

    def close(self) -> None:
        self.inner.close()


def _wait(what: str, done) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + WAIT_S
    while not done():
        assert time.monotonic() < deadline, f"waited {WAIT_S:g}s for {what}"
        time.sleep(0.05)


def test_a_running_job_grows_to_three_replicas_and_shrinks_to_one(
    tiny_model_path: Path, tmp_path: Path
) -> None:
    from transformers import AutoTokenizer

    from hybridflow.data.datasets import PromptRecord
    from hybridflow.services.learner.client import GrpcLearnerClient
    from hybridflow.services.reward.client import GrpcRewardClient
    from hybridflow.services.rollout.client import GrpcRolloutClient

    tokenizer = AutoTokenizer.from_pretrained(str(tiny_model_path))
    learner_server, core = start_learner_server(
        tiny_model_path,
        max_bytes=4 * MIB,
        weight_sync=WeightSyncConfig(transport="dist", timeout_s=60),
        optimizer={"lr": 1e-3},
        checkpoint_dir=str(tmp_path / "ck"),
    )
    rollout_servers = [start_rollout_server(tiny_model_path, seed=i)[0] for i in range(3)]
    reward_server = start_reward_server()
    addresses = [s.address for s in rollout_servers]
    clients: dict[str, CountingRollout] = {}

    def connect(address: str) -> CountingRollout:
        clients[address] = CountingRollout(GrpcRolloutClient(address))
        return clients[address]

    learner = GrpcLearnerClient(learner_server.address)
    reward = GrpcRewardClient(reward_server.address)
    services = Services(
        [connect(addresses[0])],
        reward,
        learner,
        [addresses[0]],
        decode=lambda ids: str(tokenizer.decode(ids, skip_special_tokens=True)),
        connect_rollout=connect,
    )
    records = [
        PromptRecord(
            p, tokenizer.encode(p, add_special_tokens=False), "rltrainer", None, {"prompt": p}, i
        )
        for i, p in enumerate(PROMPTS)
    ]
    cfg = CoordinatorConfig(
        num_steps=100_000,  # ended by the test's stop
        prompts_per_step=4,
        prompts_per_request=1,
        group_size=2,
        max_staleness=1,
        sampling=SamplingConfig(temperature=1.0, max_new_tokens=4),
        save_checkpoint=False,
        checkpoint_every=0,
        progress=False,
        replica_rejoin_timeout_s=120,
    )
    control = JobControl(cfg.num_steps, str(tmp_path))
    job = TrainingJob(cfg, services, records, tmp_path, control, checkpoint_root=tmp_path / "ck")
    failure: list[BaseException] = []

    def run() -> None:
        try:
            job.run()
        except BaseException as exc:  # noqa: BLE001 — the test raises it
            failure.append(exc)

    runner = threading.Thread(target=run)
    runner.start()
    try:
        _wait("two steps on one replica", lambda: control.status().step >= 2 or failure)
        publisher = core._publisher
        assert list(publisher._lanes) == [addresses[0]] and publisher._generation == 1

        control.scale(addresses[1:], [])
        _wait(
            "the added replicas to serve",
            lambda: [r.state for r in control.status().replicas] == ["serving"] * 3 or failure,
        )
        calls = {a: clients[a].calls for a in addresses}
        _wait(
            "each of three to generate",
            lambda: all(clients[a].calls > calls[a] for a in addresses) or failure,
        )
        step = control.status().step
        _wait("a step at three", lambda: control.status().step > step or failure)
        # One group per replica, the first never formed again (its joiners formed their own).
        assert sorted(publisher._lanes) == sorted(addresses) and publisher._generation == 3

        control.scale([], addresses[:2])
        _wait(
            "two replicas removed",
            lambda: (
                [r.state for r in control.status().replicas] == ["removed", "removed", "serving"]
                or failure
            ),
        )
        gone = {a: clients[a].calls for a in addresses[:2]}
        step = control.status().step
        _wait("two steps at one", lambda: control.status().step >= step + 2 or failure)
        assert {a: clients[a].calls for a in addresses[:2]} == gone
        assert list(publisher._lanes) == [addresses[2]]  # the removed replicas' groups closed
    finally:
        control.stop()
        runner.join(WAIT_S)
        for client in clients.values():
            client.close()
        learner.close()
        reward.close()
        for server in [learner_server, reward_server, *rollout_servers]:
            server.stop(0)
    assert not failure, failure
    trained = [json.loads(x) for x in (tmp_path / "trained.jsonl").read_text().splitlines()]
    assert max(Counter(r["seq"] for r in trained).values()) == 1  # none doubled
    final = max((tmp_path / "ck").glob("step_*"))
    pending = {seq for _, _, seq in json.loads((final / "coordinator.json").read_text())["pending"]}
    handed_out = {r["seq"] for r in trained} | pending
    assert handed_out == set(range(max(handed_out) + 1))  # none lost
