"""Issue 27, row 11: a dataset whose every prompt is over the prompt limit passed preflight,
then failed "the prompt dataset is empty"; prompts longer than the model's positions were
accepted without a word. Now the launch ends with exit 2 and one line naming the limit, the
bound that set it and the shortest prompt, before any step."""

from __future__ import annotations

import json
from pathlib import Path

from tests.fault.harness import finish, launch


def test_all_prompts_over_the_models_positions_end_the_launch_naming_the_limit(
    tmp_path: Path,
) -> None:
    data = tmp_path / "long.jsonl"
    row = {"prompt": "1+1=" * 60, "data_source": "arith", "reward_model": {"ground_truth": "2"}}
    data.write_text(json.dumps(row) + "\n")
    run = tmp_path / "run"
    proc = launch(
        run, "--config", "deploy/configs/quickstart.yaml", "--run-dir", str(run),
        "--set", f"coordinator.data={data}",
    )  # fmt: skip
    code, output = finish(proc, 300)
    assert code != 0, output
    assert "data error: dataset" in output and "all 1 prompts are longer than 124 tokens" in output
    assert "the model's 128 positions less coordinator.sampling.max_new_tokens=4" in output
    assert "shortest has" in output and "dataset is empty" not in output
    assert not (run / "trained.jsonl").exists() or (run / "trained.jsonl").read_text() == ""
