"""Finding 4: SaveCheckpoint wrote wherever the client said (absolute paths, ``../..``),
overwriting existing files. Now only a new, relative name under learner.checkpoint_dir."""

from __future__ import annotations

import os
from pathlib import Path

import grpc
import pytest

from hybridflow.errors import AlreadyExists
from hybridflow.rpc.channel import make_channel
from hybridflow.services.learner.checkpoint_paths import resolve_checkpoint_target
from hybridflow.v1 import learner_pb2, learner_pb2_grpc
from tests.helpers import start_learner_server


@pytest.mark.parametrize(
    "name",
    ["", "/etc/passwd", "../escape", "a/../../b", "a//b", "./a", "a/", "a\\b", "a\x00b"],
)
def test_unsafe_names_are_rejected(tmp_path, name):
    with pytest.raises(ValueError):
        resolve_checkpoint_target(tmp_path, name)


def test_symlink_out_of_the_root_is_rejected(tmp_path):
    root, outside = tmp_path / "root", tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    os.symlink(outside, root / "link")
    with pytest.raises(ValueError, match="outside"):
        resolve_checkpoint_target(root, "link/step-1")


def test_existing_target_is_never_overwritten(tmp_path):
    (tmp_path / "step-1").mkdir()
    with pytest.raises(AlreadyExists):
        resolve_checkpoint_target(tmp_path, "step-1")
    assert (
        resolve_checkpoint_target(tmp_path, "step-1", must_exist=True)
        == (tmp_path / "step-1").resolve()
    )
    assert resolve_checkpoint_target(tmp_path, "run/step-2") == (tmp_path / "run/step-2").resolve()


def _save(address: str, path: str) -> learner_pb2.SaveCheckpointResponse:
    channel = make_channel(address)
    try:
        stub = learner_pb2_grpc.LearnerServiceStub(channel)
        return stub.SaveCheckpoint(learner_pb2.SaveCheckpointRequest(path=path), timeout=60)
    finally:
        channel.close()


def test_save_checkpoint_rpc_stays_inside_checkpoint_dir(tiny_model_path, tmp_path):
    root = tmp_path / "checkpoints"
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "keep.txt").write_text("precious")
    server, _ = start_learner_server(tiny_model_path, checkpoint_dir=str(root))
    try:
        for bad in (str(victim), "../victim", "a/../../victim"):
            with pytest.raises(grpc.RpcError) as err:
                _save(server.address, bad)
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, bad
        assert sorted(p.name for p in victim.iterdir()) == ["keep.txt"]
        reply = _save(server.address, "step-1")
        assert Path(reply.path) == (root / "step-1").resolve()
        assert (root / "step-1" / "config.json").exists()
        with pytest.raises(grpc.RpcError) as err:
            _save(server.address, "step-1")
        assert err.value.code() == grpc.StatusCode.ALREADY_EXISTS
    finally:
        server.stop(0)


def test_save_checkpoint_refused_without_checkpoint_dir(tiny_model_path, tmp_path):
    server, _ = start_learner_server(tiny_model_path)
    try:
        with pytest.raises(grpc.RpcError) as err:
            _save(server.address, "step-1")
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "learner.checkpoint_dir" in err.value.details()
    finally:
        server.stop(0)
