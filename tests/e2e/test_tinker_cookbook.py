"""The Tinker cookbook's recipes, unchanged, against the Tinker-compatible service: the
cookbook runs in its own venv (``make cookbook-venv``; its transformers pin excludes vLLM's),
the service in the project's, the model is the built-in ``tiny-qwen3`` (its local directory is
the model name, so nothing is downloaded).

* ``chat_sl.train`` on the cookbook's shipped ``conversations.jsonl`` learns: the last step's
  NLL is under half the first's.
* ``math_rl.train env=arithmetic`` runs end to end (sampling, importance-sampling steps,
  checkpoints). Its problems (sums of 0-100) are beyond a 2-layer model of width 128, so its
  reward stays near 0: this test checks the run, not the learning (the SDK's own RL loop in
  ``tests/integration/test_tinker_service.py`` checks that)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from hybridflow.models import resolve_model_path
from tests.tinker_service import BASE, running

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
KEY = "tml-cookbook-key"


@pytest.fixture(scope="module")
def cookbook_python() -> Path:
    subprocess.run(["make", "cookbook-venv"], cwd=REPO, check=True, timeout=1800)
    return REPO / ".venv-cookbook" / "bin" / "python"


def _recipe(python: Path, url: str, module: str, *args: str) -> None:
    env = dict(os.environ, TINKER_API_KEY=KEY, TINKER_TELEMETRY="0", HF_HUB_OFFLINE="1")
    subprocess.run(
        [str(python), "-m", f"tinker_cookbook.recipes.{module}", f"base_url={url}", *args],
        env=env,
        check=True,
        timeout=1800,
    )


def _metrics(log_path: Path) -> list[dict]:  # type: ignore[type-arg]
    return [json.loads(line) for line in (log_path / "metrics.jsonl").read_text().splitlines()]


def test_the_cookbook_sft_recipe_learns_and_the_rl_recipe_runs(
    cookbook_python: Path, tmp_path: Path
) -> None:
    model = str(resolve_model_path(BASE))
    data = subprocess.run(
        [
            str(cookbook_python),
            "-c",
            "import tinker_cookbook, os; print(os.path.dirname(tinker_cookbook.__file__))",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    with running(tmp_path, {"cookbook": KEY}) as (url, _):
        _recipe(
            cookbook_python,
            url,
            "chat_sl.train",
            f"model_name={model}",
            "renderer_name=qwen3",
            f"dataset={data}/example_data/conversations.jsonl",
            "batch_size=16",
            "num_epochs=3",
            "learning_rate=1e-2",
            "lora_rank=8",
            "max_length=512",
            f"log_path={tmp_path / 'sl'}",
            "behavior_if_log_dir_exists=delete",
        )
        nll = [m["train_mean_nll"] for m in _metrics(tmp_path / "sl") if "train_mean_nll" in m]
        print("chat_sl NLL, first and last of", len(nll), "steps:", nll[0], nll[-1])
        assert len(nll) == 24 and nll[-1] < 0.5 * nll[0]

        _recipe(
            cookbook_python,
            url,
            "math_rl.train",
            "env=arithmetic",
            f"model_name={model}",
            "renderer_name=qwen3_disable_thinking",
            "group_size=4",
            "groups_per_batch=8",
            "max_tokens=6",
            "learning_rate=1e-3",
            "lora_rank=8",
            "max_steps=4",
            f"log_path={tmp_path / 'rl'}",
            "behavior_if_log_dir_exists=delete",
        )
        steps = _metrics(tmp_path / "rl")
        assert [m["step"] for m in steps] == [0, 1, 2, 3]
        assert all(m["env/all/format"] > 0.5 for m in steps)  # it sampled and scored
        final = json.loads((tmp_path / "rl" / "checkpoints.jsonl").read_text().splitlines()[-1])
        assert final["state_path"].startswith("tinker://") and final["sampler_path"]
