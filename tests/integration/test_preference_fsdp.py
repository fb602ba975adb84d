"""FSDP2 over 2 gloo ranks equals one process for the preference steps (DPO, KTO, SFT, ORPO) and
the held-out eval: metrics, and the weights after the steps.

Seven records over two ranks give uneven slices (4 and 3) and, with micro-batches of 2, a
filler row on rank 1; KTO's reference point sums mismatched pairs over both ranks; ORPO (its
NLL over prompt and chosen tokens) divides by the global token count.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from hybridflow.preference.config import PreferenceConfig
from tests.helpers import build_tiny_checkpoint, learner_config
from tests.integration.test_fsdp_parity import (
    _free_port,
    _join_group,
    _leave_group,
    _spawn,
)

STEPS = (("dpo", 2), ("kto", 2), ("sft", 1), ("orpo", 2))


def _run(ckpt: str) -> dict[str, Any]:
    from hybridflow.data.preference import read_preference_dataset
    from hybridflow.services.learner.preference import preference_eval
    from hybridflow.services.learner.worker import LearnerWorker

    out: dict[str, Any] = {}
    for loss, num_steps in STEPS:
        worker = LearnerWorker(
            learner_config(
                optimizer={"lr": 1e-2}, update={"micro_batch_size": 2}, kl={"use_reference": True}
            ),
            ckpt,
        )
        cfg = PreferenceConfig(loss=loss, orpo_nll_prompt=True)  # type: ignore[arg-type]
        kind = cfg.record_kind
        records = read_preference_dataset(f"builtin:arith_{kind}", worker.tokenizer, kind, num=7)
        metrics = [worker.preference_step(records, cfg) for _ in range(num_steps)]
        pairs = read_preference_dataset("builtin:arith_dpo:test", worker.tokenizer, "dpo", num=5)
        metrics.append(preference_eval(worker, pairs, cfg.beta))
        weights = {k: v.clone() for k, v in worker.full_state_dict_items()}
        out[loss] = {"metrics": metrics, "weights": weights}
    return out


def _rank_main(rank: int, port: int, ckpt: str, out_dir: str) -> None:
    _join_group(rank, port)
    results = _run(ckpt)
    if rank == 0:
        torch.save(results, Path(out_dir) / "ranks.pt")
    _leave_group()


def test_preference_steps_on_two_fsdp_ranks_match_one_process(tmp_path: Path) -> None:
    ckpt = build_tiny_checkpoint(tmp_path / "tiny")
    _spawn(_rank_main, (_free_port(), str(ckpt), str(tmp_path)))
    ranks = torch.load(tmp_path / "ranks.pt", weights_only=False)
    single = _run(str(ckpt))
    for loss, _ in STEPS:
        got, want = ranks[loss], single[loss]
        for step, (m_got, m_want) in enumerate(zip(got["metrics"], want["metrics"], strict=True)):
            assert set(m_got) == set(m_want), (loss, step)
            for key, value in m_want.items():
                assert m_got[key] == pytest.approx(value, abs=1e-5, rel=1e-5), (loss, step, key)
        for key, tensor in want["weights"].items():
            torch.testing.assert_close(got["weights"][key], tensor, atol=1e-5, rtol=0)
    # The steps trained: DPO's loss left log 2, SFT's NLL is positive.
    assert single["dpo"]["metrics"][1]["train/loss"] < single["dpo"]["metrics"][0]["train/loss"]
    assert single["sft"]["metrics"][0]["train/nll"] > 0
