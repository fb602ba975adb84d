"""Saves and restores everything a learner rank needs to continue training as if uninterrupted.

One train-state checkpoint is a directory:
- ``dcp/``: the actor (and critic) weights and AdamW states, written by every rank with
  torch.distributed.checkpoint (each FSDP2 rank writes its own shards; a single process
  writes plain tensors; either world size can read it back). With the critic on its own
  ranks, actor ranks write the actor's entries and critic ranks the critic's, into the same
  checkpoint: a co-located learner can resume a split one's and the other way round;
- ``rank<r>.pt``: what is per rank and not a tensor shard: torch (and CUDA) RNG state, the
  policy version, the learner config's seed;
- ``MANIFEST.json``: size and sha256 of every file above (``hybridflow.utils.manifest``).
  Each rank hashes its own files right after writing them (its DCP shards and its
  ``rank<r>.pt``, still in the page cache, all ranks in parallel), rank 0 also the shared
  ones (``.metadata``); rank 0 gathers the entries and writes the manifest;
- ``COMPLETE``: written by rank 0 last, after the manifest, so a directory without it is a
  partial save and is never loaded.

Loading verifies before it reads a tensor: every file against the manifest (the files split
over the ranks, so each byte is hashed once), then the DCP metadata against this learner's
state dict (``CheckpointRejected`` naming the first key that is missing or of another shape,
e.g. a critic a GRPO checkpoint lacks). Another world size needs no check: DCP reshards, and
a rank without its own ``rank<r>.pt`` takes rank 0's RNG. A failure of DCP itself (a
``BaseException``) comes back as ``CheckpointCorrupt`` naming the directory; a full disk as
``ResourceExhausted`` naming the path and the free space.

The frozen reference model is not saved: it is the initial checkpoint, reloaded at start;
nor is a LoRA actor's frozen base (its adapters and their AdamW state are).
Knows nothing about gRPC, run directories or which step a name stands for.
"""

from __future__ import annotations

import os
import re
import shutil
import traceback
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.metadata import Metadata, TensorStorageMetadata
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_state_dict,
    set_state_dict,
)

from hybridflow.errors import (
    AlreadyExists,
    CheckpointCorrupt,
    CheckpointRejected,
    ResourceExhausted,
)
from hybridflow.services.learner.distributed import all_gather_objects
from hybridflow.services.learner.optim_hparams import apply_config_hparams
from hybridflow.utils import manifest
from hybridflow.utils.disk import disk_full_message, is_disk_full, looks_full

if TYPE_CHECKING:
    from hybridflow.lora.peft_layers import AdapterParams
    from hybridflow.services.learner.config import LearnerConfig
    from hybridflow.services.learner.distributed import DistInfo

COMPLETE = "COMPLETE"
_OWNED = re.compile(r"^(?:dcp/__(\d+)_\d+\.distcp|rank(\d+)\.pt)$")


class TrainedModels(Protocol):
    """What a train-state save or load reads of a learner rank (``LearnerWorker`` is one):
    the models it trains with their optimizers, the adapters of a LoRA actor, the config and
    where the rank sits. A load writes only the modules' and optimizers' state; the policy
    version it returns is the worker's to set."""

    @property
    def has_actor(self) -> bool: ...

    @property
    def actor(self) -> torch.nn.Module: ...

    @property
    def actor_optim(self) -> torch.optim.Optimizer: ...

    @property
    def critic(self) -> torch.nn.Module | None: ...

    @property
    def critic_optim(self) -> torch.optim.Optimizer | None: ...

    @property
    def adapters(self) -> AdapterParams | None: ...

    @property
    def config(self) -> LearnerConfig: ...

    @property
    def dist(self) -> DistInfo: ...

    @property
    def policy_version(self) -> int: ...


def _trainables(worker: TrainedModels) -> dict[str, tuple[torch.nn.Module, torch.optim.Optimizer]]:
    """What this rank trains: the actor unless it is a critic rank, the critic where it lives."""
    out: dict[str, tuple[torch.nn.Module, torch.optim.Optimizer]] = {}
    if worker.has_actor:
        out["actor"] = (worker.actor, worker.actor_optim)
    if worker.critic is not None and worker.critic_optim is not None:
        out["critic"] = (worker.critic, worker.critic_optim)
    return out


def _options(worker: TrainedModels, name: str) -> StateDictOptions | None:
    """A LoRA actor saves and restores its adapters only: the base is frozen, reloaded from
    the job's model at start like the reference."""
    if name == "actor" and worker.adapters is not None:
        return StateDictOptions(ignore_frozen_params=True, strict=False)
    return None


def _state(worker: TrainedModels) -> dict[str, Any]:
    state: dict[str, Any] = {}
    for name, (module, optim) in _trainables(worker).items():
        options = _options(worker, name)
        model_sd, optim_sd = get_state_dict(module, optim, options=options)
        if options is not None:  # torch keeps a tied alias of a frozen weight (lm_head): drop it
            frozen = {
                n for n, p in module.named_parameters(remove_duplicate=False) if not p.requires_grad
            }
            model_sd = {k: v for k, v in model_sd.items() if k not in frozen}
        state[name] = {"model": model_sd, "optim": optim_sd}
    return state


def _distributed() -> bool:
    return dist.is_available() and dist.is_initialized()


def _barrier() -> None:
    if _distributed():
        dist.barrier()


def save_train_state(worker: TrainedModels, directory: Path) -> None:
    """Writes ``directory`` (a collective: every rank calls it with the same path).

    Refuses a directory that already holds a complete checkpoint; a partial one (a crash
    mid-save) is cleared first.
    """
    rank = worker.dist.rank
    if (directory / COMPLETE).exists():
        raise FileExistsError(f"checkpoint {directory} already exists")
    if rank == 0 and directory.exists():
        shutil.rmtree(directory)
    _barrier()
    with _named_failures(directory, "saving"):
        directory.mkdir(parents=True, exist_ok=True)
        with warnings.catch_warnings():  # a single process saving without a group is intended
            warnings.filterwarnings("ignore", message="torch.distributed is disabled")
            dcp.save(_state(worker), checkpoint_id=directory / "dcp", no_dist=not _distributed())
        extras = {
            "policy_version": worker.policy_version,
            "torch_rng": torch.get_rng_state(),
            "cuda_rng": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
            "world_size": worker.dist.world_size,
        }
        _atomic_torch_save(extras, directory / f"rank{rank}.pt")
        _barrier()
        names = manifest.list_files(directory)
        world = worker.dist.world_size
        mine = [n for n in names if _owner(n, world) == rank]
        entries: dict[str, manifest.FileEntry] = {}
        for part in all_gather_objects(manifest.hash_files(directory, mine)):
            entries.update(part)
        if rank == 0:
            manifest.write_manifest(directory, entries)
            _fsync_write(directory / COMPLETE, b"ok\n")


def _owner(name: str, world_size: int) -> int:
    """The rank that wrote (and hashes) ``name``: a shard's or rank file's rank, else 0."""
    match = _OWNED.match(name)
    if match is None:
        return 0
    return int(match.group(1) or match.group(2)) % world_size


def load_train_state(worker: TrainedModels, directory: Path) -> int:
    """Restores weights, optimizer states and RNG; returns the saved policy version (which
    the worker, its one writer, sets: ``LearnerWorker.load_train_state``)."""
    if not (directory / COMPLETE).exists():
        raise FileNotFoundError(f"{directory} is not a complete learner checkpoint")
    entries = manifest.read_manifest(directory)
    rank, world = worker.dist.rank, worker.dist.world_size
    mine = [n for i, n in enumerate(sorted(entries)) if i % world == rank]
    _refuse_on_every_rank(manifest.check_files(directory, entries, mine), CheckpointCorrupt)
    state = _state(worker)
    misfit = _misfit(state, _read_metadata(directory / "dcp"), worker.config.algorithm)
    _refuse_on_every_rank(
        [f"{directory}: does not fit this learner: {misfit}"] if misfit else [],
        CheckpointRejected,
    )
    with _named_failures(directory, "loading"), warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        dcp.load(state, checkpoint_id=directory / "dcp", no_dist=not _distributed())
    for name, (module, optim) in _trainables(worker).items():
        set_state_dict(
            module,
            optim,
            model_state_dict=state[name]["model"],
            optim_state_dict=state[name]["optim"],
            options=_options(worker, name),
        )
        apply_config_hparams(optim, worker.config, name)  # this config's lr, not the saved one
    rank_file = directory / f"rank{worker.dist.rank}.pt"
    if not rank_file.exists():  # resumed on more ranks than saved: RNG from rank 0
        rank_file = directory / "rank0.pt"
    with _named_failures(rank_file, "loading"):
        extras = torch.load(rank_file, weights_only=False)
    torch.set_rng_state(extras["torch_rng"])
    if extras["cuda_rng"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(extras["cuda_rng"])
    return int(extras["policy_version"])  # the worker sets it (LearnerWorker.load_train_state)


def _refuse_on_every_rank(problems: list[str], kind: type[CheckpointRejected]) -> None:
    """Raises ``kind`` with the first problem any rank found, on every rank (each checked
    its part; all must refuse together, or the others would wait in the next collective)."""
    found = [p for part in all_gather_objects(problems) for p in part]
    if found:
        raise kind(found[0])


def _read_metadata(dcp_dir: Path) -> Metadata:
    try:
        return dcp.FileSystemReader(dcp_dir).read_metadata()
    except Exception as exc:  # noqa: BLE001 — any reason it cannot be read is corruption
        raise CheckpointCorrupt(f"{dcp_dir / '.metadata'}: unreadable ({_one_line(exc)})") from exc


def _flat_shapes(tree: Any, prefix: str = "") -> Iterator[tuple[str, tuple[int, ...]]]:
    """``(key, shape)`` of every tensor of a nested state dict, keyed as DCP flattens it."""
    if isinstance(tree, torch.Tensor):
        yield prefix, tuple(tree.shape)
    elif isinstance(tree, dict):
        for key, value in tree.items():
            yield from _flat_shapes(value, f"{prefix}.{key}" if prefix else str(key))
    elif isinstance(tree, list | tuple):
        for i, value in enumerate(tree):
            yield from _flat_shapes(value, f"{prefix}.{i}")


def _misfit(state: dict[str, Any], metadata: Metadata, algorithm: str) -> str | None:
    """What first keeps ``state`` from loading from a checkpoint with ``metadata``, or None:
    a trainable the checkpoint lacks, a key on one side only, a tensor of another shape."""
    saved = metadata.state_dict_metadata
    for name in state:
        if not any(key.startswith(f"{name}.") for key in saved):
            return (
                f"the checkpoint has no {name} (saved by a learner without one); this "
                f"learner (learner.algorithm={algorithm}) trains one"
            )
    for key, shape in _flat_shapes(state):
        entry = saved.get(key)
        if entry is None:
            return f"{key}: in this model, not in the checkpoint"
        if not isinstance(entry, TensorStorageMetadata):
            return f"{key}: a tensor here, not in the checkpoint"
        if tuple(entry.size) != shape:
            return f"{key}: shape {tuple(entry.size)} in the checkpoint, {shape} in this model"
    here = {key for key, _ in _flat_shapes(state)}
    for name in state:
        for key in saved:
            if key.startswith(f"{name}.model.") and key not in here:
                return f"{key}: in the checkpoint, not in this model"
    return None


@contextmanager
def _named_failures(path: Path, doing: str) -> Iterator[None]:
    """A full disk, or any failure of DCP / torch (``CheckpointException`` is a
    ``BaseException``), as one domain error naming ``path``: ``ResourceExhausted`` when the
    disk is full (torch.save says so as a RuntimeError, DCP as a wrapped OSError), else
    ``CheckpointCorrupt`` when loading and a RuntimeError naming the path when saving."""
    try:
        yield
    except (Exception, CheckpointException) as exc:  # noqa: BLE001 — each re-raised, named
        causes: list[BaseException] = [exc]
        if isinstance(exc, CheckpointException):
            causes = [failure for failure, _ in exc.failures.values()] or [exc]
        full = next((c for c in causes if is_disk_full(c)), None)
        if full is not None or (doing == "saving" and looks_full(path)):
            raise ResourceExhausted(disk_full_message(path, full or causes[0])) from exc
        if isinstance(exc, CheckpointRejected | AlreadyExists):
            raise
        message = f"{path}: {doing} failed: {_one_line(causes[0])}"
        if doing == "loading":
            raise CheckpointCorrupt(message) from exc
        raise RuntimeError(message) from exc


def _one_line(exc: BaseException) -> str:
    return "".join(traceback.format_exception_only(type(exc), exc)).strip().splitlines()[-1]


def _atomic_torch_save(obj: object, path: Path) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    torch.save(obj, tmp)
    os.replace(tmp, path)


def _fsync_write(path: Path, data: bytes) -> None:
    tmp = path.with_suffix(".tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
