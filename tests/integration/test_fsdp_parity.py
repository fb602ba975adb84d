"""FSDP2 over 2 gloo ranks equals one process: GRPO, PPO, LoRA and registered estimator/loss
steps, log-probs, weights; relay.

The ranks are driven the way the learner service drives them: rank 0 calls each command through
``CommandRelay``, rank 1 serves. Rank 0 writes what it saw to a file; the test compares it with
the same commands run in this (single) process.
"""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.multiprocessing as mp
from transformers import AutoModelForCausalLM

from hybridflow.types import TrainSample
from tests.helpers import build_tiny_checkpoint, learner_config

WORLD_SIZE = 2
TIMEOUT_S = 240.0

CONFIGS: dict[str, dict[str, Any]] = {
    # Two epochs (the ratio leaves 1, clipping and old log-probs matter), KL loss to a sharded
    # reference, entropy bonus, micro-batches of 2 with uneven rank slices (filler rows).
    "grpo": {
        "algorithm": "grpo",
        "optimizer": {"lr": 1e-3},
        "update": {"micro_batch_size": 2, "epochs": 2},
        "kl": {"use_reference": True, "coef": 0.05},
        "loss": {"entropy_coef": 0.01, "clip_ratio_high": 0.28},
    },
    # Two mini-batches (two optimizer steps), critic with GAE, per-sequence loss aggregation.
    "ppo": {
        "algorithm": "ppo",
        "optimizer": {"lr": 1e-3},
        "critic": {"lr": 1e-3},
        "update": {"micro_batch_size": 2, "num_mini_batches": 2},
        "advantage": {"lam": 0.9},
        "loss": {"agg_mode": "seq-mean-token-mean"},
    },
    # Registered estimators and losses (whole-batch estimators, micro-batch losses with global
    # normalisers): REINFORCE++ with the KL penalty in the reward (gathered from the ranks) and
    # overlong shaping, under GSPO; RLOO under CISPO over two mini-batches.
    "reinforce_pp_gspo": {
        "advantage_estimator": "reinforce_plus_plus",
        "policy_loss": "gspo",
        "optimizer": {"lr": 1e-3},
        "update": {"micro_batch_size": 2, "epochs": 2},
        "advantage": {"gamma": 0.9},
        "kl": {"use_reference": True, "coef": 0.05, "mode": "reward"},
        "overlong": {"buffer": 2},
        "max_new_tokens": 6,
    },
    # LoRA adapters (rank 4) over the sharded frozen base, the KL reference being the base
    # with the adapters off; the weights compared are the merged model.
    "grpo_lora": {
        "algorithm": "grpo",
        "optimizer": {"lr": 1e-2},
        "update": {"micro_batch_size": 2, "epochs": 2},
        "kl": {"use_reference": True, "coef": 0.05},
        "lora": {"rank": 4},
    },
    "rloo_cispo": {
        "advantage_estimator": "rloo",
        "policy_loss": "cispo",
        "optimizer": {"lr": 1e-3},
        "update": {"micro_batch_size": 2, "num_mini_batches": 2},
        "loss": {"clip_ratio_high": 0.28, "agg_mode": "seq-mean-token-sum"},
    },
}


def _samples() -> list[TrainSample]:
    rewards = [1.0, 0.0, 0.0, 0.5, 1.0, 1.0, 0.2]  # 7 samples: rank slices of 4 and 3
    out = []
    for i, reward in enumerate(rewards):
        response = [20 + (5 * i + k) % 40 for k in range(2 + (i * 2) % 5)]
        out.append(
            TrainSample(
                prompt_ids=[10 + (3 * i + k) % 50 for k in range(3 + i % 3)],
                response_ids=response,
                rollout_logprobs=[-1.0] * len(response),
                reward=reward,
                group_id=i // 3,
                policy_version=0,
            )
        )
    return out


def _run_commands(call: Any, save_dir: Path) -> dict[str, Any]:
    """The command sequence, issued through ``call(command, args)``; returns what rank 0 saw."""
    samples = _samples()
    result = call("train_step", (samples,))
    logprobs = call(
        "compute_logprobs",
        ([s.prompt_ids for s in samples], [s.response_ids for s in samples], 1.0),
    )
    weights = {k: v.clone() for k, v in call("full_state_dict_items", ())}
    call("save_checkpoint", (str(save_dir),))
    return {
        "version": result.policy_version,
        "metrics": result.metrics,
        "logprobs": logprobs,
        "weights": weights,
    }


def _rank_main(rank: int, port: int, ckpt: str, out_dir: str) -> None:
    _join_group(rank, port)

    from hybridflow.services.learner.distributed import CommandRelay
    from hybridflow.services.learner.worker import LearnerWorker

    results: dict[str, Any] = {}
    for name, fields in CONFIGS.items():
        worker = LearnerWorker(learner_config(fields), ckpt)

        def handler(command: str, args: Any, worker: LearnerWorker = worker) -> Any:
            return None if command == "shutdown" else getattr(worker, command)(*args)

        relay = CommandRelay(handler)
        if rank == 0:
            results[name] = _run_commands(relay.call, Path(out_dir) / f"fsdp-{name}")
            relay.shutdown()
        else:
            relay.serve()
    if rank == 0:
        torch.save(results, Path(out_dir) / "ranks.pt")
    _leave_group()


def _join_group(rank: int, port: int) -> None:
    """This spawned process as ``rank`` of WORLD_SIZE gloo ranks on loopback ``port``."""
    torch.set_num_threads(1)
    os.environ.update(
        RANK=str(rank),
        WORLD_SIZE=str(WORLD_SIZE),
        LOCAL_RANK=str(rank),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
    )
    from hybridflow.services.learner.distributed import init_from_env

    info = init_from_env("cpu")
    assert info.world_size == WORLD_SIZE and info.rank == rank


def _leave_group() -> None:
    """Barrier, then leave the way a learner rank does (``exit_service``: no teardown).
    Tearing gloo down is a race: whichever rank closes its pairs first, the other's gloo
    loop thread may see the closed socket and abort the process (SIGABRT), now and then
    on a busy machine, even after a barrier and ``destroy_process_group``. Past the
    barrier every rank's results are written, so nothing is left to say on the wire."""
    import torch.distributed as dist

    from hybridflow.utils.fast_exit import exit_service

    dist.barrier()
    exit_service(0)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _spawn(fn: Any, args: tuple[Any, ...]) -> None:
    """Runs ``fn(rank, *args)`` on WORLD_SIZE spawned ranks; kills them past the deadline."""
    context = mp.start_processes(fn, args=args, nprocs=WORLD_SIZE, join=False, start_method="spawn")
    deadline = time.monotonic() + TIMEOUT_S
    while not context.join(timeout=1.0):
        if time.monotonic() > deadline:
            for process in context.processes:
                if process.is_alive():
                    process.kill()
            pytest.fail(f"ranks did not finish within {TIMEOUT_S} s")


def _single_process(ckpt: Path, out_dir: Path) -> dict[str, Any]:
    from hybridflow.services.learner.worker import LearnerWorker

    results = {}
    for name, fields in CONFIGS.items():
        worker = LearnerWorker(learner_config(fields), ckpt)
        results[name] = _run_commands(
            lambda command, args, w=worker: getattr(w, command)(*args), out_dir / f"single-{name}"
        )
    return results


def test_fsdp2_two_ranks_match_single_process(tmp_path: Path) -> None:
    ckpt = build_tiny_checkpoint(tmp_path / "tiny")
    _spawn(_rank_main, (_free_port(), str(ckpt), str(tmp_path)))
    ranks = torch.load(tmp_path / "ranks.pt", weights_only=False)
    single = _single_process(ckpt, tmp_path)
    for name in CONFIGS:
        got, want = ranks[name], single[name]
        assert got["version"] == want["version"]
        assert set(got["metrics"]) == set(want["metrics"]), name
        for key, value in want["metrics"].items():
            assert got["metrics"][key] == pytest.approx(value, abs=1e-5, rel=1e-5), (name, key)
        for row_got, row_want in zip(got["logprobs"], want["logprobs"], strict=True):
            assert row_got == pytest.approx(row_want, abs=1e-5)
        assert set(got["weights"]) == set(want["weights"])
        for key, tensor in want["weights"].items():
            torch.testing.assert_close(got["weights"][key], tensor, atol=1e-5, rtol=0)
        # The FSDP checkpoint (gathered, written by rank 0) loads as a plain HF model.
        saved = AutoModelForCausalLM.from_pretrained(tmp_path / f"fsdp-{name}").state_dict()
        for key, tensor in want["weights"].items():
            torch.testing.assert_close(saved[key], tensor, atol=1e-5, rtol=0)
        config = json.loads((tmp_path / f"fsdp-{name}" / "config.json").read_text())
        assert config["architectures"] == ["LlamaForCausalLM"]
    # The metrics say something: the steps really trained.
    assert single["grpo"]["metrics"]["actor/kl_loss"] > 0
    assert single["ppo"]["metrics"]["critic/vf_loss"] > 0
    assert single["ppo"]["version"] == 2
    assert single["reinforce_pp_gspo"]["metrics"]["actor/overlong_frac"] > 0
    assert single["rloo_cispo"]["version"] == 2
    assert single["grpo_lora"]["metrics"]["actor/kl_loss"] > 0  # adapters moved off the base
    assert (tmp_path / "fsdp-grpo_lora" / "adapter" / "adapter_model.safetensors").is_file()


def _relay_main(rank: int, port: int, out_dir: str) -> None:
    _join_group(rank, port)
    import torch.distributed as dist

    from hybridflow.services.learner.distributed import CommandRelay

    seen: list[Any] = []

    def handler(command: str, payload: Any) -> Any:
        seen.append([command, payload])
        if command == "fail":
            raise ValueError("bad payload")
        if command == "total":
            # A collective inside a command: every rank must be running it.
            value = torch.tensor([float(payload) * (rank + 1)])
            dist.all_reduce(value)
            return float(value)
        return None

    relay = CommandRelay(handler)
    out: dict[str, Any] = {"rank": rank}
    if rank == 0:
        out["total"] = relay.call("total", 2)
        with pytest.raises(ValueError, match="bad payload"):
            relay.call("fail", {"x": 1})
        out["after_failure"] = relay.call("total", 1)
        relay.shutdown()
    else:
        relay.serve()
    out["seen"] = seen
    (Path(out_dir) / f"relay{rank}.json").write_text(json.dumps(out))
    _leave_group()


def test_command_relay_runs_every_command_on_every_rank(tmp_path: Path) -> None:
    _spawn(_relay_main, (_free_port(), str(tmp_path)))
    rank0 = json.loads((tmp_path / "relay0.json").read_text())
    rank1 = json.loads((tmp_path / "relay1.json").read_text())
    # total: 2 * 1 + 2 * 2 = 6; after the rejected command the group still works: 1 + 2 = 3.
    assert rank0["total"] == 6.0
    assert rank0["after_failure"] == 3.0
    expected = [["total", 2], ["fail", {"x": 1}], ["total", 1], ["shutdown", []]]
    assert rank0["seen"] == expected
    assert rank1["seen"] == expected
