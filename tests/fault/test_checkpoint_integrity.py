"""Issue 27 rows 1, 2, 11: a learner train state that is damaged, or does not fit the learner,
is refused before any tensor is read, with one line naming the file or the key, and the RPC
answers at once (it used to hang 120 s: DCP's ``CheckpointException`` is a BaseException).

Damage: a shard truncated to half, ``.metadata`` deleted, a shard of random bytes, 16 bytes
flipped inside a weight tensor (loads silently without the manifest), ``rank0.pt`` deleted.
Misfit: a model of another shape, ``learner.algorithm=ppo`` on a GRPO checkpoint (no critic).
"""

from __future__ import annotations

import errno
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import grpc
import pytest
import torch

from hybridflow.errors import CheckpointCorrupt, CheckpointRejected, ResourceExhausted
from hybridflow.services.learner.train_state import save_train_state
from hybridflow.services.learner.worker import LearnerWorker
from tests.helpers import build_tiny_checkpoint, learner_config, start_learner_server
from tests.helpers import small_tmpfs as mount_small_tmpfs


def _worker(model: Path, algorithm: str = "grpo") -> LearnerWorker:
    return LearnerWorker(
        learner_config(algorithm=algorithm, optimizer={"lr": 1e-2}, update={"micro_batch_size": 4}),
        model,
    )


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(model, a good GRPO train state of it)."""
    root = tmp_path_factory.mktemp("integrity")
    model = build_tiny_checkpoint(root / "model")
    state = root / "state"
    save_train_state(_worker(model), state)
    return model, state


def _largest_shard(state: Path) -> Path:
    return max((state / "dcp").glob("*.distcp"), key=lambda p: p.stat().st_size)


def _truncate(state: Path) -> Path:
    shard = _largest_shard(state)
    os.truncate(shard, shard.stat().st_size // 2)
    return shard


def _delete_metadata(state: Path) -> Path:
    (state / "dcp" / ".metadata").unlink()
    return state / "dcp" / ".metadata"


def _random_bytes(state: Path) -> Path:
    shard = _largest_shard(state)
    shard.write_bytes(os.urandom(shard.stat().st_size))
    return shard


def _flip_16_bytes_in_a_weight(state: Path) -> Path:
    """16 bytes in the middle of the embedding matrix: still a valid file, other numbers."""
    from torch.distributed.checkpoint import FileSystemReader

    metadata = FileSystemReader(state / "dcp").read_metadata()
    key = next(k for k in metadata.storage_data if k.fqn.endswith("embed_tokens.weight"))
    where = metadata.storage_data[key]
    shard = state / "dcp" / where.relative_path
    data = bytearray(shard.read_bytes())
    middle = where.offset + where.length // 2
    for i in range(middle, middle + 16):
        data[i] ^= 0x5A
    shard.write_bytes(bytes(data))
    return shard


def _delete_rank0(state: Path) -> Path:
    (state / "rank0.pt").unlink()
    return state / "rank0.pt"


DAMAGE: dict[str, Callable[[Path], Path]] = {
    "truncated shard": _truncate,
    "deleted .metadata": _delete_metadata,
    "random bytes": _random_bytes,
    "16 flipped bytes": _flip_16_bytes_in_a_weight,
    "deleted rank0.pt": _delete_rank0,
}


@pytest.mark.parametrize("kind", list(DAMAGE))
def test_damaged_train_state_is_refused_naming_the_file(saved, tmp_path, kind):
    model, good = saved
    state = tmp_path / "state"
    shutil.copytree(good, state)
    damaged = DAMAGE[kind](state)
    worker = _worker(model)
    before = {k: v.clone() for k, v in worker.actor.state_dict().items()}
    with pytest.raises(CheckpointCorrupt) as err:
        worker.load_train_state(state)
    message = str(err.value)
    assert message.startswith(str(damaged)) and "\n" not in message, message
    for key, tensor in worker.actor.state_dict().items():  # nothing was loaded
        assert torch.equal(tensor, before[key]), key


def test_a_model_of_another_shape_is_refused_naming_the_key_and_both_shapes(saved, tmp_path):
    _, good = saved
    other = build_tiny_checkpoint(tmp_path / "wider", intermediate_size=96)
    with pytest.raises(CheckpointRejected) as err:
        _worker(other).load_train_state(good)
    assert not isinstance(err.value, CheckpointCorrupt)
    message = str(err.value)
    assert "mlp" in message and "(64, 32) in the checkpoint, (96, 32) in this model" in message


def test_ppo_on_a_grpo_checkpoint_is_refused_naming_the_critic(saved):
    model, good = saved
    with pytest.raises(CheckpointRejected, match="has no critic.*learner.algorithm=ppo"):
        _worker(model, "ppo").load_train_state(good)


def test_the_intact_checkpoint_still_loads(saved):
    model, good = saved
    assert _worker(model).load_train_state(good) == 0


def _stub(address: str):
    from hybridflow.rpc.channel import make_channel
    from hybridflow.v1 import learner_pb2_grpc

    return learner_pb2_grpc.LearnerServiceStub(make_channel(address))


def test_the_learner_service_answers_at_once_data_loss_naming_the_file(tiny_model_path, tmp_path):
    from hybridflow.v1 import learner_pb2

    root = tmp_path / "checkpoints"
    server, _ = start_learner_server(tiny_model_path, checkpoint_dir=str(root))
    try:
        stub = _stub(server.address)
        stub.SaveTrainState(learner_pb2.TrainStateRequest(name="s1"), timeout=60)
        shard = _flip_16_bytes_in_a_weight(root / "s1")
        with pytest.raises(grpc.RpcError) as err:
            stub.LoadTrainState(learner_pb2.TrainStateRequest(name="s1"), timeout=60)
        assert err.value.code() == grpc.StatusCode.DATA_LOSS
        assert str(shard) in err.value.details()
    finally:
        server.stop(0)


def test_disk_full_during_a_save_is_resource_exhausted_naming_path_and_space(
    tiny_model_path, tmp_path, monkeypatch
):
    import torch.distributed.checkpoint as dcp

    from hybridflow.v1 import learner_pb2

    def full(state, checkpoint_id, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(dcp, "save", full)
    root = tmp_path / "checkpoints"
    server, _ = start_learner_server(tiny_model_path, checkpoint_dir=str(root))
    try:
        with pytest.raises(grpc.RpcError) as err:
            _stub(server.address).SaveTrainState(
                learner_pb2.TrainStateRequest(name="s1"), timeout=60
            )
        assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert str(root / "s1") in err.value.details() and "MiB free" in err.value.details()
    finally:
        server.stop(0)


def test_a_checkpoint_exception_from_dcp_is_a_named_error(saved, monkeypatch):
    """DCP's own failure (a BaseException) becomes a domain error naming the directory."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException

    model, good = saved

    def broken(state, checkpoint_id, **kwargs):
        raise CheckpointException("boom", {0: (OSError(errno.ENOSPC, "No space"), None)})

    monkeypatch.setattr(dcp, "load", broken)
    with pytest.raises(ResourceExhausted, match="no space left writing"):
        _worker(model).load_train_state(good)


def test_torch_save_on_a_full_disk_is_resource_exhausted(saved, tmp_path, monkeypatch):
    """torch.save reports a full disk as RuntimeError "unexpected pos", not an OSError."""
    from hybridflow.services.learner import train_state

    def cut_short(obj, path):
        raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598")

    model, _ = saved
    monkeypatch.setattr(train_state, "_atomic_torch_save", cut_short)
    monkeypatch.setattr(train_state, "looks_full", lambda path: True)
    with pytest.raises(ResourceExhausted, match=r"no space left writing .*MiB free"):
        save_train_state(_worker(model), tmp_path / "state")
    monkeypatch.setattr(train_state, "looks_full", lambda path: False)
    with pytest.raises(
        RuntimeError, match=r"state2: saving failed: RuntimeError: .*unexpected pos"
    ):
        save_train_state(_worker(model), tmp_path / "state2")


@pytest.fixture
def small_tmpfs(tmp_path):
    """A 4 MiB tmpfs (root only)."""
    with mount_small_tmpfs(tmp_path / "small", "4m") as mount:
        yield mount


@pytest.mark.slow
def test_a_save_onto_a_really_full_disk_answers_resource_exhausted(tiny_model_path, small_tmpfs):
    from hybridflow.utils.disk import free_bytes
    from hybridflow.v1 import learner_pb2

    root = small_tmpfs / "checkpoints"
    root.mkdir()
    filler = small_tmpfs / "filler"
    filler.write_bytes(b"\0" * (free_bytes(small_tmpfs) - 64 * 1024))  # 64 KiB left
    server, _ = start_learner_server(tiny_model_path, checkpoint_dir=str(root))
    try:
        with pytest.raises(grpc.RpcError) as err:
            _stub(server.address).SaveTrainState(
                learner_pb2.TrainStateRequest(name="s1"), timeout=60
            )
        assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert str(root / "s1") in err.value.details() and "MiB free" in err.value.details()
    finally:
        server.stop(0)
