"""Weights over the torch.distributed group (gloo) between a learner and real rollout
services: probe-batch log-prob parity after every sync (≤ 1e-4, fp32), both executors,
re-planning when replicas join or leave, and a failed sync that errors instead of hanging."""

import pytest

from hybridflow.services.learner.client import GrpcLearnerClient
from hybridflow.services.rollout.client import GrpcRolloutClient
from hybridflow.types import SamplingParams, TrainSample
from hybridflow.weights.config import CHECK_SAMPLES, WeightSyncConfig
from tests.helpers import start_learner_server, start_rollout_server

PROBE = [[ord(c) - 31 + 3 for c in text] for text in ("1+2=", "7+8=", "4+4=", "9+0=")]


def probe_parity(rollout: GrpcRolloutClient, learner: GrpcLearnerClient) -> float:
    groups = rollout.generate(PROBE, SamplingParams(n=2, max_new_tokens=4, seed=3))
    prompts = [p for p, g in zip(PROBE, groups) for _ in g]
    responses = [c.token_ids for g in groups for c in g]
    ours = learner.compute_logprobs(prompts, responses, 1.0)
    theirs = [c.logprobs for g in groups for c in g]
    return max(abs(a - b) for x, y in zip(ours, theirs) for a, b in zip(x, y))


def train_once(rollout, learner, version):
    groups = rollout.generate(PROBE, SamplingParams(n=4, max_new_tokens=4))
    samples = [
        TrainSample(p, c.token_ids, c.logprobs, float(j % 2), gid, version)
        for gid, (p, g) in enumerate(zip(PROBE, groups))
        for j, c in enumerate(g)
    ]
    return learner.train_step(samples)


@pytest.mark.parametrize(
    "executor, bucket_bytes, shared_memory",
    [
        ("planner", 64 << 20, "auto"),
        ("planner", 4096, "off"),
        ("planner", 4096, "auto"),
        ("naive", 64 << 20, "auto"),
    ],
    ids=["planner-shm", "planner-small-buckets-in-place", "planner-shm-small-buckets", "naive"],
)
def test_parity_after_every_sync_and_replanning(
    tiny_model_path, executor, bucket_bytes, shared_memory
):
    # 4 KiB buckets split the large tensors into one-slice buckets sent and received in place
    # (over the sockets) or through several reused shared-memory slots (auto: same host).
    cfg = WeightSyncConfig(
        transport="dist",
        executor=executor,
        timeout_s=30,
        bucket_bytes=bucket_bytes,
        shared_memory=shared_memory,
    )
    learner_server, core = start_learner_server(
        tiny_model_path, weight_sync=cfg, optimizer={"lr": 1e-3}
    )
    servers = [start_rollout_server(tiny_model_path, seed=i)[0] for i in range(2)]
    learner = GrpcLearnerClient(learner_server.address)
    rollouts = [GrpcRolloutClient(s.address) for s in servers]
    try:
        targets = [servers[0].address]
        for version in range(3):
            if version == 2:
                targets = [s.address for s in servers]  # a replica joins: re-plan
            result = train_once(rollouts[0], learner, version)
            assert result.policy_version == version + 1
            assert probe_parity(rollouts[0], learner) > 1e-3  # stale until synced
            report = learner.publish_weights(targets)
            assert report.policy_version == version + 1 and report.num_bytes > 0
            for r in rollouts[: len(targets)]:
                assert r.status().policy_version == version + 1
                assert probe_parity(r, learner) <= 1e-4
            if executor == "planner":  # one group per replica: the learner, then its replica
                for target in targets:
                    shared = core._publisher._lanes[target].executor.shared_peers
                    assert shared == ((1,) if shared_memory == "auto" else ())
        # One group formed per replica: the second replica's joining left the first's alone.
        assert core._publisher._generation == 2
    finally:
        for s in [learner_server, *servers]:
            s.stop(0)


def test_a_started_publish_runs_beside_the_next_train_step_and_delivers_its_version(
    tiny_model_path,
):
    """StartPublish returns once the weights are snapshotted; the next TrainStep runs while
    the send may still be on its way (the learner's lock is free), and FinishPublish reports
    the started version once the replica holds exactly those weights, not the newer ones."""
    import torch

    cfg = WeightSyncConfig(transport="dist", timeout_s=30)
    learner_server, core = start_learner_server(
        tiny_model_path, weight_sync=cfg, optimizer={"lr": 1e-2}
    )
    server, rollout = start_rollout_server(tiny_model_path)
    learner = GrpcLearnerClient(learner_server.address)
    replica = GrpcRolloutClient(server.address)
    try:
        train_once(replica, learner, 0)
        for version in range(1, 3):
            sent = {n: t.clone() for n, t in core.full_weights()}
            assert learner.start_publish([server.address]) == version
            assert train_once(replica, learner, version - 1).policy_version == version + 1
            report = learner.finish_publish()
            assert report.policy_version == version and report.num_bytes > 0
            # Received by a busy replica (the train step's rollout ran beside it), so staged
            # and applied before its next request, which runs under exactly those weights.
            first = replica.generate(PROBE[:1], SamplingParams(n=1, max_new_tokens=1))
            assert first[0][0].policy_version == version
            held = rollout.engine.model.state_dict()
            for name, tensor in sent.items():
                assert torch.equal(held[name], tensor), name
            assert probe_parity(replica, learner) > 1e-3  # the learner has moved on
        report = learner.publish_weights([server.address])  # settles, then a plain publish
        assert report.policy_version == 3
        assert probe_parity(replica, learner) <= 1e-4
    finally:
        learner_server.stop(0)
        server.stop(0)


def test_sync_to_a_dead_replica_fails_with_an_error_and_recovers(tiny_model_path):
    cfg = WeightSyncConfig(transport="dist", timeout_s=5)
    learner_server, core = start_learner_server(
        tiny_model_path, weight_sync=cfg, optimizer={"lr": 1e-3}
    )
    alive, _ = start_rollout_server(tiny_model_path)
    dead, _ = start_rollout_server(tiny_model_path)
    learner = GrpcLearnerClient(learner_server.address)
    try:
        learner.publish_weights([alive.address, dead.address])
        dead.stop(0)
        with pytest.raises(Exception, match="weight.sync"):  # a failed probe or sync
            learner.publish_weights([alive.address, dead.address])
        # The group was torn down; the surviving replica set gets a fresh group.
        report = learner.publish_weights([alive.address])
        assert report.num_bytes > 0
        assert probe_parity(GrpcRolloutClient(alive.address), learner) <= 1e-4
    finally:
        learner_server.stop(0)
        alive.stop(0)


def test_a_replica_that_refuses_to_join_fails_the_sync_with_its_reason(tiny_model_path):
    # Without the arrival check every learner rank waited out timeout_s inside gloo's
    # rendezvous and then reported a timeout; now the refusal itself ends the attempt. Each
    # replica has a group of its own, so the one that joined keeps it for the next publish.
    cfg = WeightSyncConfig(transport="dist", timeout_s=60)
    learner_server, core = start_learner_server(
        tiny_model_path, weight_sync=cfg, optimizer={"lr": 1e-3}
    )
    good, _ = start_rollout_server(tiny_model_path)
    bad, bad_rollout = start_rollout_server(tiny_model_path)
    learner = GrpcLearnerClient(learner_server.address)

    def refuse(spec, replica_index):
        raise ValueError("this replica was told to refuse")

    bad_rollout.join_weight_sync = refuse
    try:
        with pytest.raises(
            Exception, match="refused to join: INVALID_ARGUMENT: this replica was told to refuse"
        ):
            learner.publish_weights([good.address, bad.address])
        formed = core._publisher._generation
        assert list(core._publisher._lanes) == [good.address]
        report = learner.publish_weights([good.address])  # the others are unharmed
        assert report.num_bytes > 0
        assert probe_parity(GrpcRolloutClient(good.address), learner) <= 1e-4
        assert core._publisher._generation == formed  # through the group it already had
    finally:
        for s in (learner_server, good, bad):
            s.stop(0)


def test_a_bf16_replica_of_an_fp32_learner_gets_its_weights_in_bf16(tiny_model_path):
    """The common real set-up (fp32 master weights, a bf16 engine): the learner sends in the
    replica's dtype (half the bytes) and the replica ends with exactly the learner's weights
    rounded to bf16. Replicas of two dtypes in one group are refused before any joins."""
    import torch

    cfg = WeightSyncConfig(transport="dist", timeout_s=30)
    learner_server, core = start_learner_server(
        tiny_model_path, weight_sync=cfg, optimizer={"lr": 1e-3}
    )
    bf16, rollout = start_rollout_server(tiny_model_path, dtype="bfloat16")
    fp32, _ = start_rollout_server(tiny_model_path)
    learner = GrpcLearnerClient(learner_server.address)
    try:
        train_once(GrpcRolloutClient(bf16.address), learner, 0)
        report = learner.publish_weights([bf16.address])
        weights = dict(core.full_weights())
        fp32_bytes = sum(t.numel() * 4 for n, t in weights.items() if n != "lm_head.weight")
        assert report.num_bytes <= fp32_bytes // 2 + 4096  # bf16 on the wire
        held = rollout.engine.model.state_dict()
        for name, tensor in weights.items():
            assert held[name].dtype == torch.bfloat16
            assert torch.equal(held[name], tensor.to(torch.bfloat16)), name
        with pytest.raises(Exception, match="different dtypes"):
            learner.publish_weights([bf16.address, fp32.address])
    finally:
        for s in (learner_server, bf16, fp32):
            s.stop(0)


def skip_slices(monkeypatch, skipped: str, applies) -> list[int]:  # type: ignore[no-untyped-def]
    """The learner drops tensor ``skipped``'s slices from what it sends while ``applies()``:
    from the buckets it packs for the sockets (every bucket packed, none sent in place) and
    from its copies into a same-host replica's buffer (planned at join). Returns the ids of
    the buckets whose same-host copy left it out (empty when no pair used shared memory)."""
    import dataclasses

    from hybridflow.weights.transport import executors, same_host

    pack, write = executors.pack, same_host.SharedDestinations.write
    skipped_in_copy: list[int] = []

    def without_skipped(bucket):  # type: ignore[no-untyped-def]
        if not applies():
            return bucket
        return dataclasses.replace(bucket, ops=tuple(o for o in bucket.ops if o.name != skipped))

    def write_without_skipped(self, bucket, shards, sync):  # type: ignore[no-untyped-def]
        copies = [stage[bucket.bucket_id] for stage in self.destinations[bucket.peer].copies]
        kept = [list(c) for c in copies]
        if applies():
            skipped_in_copy.append(bucket.bucket_id)
            for c in copies:
                c[:] = [copy for copy in c if copy[1] != skipped]
        try:
            write(self, bucket, shards, sync)
        finally:
            for c, k in zip(copies, kept, strict=True):
                c[:] = k

    monkeypatch.setattr(executors, "pack", lambda b, t, buf: pack(without_skipped(b), t, buf))
    monkeypatch.setattr(same_host.SharedDestinations, "write", write_without_skipped)
    monkeypatch.setattr(executors, "_direct_view", lambda bucket, tensors: None)  # all packed
    return skipped_in_copy


@pytest.mark.parametrize("shared_memory", ["off", "auto"], ids=["sockets", "shared-memory"])
def test_a_slice_the_learner_skipped_for_one_replica_stops_the_sync_naming_it(
    tiny_model_path, monkeypatch, shared_memory
):
    """Every sync is checked by default: the learner drops one tensor's slice on its way to
    the second replica only (over the sockets, or in its same-host copy); that replica
    refuses the update before staging it, and the learner's publish fails with
    ``DeliveryFailed`` (never retried) naming the replica and the tensor. The replica keeps
    serving its previous weights; once the fault is gone the next publish delivers."""
    import threading

    from hybridflow.errors import DeliveryFailed
    from hybridflow.weights.transport import executors

    skipped = "model.layers.1.mlp.up_proj.weight"
    cfg = WeightSyncConfig(transport="dist", timeout_s=30, shared_memory=shared_memory)
    learner_server, core = start_learner_server(
        tiny_model_path, weight_sync=cfg, optimizer={"lr": 1e-3}
    )
    servers = [start_rollout_server(tiny_model_path, seed=i)[0] for i in range(2)]
    learner = GrpcLearnerClient(learner_server.address)
    rollouts = [GrpcRolloutClient(s.address) for s in servers]
    # Each replica has its own group (the learner is rank 0, the replica rank 1): the fault
    # is in the second replica's group only, whose sends run on their own thread.
    sending = threading.local()

    skipped_in_copy = skip_slices(monkeypatch, skipped, lambda: getattr(sending, "victim", False))
    sent_attempts = []
    send = executors.DistExecutor._send

    def marked_send(executor, shards):
        sending.victim = executor is core._publisher._lanes[servers[1].address].executor
        sent_attempts.append(sending.victim)
        return send(executor, shards)

    monkeypatch.setattr(executors.DistExecutor, "_send", marked_send)
    try:
        train_once(rollouts[0], learner, 0)
        with pytest.raises(DeliveryFailed) as err:
            learner.publish_weights([s.address for s in servers])
        message = str(err.value)
        assert f"replica {servers[1].address}" in message and skipped in message, message
        assert sorted(sent_attempts) == [False, True]  # one send to each replica: not retried
        assert bool(skipped_in_copy) == (shared_memory == "auto")  # the path under test
        assert rollouts[1].status().policy_version == 0  # refused before staging
        assert rollouts[1].generate(PROBE[:1], SamplingParams(max_new_tokens=2))  # still serves
        monkeypatch.undo()
        report = learner.publish_weights([s.address for s in servers])
        assert report.policy_version == 1
        for rollout in rollouts:
            assert rollout.status().policy_version == 1
            assert probe_parity(rollout, learner) <= 1e-4
    finally:
        for s in [learner_server, *servers]:
            s.stop(0)


@pytest.mark.parametrize("shared_memory", ["off", "auto"], ids=["sockets", "shared-memory"])
def test_the_sampled_check_catches_a_slice_skipped_at_a_later_sync(
    tiny_model_path, monkeypatch, shared_memory
):
    """``weight_sync.check: sampled`` (the default on gloo): a group's first sync is checked
    byte by byte, the later ones on CHECK_SAMPLES elements of each slice. A slice the learner skips at
    the second sync, after a train step moved its elements, is caught all the same, named, and
    the replica keeps the weights of the first; over sockets and through shared memory (where
    the learner samples its slices while the replica copies them out)."""

    from hybridflow.errors import DeliveryFailed

    skipped = "model.layers.1.mlp.up_proj.weight"
    cfg = WeightSyncConfig(
        transport="dist", timeout_s=30, shared_memory=shared_memory, check="sampled"
    )
    learner_server, _ = start_learner_server(
        tiny_model_path, weight_sync=cfg, optimizer={"lr": 1e-3}
    )
    server, _ = start_rollout_server(tiny_model_path)
    learner = GrpcLearnerClient(learner_server.address)
    rollout = GrpcRolloutClient(server.address)
    try:
        train_once(rollout, learner, 0)
        assert learner.publish_weights([server.address]).policy_version == 1  # checked whole
        train_once(rollout, learner, 1)
        written_without = skip_slices(monkeypatch, skipped, lambda: True)
        with pytest.raises(DeliveryFailed, match=f"{CHECK_SAMPLES} sampled elements") as err:
            learner.publish_weights([server.address])
        assert skipped in str(err.value)
        assert bool(written_without) == (shared_memory == "auto")  # the path under test
        assert rollout.status().policy_version == 1  # refused before staging
    finally:
        for s in (learner_server, server):
            s.stop(0)
