"""A damaged train state under FSDP2 (slow): 2 gloo ranks each verify part of the files; a
file only one rank checks is refused on both ranks with the same one line (neither is left
waiting in a collective), and both then load the intact copy."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.helpers import build_tiny_checkpoint, learner_config
from tests.integration.test_fsdp_parity import _free_port, _join_group, _leave_group, _spawn
from tests.integration.test_fsdp_train_state import FIELDS


def _rank_main(rank: int, port: int, ckpt: str, out_dir: str, mode: str) -> None:
    _join_group(rank, port)
    from hybridflow.errors import CheckpointCorrupt
    from hybridflow.services.learner.train_state import save_train_state
    from hybridflow.services.learner.worker import LearnerWorker

    worker = LearnerWorker(learner_config(FIELDS), ckpt)
    out = Path(out_dir)
    if mode == "save":
        save_train_state(worker, out / "state")
    else:
        try:
            worker.load_train_state(out / "damaged")
            message = "loaded"
        except CheckpointCorrupt as exc:
            message = str(exc)
        (out / f"refusal{rank}.txt").write_text(message)
        assert worker.load_train_state(out / "state") == 0
    _leave_group()


@pytest.mark.slow
def test_a_file_one_rank_checks_is_refused_on_every_rank(tmp_path: Path) -> None:
    ckpt = build_tiny_checkpoint(tmp_path / "tiny")
    _spawn(_rank_main, (_free_port(), str(ckpt), str(tmp_path), "save"))
    shutil.copytree(tmp_path / "state", tmp_path / "damaged")
    (tmp_path / "damaged" / "rank1.pt").unlink()  # checked by one rank only
    _spawn(_rank_main, (_free_port(), str(ckpt), str(tmp_path), "load"))
    want = f"{tmp_path / 'damaged' / 'rank1.pt'}: missing"
    assert [(tmp_path / f"refusal{r}.txt").read_text() for r in (0, 1)] == [want, want]
