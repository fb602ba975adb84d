"""Saves and restores everything a learner rank needs to continue training as if uninterrupted.

One train-state checkpoint is a directory:
- ``dcp/``: the actor (and critic) weights and AdamW states, written by every rank with
  torch.distributed.checkpoint (each FSDP2 rank writes its own shards; a single process
  writes plain tensors; either world size can read it back). With the critic on its own
  ranks, actor ranks write the actor's entries and critic ranks the critic's, into the same
  checkpoint: a co-located learner can resume a split one's and the other way round;
- ``rank<r>.pt``: what is per rank and not a tensor shard: torch (and CUDA) RNG state, the
  policy version, the learner config's seed;
- ``COMPLETE``: written by rank 0 last, after every rank finished (DCP's save ends with a
  barrier), so a directory without it is a partial save and is never loaded.

The frozen reference model is not saved: it is the initial checkpoint, reloaded at start.
Knows nothing about gRPC, run directories or which step a name stands for.
"""

from __future__ import annotations

import os
import shutil
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

if TYPE_CHECKING:
    from hybridflow.services.learner.worker import LearnerWorker

COMPLETE = "COMPLETE"


def _trainables(worker: LearnerWorker) -> dict[str, tuple[torch.nn.Module, torch.optim.Optimizer]]:
    """What this rank trains: the actor unless it is a critic rank, the critic where it lives."""
    out: dict[str, tuple[torch.nn.Module, torch.optim.Optimizer]] = {}
    if worker.has_actor:
        out["actor"] = (worker.actor, worker.actor_optim)
    if worker.critic is not None and worker.critic_optim is not None:
        out["critic"] = (worker.critic, worker.critic_optim)
    return out


def _state(worker: LearnerWorker) -> dict[str, Any]:
    state: dict[str, Any] = {}
    for name, (module, optim) in _trainables(worker).items():
        model_sd, optim_sd = get_state_dict(module, optim)
        state[name] = {"model": model_sd, "optim": optim_sd}
    return state


def _distributed() -> bool:
    return dist.is_available() and dist.is_initialized()


def _barrier() -> None:
    if _distributed():
        dist.barrier()


def save_train_state(worker: LearnerWorker, directory: Path) -> None:
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
    if rank == 0:
        _fsync_write(directory / COMPLETE, b"ok\n")


def load_train_state(worker: LearnerWorker, directory: Path) -> int:
    """Restores weights, optimizer states, RNG and policy version; returns the version."""
    if not (directory / COMPLETE).exists():
        raise FileNotFoundError(f"{directory} is not a complete learner checkpoint")
    state = _state(worker)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        dcp.load(state, checkpoint_id=directory / "dcp", no_dist=not _distributed())
    for name, (module, optim) in _trainables(worker).items():
        set_state_dict(
            module,
            optim,
            model_state_dict=state[name]["model"],
            optim_state_dict=state[name]["optim"],
        )
    rank_file = directory / f"rank{worker.dist.rank}.pt"
    if not rank_file.exists():  # resumed on more ranks than saved: RNG from rank 0
        rank_file = directory / "rank0.pt"
    extras = torch.load(rank_file, weights_only=False)
    torch.set_rng_state(extras["torch_rng"])
    if extras["cuda_rng"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(extras["cuda_rng"])
    worker.policy_version = int(extras["policy_version"])
    return worker.policy_version


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
