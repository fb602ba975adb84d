"""PPO with the critic on ranks of its own equals the co-located critic: 1 actor rank + 1 critic
rank (gloo) against one process holding both, over the same seeded two train steps.

The split ranks are driven the way the learner service drives them (``LearnerCore`` behind
``CommandRelay``): two train steps with a train-state save in between, log-probs, full
weights, a weight publish over the torch.distributed weight-sync group to a replica in rank 0's
process (the actor rank is the only source), then a resume from the saved state and the second
step again. The single process runs the same commands co-located; it also resumes the split
learner's checkpoint (actor and critic state written by different ranks).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoModelForCausalLM

from hybridflow.weights.config import WeightSyncConfig
from hybridflow.weights.spec import GroupSpec, ReplicaDescription
from tests.helpers import build_tiny_checkpoint, learner_config
from tests.integration.test_fsdp_parity import (
    _free_port,
    _join_group,
    _leave_group,
    _samples,
    _spawn,
)

# Two mini-batches (two optimizer steps per train step), GAE with lambda < 1, and the KL
# penalty in the reward: the actor rank's KL and the critic rank's values meet in the estimator.
FIELDS: dict[str, Any] = {
    "algorithm": "ppo",
    "optimizer": {"lr": 1e-3},
    "critic": {"lr": 1e-3},
    "update": {"micro_batch_size": 2, "num_mini_batches": 2},
    "advantage": {"lam": 0.9},
    "kl": {"use_reference": True, "coef": 0.05, "mode": "reward"},
}
WEIGHT_SYNC = WeightSyncConfig(transport="dist", timeout_s=120)


class InProcessReplica:
    """A TP-1 rollout replica inside the publishing process: a ``DistReceiver`` that joins the
    weight-sync group from the publisher's threads and keeps what it received."""

    def __init__(self, model_path: Path) -> None:
        from hybridflow.weights.dist_formation import param_table
        from hybridflow.weights.dist_receiver import DistReceiver

        table = param_table(AutoModelForCausalLM.from_pretrained(model_path))
        self.table = table
        self.receiver = DistReceiver(table, torch.device("cpu"))
        self.received: dict[str, torch.Tensor] = {}

    def tensor_parallel_size(self) -> int:
        return 1

    def describe(self) -> ReplicaDescription:
        """What the hf engine reports: whole tensors under the learner's names, at TP 1."""
        from hybridflow.resharding.layout import layout_of
        from hybridflow.weights.dist_formation import replicated_topology

        return ReplicaDescription(1, layout_of("", replicated_topology(self.table)))

    def join_weight_sync(self, spec: GroupSpec, replica_index: int) -> str:
        return self.receiver.join(spec, replica_index)

    def receive_weights(self, policy_version: int, timeout_s: float) -> int:
        tensors, num_bytes = self.receiver.receive()
        self.received = {name: t.clone() for name, t in tensors}
        return num_bytes

    def send(self, named_tensors: Any, policy_version: int) -> Any:
        raise AssertionError("the dist transport never streams whole weights")

    def close(self) -> None:
        self.receiver.close()


def _run_commands(call: Callable[..., Any], replica: InProcessReplica) -> dict[str, Any]:
    samples = _samples()
    first = call("train_step", (samples,))
    call("save_train_state", ("state",))
    second = call("train_step", (list(reversed(samples)),))
    logprobs = call(
        "compute_logprobs",
        ([s.prompt_ids for s in samples], [s.response_ids for s in samples], 1.0),
    )
    weights = {k: v.clone() for k, v in call("full_weights", ())}
    report = call("publish_weights", (["replica0"],))
    resumed_version = call("load_train_state", ("state",))
    again = call("train_step", (list(reversed(samples)),))
    return {
        "metrics": [first.metrics, second.metrics],
        "version": second.policy_version,
        "logprobs": logprobs,
        "weights": weights,
        "published": dict(replica.received),
        "published_version": report.policy_version,
        "resumed_version": resumed_version,
        "again": again.metrics,
        "weights_again": {k: v.clone() for k, v in call("full_weights", ())},
    }


def _core(fields: dict[str, Any], ckpt: str, root: Path, rank: int) -> tuple[Any, Any]:
    from hybridflow.services.learner.core import LearnerCore
    from hybridflow.services.learner.worker import LearnerWorker

    worker = LearnerWorker(learner_config(fields, checkpoint_dir=str(root)), ckpt)
    replica = InProcessReplica(Path(ckpt))
    core = LearnerCore(worker, rank, WEIGHT_SYNC, lambda _target: replica)
    return core, replica


def _split_rank_main(rank: int, port: int, ckpt: str, out_dir: str) -> None:
    _join_group(rank, port)
    from hybridflow.services.learner.distributed import CommandRelay

    core, replica = _core(
        {**FIELDS, "topology": {"critic_nproc_per_node": 1}}, ckpt, Path(out_dir) / "split", rank
    )
    assert core.worker.has_actor == (rank == 0)
    assert (core.worker.critic is not None) == (rank == 1)
    assert (core.worker.reference is not None) == (rank == 0)
    relay = CommandRelay(core.dispatch)
    if rank == 0:
        results = _run_commands(relay.call, replica)
        relay.shutdown()
        torch.save(results, Path(out_dir) / "split.pt")
    else:
        relay.serve()
    _leave_group()


def _assert_metrics_close(got: dict[str, float], want: dict[str, float], what: str) -> None:
    """Every metric but wall-clock ones (timings, tokens/s, MFU)."""
    skip = {k for k in {*got, *want} if k.startswith(("timing_s/", "perf/"))}
    assert set(got) - skip == set(want) - skip, what
    for key in sorted(set(want) - skip):
        assert got[key] == pytest.approx(want[key], abs=1e-5, rel=1e-5), (what, key)


def _assert_weights_close(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> None:
    assert set(got) == set(want)
    for key, tensor in want.items():
        torch.testing.assert_close(got[key], tensor, atol=1e-5, rtol=0, msg=key)


@pytest.fixture(scope="module")
def split_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, dict[str, Any]]:
    """(run dir, tiny checkpoint, what the split learner's rank 0 saw): spawned once."""
    torch.set_num_threads(1)
    tmp_path = tmp_path_factory.mktemp("critic_ranks")
    ckpt = build_tiny_checkpoint(tmp_path / "tiny")
    _spawn(_split_rank_main, (_free_port(), str(ckpt), str(tmp_path)))
    return tmp_path, ckpt, torch.load(tmp_path / "split.pt", weights_only=False)


def test_critic_on_its_own_rank_matches_the_colocated_critic(
    split_run: tuple[Path, Path, dict[str, Any]],
) -> None:
    tmp_path, ckpt, split = split_run
    core, replica = _core(FIELDS, str(ckpt), tmp_path / "colocated", 0)
    colocated = _run_commands(lambda command, args: core.dispatch(command, args), replica)
    core.shutdown()

    for step in (0, 1):
        _assert_metrics_close(
            split["metrics"][step], colocated["metrics"][step], f"train step {step + 1}"
        )
    assert split["version"] == colocated["version"] == 4
    for row_got, row_want in zip(split["logprobs"], colocated["logprobs"], strict=True):
        assert row_got == pytest.approx(row_want, abs=1e-5)
    _assert_weights_close(split["weights"], colocated["weights"])
    # The replica receives exactly the actor's weights, from the actor rank alone.
    assert split["published_version"] == 4 and split["published"]
    _assert_weights_close(split["published"], colocated["published"])
    for key, tensor in split["published"].items():
        torch.testing.assert_close(tensor, split["weights"][key], atol=0, rtol=0)
    # Resuming the split learner's checkpoint repeats its second step exactly.
    assert split["resumed_version"] == 2
    _assert_metrics_close(split["again"], split["metrics"][1], "resumed split step")
    for key, tensor in split["weights"].items():
        torch.testing.assert_close(split["weights_again"][key], tensor, atol=0, rtol=0)
    # The metrics say something: both models trained, GAE saw the critic's values.
    first, second = colocated["metrics"]
    assert first["critic/vf_loss"] > 0 and first["critic/grad_norm"] > 0
    assert first["actor/grad_norm"] > 0 and first["critic/values/mean"] != 0
    assert second["actor/reward_kl_penalty"] != 0  # the actor moved off the reference


def test_colocated_learner_resumes_a_split_learners_checkpoint(
    split_run: tuple[Path, Path, dict[str, Any]],
) -> None:
    """Actor entries come from the actor rank, critic entries from the critic rank: a single
    co-located process restores both and takes the same second step."""
    from hybridflow.services.learner.worker import LearnerWorker

    tmp_path, ckpt, split = split_run
    assert sorted(p.name for p in (tmp_path / "split" / "state").iterdir()) == [
        "COMPLETE",
        "MANIFEST.json",
        "dcp",
        "rank0.pt",
        "rank1.pt",
    ]
    worker = LearnerWorker(learner_config(FIELDS), ckpt)
    assert worker.load_train_state(tmp_path / "split" / "state") == 2
    second = worker.train_step(list(reversed(_samples())))
    _assert_metrics_close(second.metrics, split["metrics"][1], "co-located resume")
    _assert_weights_close(dict(worker.full_state_dict_items()), split["weights"])
