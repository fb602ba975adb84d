"""Builders shared by integration and e2e tests: in-process servers on OS-chosen ports."""

from __future__ import annotations

import contextlib
import subprocess
import time
from collections.abc import Iterator, Mapping
from dataclasses import is_dataclass, replace
from pathlib import Path
from typing import Any

from hybridflow.rpc.config import ServerConfig
from hybridflow.rpc.server import RunningServer, start_server
from tests import skips

MIB = 1024 * 1024


def start_rollout_server(
    model_path: Path,
    seed: int = 0,
    max_bytes: int = 64 * MIB,
    dtype: str = "float32",
    engine: object = None,
) -> tuple[RunningServer, object]:
    """A rollout replica served in this process: an ``hf`` engine of ``model_path``, or
    ``engine`` when given."""
    from hybridflow.services.rollout.engine import HFEngine
    from hybridflow.services.rollout.local import LocalRollout
    from hybridflow.services.rollout.servicer import SERVICE_NAME, RolloutServicer
    from hybridflow.v1 import rollout_pb2_grpc, weight_sync_pb2_grpc
    from hybridflow.weights.servicer import SERVICE_NAME as WEIGHT_SYNC_SERVICE
    from hybridflow.weights.servicer import WeightSyncServicer

    if engine is None:
        engine = HFEngine(model_path, seed=seed, dtype=dtype)
    rollout = LocalRollout(engine, str(model_path))  # type: ignore[arg-type]
    servicer = RolloutServicer(rollout, prompts_per_message=4, max_bytes=max_bytes)
    weights = WeightSyncServicer(rollout, max_bytes)

    def register(server: object) -> None:
        rollout_pb2_grpc.add_RolloutServiceServicer_to_server(servicer, server)
        weight_sync_pb2_grpc.add_WeightSyncServiceServicer_to_server(weights, server)

    server = start_server(
        ServerConfig(max_message_bytes=max_bytes), register, [SERVICE_NAME, WEIGHT_SYNC_SERVICE]
    )
    return server, rollout


def start_learner_server(
    model_path: Path, max_bytes: int = 64 * MIB, weight_sync: object = None, **config: object
) -> tuple[RunningServer, object]:
    from hybridflow.rpc.config import ChannelConfig
    from hybridflow.services.learner.core import LearnerCore
    from hybridflow.services.learner.servicer import SERVICE_NAME, LearnerServicer
    from hybridflow.services.learner.worker import LearnerWorker
    from hybridflow.v1 import learner_pb2, learner_pb2_grpc
    from hybridflow.weights.client import GrpcWeightSyncClient

    cfg = learner_config(config)
    worker = LearnerWorker(cfg, model_path)
    channel = ChannelConfig(max_message_bytes=max_bytes)
    core = LearnerCore(
        worker,
        0,
        weight_sync,  # type: ignore[arg-type]
        lambda a: GrpcWeightSyncClient(a, channel),
    )
    servicer = LearnerServicer(
        dispatch=core.dispatch,
        info=lambda: learner_pb2.LearnerInfo(
            model=str(model_path),
            algorithm=cfg.algorithm,
            policy_version=worker.policy_version,
            world_size=1,
            needs_greedy_baseline=core.needs_greedy_baseline(),
            needs_routed_experts=core.needs_routed_experts(),
            versions_per_step=worker.versions_per_step(),
        ),
        vocab_size=worker.vocab_size,
        max_bytes=max_bytes,
        chunk_bytes=MIB,
        checkpoint_root=cfg.checkpoint_dir,
        weight_sync=weight_sync,  # type: ignore[arg-type]
        finish_publish=core.finish_publish,
    )
    server = start_server(
        ServerConfig(max_message_bytes=max_bytes),
        lambda s: learner_pb2_grpc.add_LearnerServiceServicer_to_server(servicer, s),
        [SERVICE_NAME],
    )
    return server, core


def wait_for_file(path: Path, proc: subprocess.Popen, timeout_s: float = 120) -> None:
    """Waits until a service process has written its port file (or fails with its output)."""
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        if proc.poll() is not None:
            out = proc.stdout.read().decode() if proc.stdout else ""
            raise AssertionError(f"process exited with {proc.returncode}:\n{out}")
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.05)


def build_tiny_checkpoint(out_dir: Path, seed: int = 0, **overrides: int) -> Path:
    """A 2-layer, width-32 random Llama with the character tokenizer, saved HF-style
    (``overrides``: other LlamaConfig fields, e.g. ``intermediate_size=96`` for another
    shape)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from hybridflow.models.tokenizer import build_char_tokenizer

    tokenizer = build_char_tokenizer()
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    for key, value in overrides.items():
        setattr(config, key, value)
    torch.manual_seed(seed)
    LlamaForCausalLM(config).save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return out_dir


def learner_config(*layers: Mapping[str, Any], **keys: Any) -> Any:
    """A ``LearnerConfig``, not validated, with the keys of each layer and then ``keys`` set
    as a job file sets them: a section takes a mapping of its fields, merged into it
    (``learner_config(algorithm="ppo", optimizer={"lr": 1e-2})``)."""
    from hybridflow.services.learner.config import LearnerConfig

    config: Any = LearnerConfig()
    for layer in (*layers, keys):
        config = _with(config, layer)
    return config


def _with(obj: Any, keys: Mapping[str, Any]) -> Any:
    changes = {}
    for name, value in keys.items():
        current = getattr(obj, name)  # an unknown key fails here
        if isinstance(value, Mapping) and is_dataclass(current):
            value = _with(current, value)
        changes[name] = value
    return replace(obj, **changes)


@contextlib.contextmanager
def small_tmpfs(directory: Path, size: str) -> Iterator[Path]:
    """A tmpfs of ``size`` (mount's notation: "64k", "4m") mounted on ``directory`` for the
    block, unmounted after it even when the block fails. Needs root (skipped with that reason
    otherwise); as root, a mount that fails is a failure, not a skip."""
    import pytest

    if not skips.is_root():
        pytest.skip(skips.needs_root("mounting a tmpfs"))
    directory.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(directory)],
        check=True, capture_output=True, timeout=30,
    )  # fmt: skip
    try:
        yield directory
    finally:
        subprocess.run(["umount", str(directory)], check=False, timeout=30)


def self_signed_cert(folder: Path) -> tuple[Path, Path]:
    """A certificate and its key for 127.0.0.1 and localhost, valid a day (openssl)."""
    cert, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1"]
        + ["-subj", "/CN=localhost", "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost"]
        + ["-keyout", str(key), "-out", str(cert)],
        check=True,
        capture_output=True,
        timeout=60,
    )
    return cert, key
